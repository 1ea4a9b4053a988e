"""Fidelity against the published Go simulator: replay its exact seed-42 submission order."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.load import load_trace
from bench.simulate import simulate

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb"

pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason="openb traces are read from ../shared/traces/openb")


def test_best_fit_on_the_go_simulators_order_matches_its_allocation() -> None:
    """The trace README: with this order the Go simulator's BestFit allocated 92.94 % at arrived 100 %."""
    trace = load_trace(TRACES / "openb_node_list_gpu_node.csv", TRACES / "openb_pod_list_default.csv")
    result = simulate(trace, "best-fit", "fgd", [42], order_file=str(TRACES / "default_seed42_order.txt"))
    (run,) = result["runs"]
    assert run["pods_submitted"] == 10866
    assert run["alloc_pct_at_100"] == pytest.approx(92.94, abs=0.3)
