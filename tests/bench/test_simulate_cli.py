"""`gpupack simulate` summary lines: a replay says where it ended, never `None %` or a made-up 130 %."""

from __future__ import annotations

import pytest

from gpupack.cli import main
from tests.extender_helpers import EXAMPLE_CLUSTER

EXAMPLE_PODS = EXAMPLE_CLUSTER.parent / "pods.yaml"


def test_replay_summary_says_where_the_file_ended(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--nodes", str(EXAMPLE_CLUSTER), "--pods", str(EXAMPLE_PODS), "--protocol", "replay"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "130 %" not in out and "seed" not in out, out
    (line,) = [line for line in out.splitlines() if line.startswith("  file order, once: ")]
    assert "5/5 pods placed" in line and "% of the GPUs" in line and "% allocated at the end" in line


def test_fgd_summary_keeps_its_per_seed_points(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--nodes", str(EXAMPLE_CLUSTER), "--pods", str(EXAMPLE_PODS), "--seeds", "42-43"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "None" not in out, out
    seeds = [line for line in out.splitlines() if line.startswith("  seed ")]
    assert [line.split(":")[0] for line in seeds] == ["  seed 42", "  seed 43"]
    assert all("at arrived 100 %" in line and "at 130 %" in line for line in seeds)
