"""Fidelity against the published Go simulator: replay its exact seed-42 submission order."""

from __future__ import annotations

import pytest

from gpupack.bench.load import load_trace
from gpupack.bench.simulate import simulate
from tests.conftest import OPENB, needs_openb

pytestmark = [needs_openb, pytest.mark.slow]


def test_best_fit_on_the_go_simulators_order_matches_its_allocation() -> None:
    """The trace README: with this order the Go simulator's BestFit allocated 92.94 % at arrived 100 %."""
    trace = load_trace(OPENB / "openb_node_list_gpu_node.csv", OPENB / "openb_pod_list_default.csv")
    result = simulate(trace, "best-fit", "fgd", [42], order_file=str(OPENB / "default_seed42_order.txt"))
    (run,) = result["runs"]
    assert run["pods_submitted"] == 10866
    assert run["alloc_pct_at_100"] == pytest.approx(92.94, abs=0.3)
