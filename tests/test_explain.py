"""`gpupack explain`: per-node verdicts for a pod against the example cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpupack.cli import main
from tests.extender_helpers import EXAMPLE_CLUSTER, pod


def write_pod(tmp_path: Path, obj: dict) -> Path:
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(obj))
    return path


def test_explain_json_names_every_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_pod(tmp_path, pod("train", gpus=4))
    assert main(["explain", "--cluster-file", str(EXAMPLE_CLUSTER), "--pod", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pod"] == "default/train" and report["chosen"]
    assert len(report["placement"]["gpus"]) == 4
    verdicts = {n["node"]: n for n in report["nodes"]}
    assert len(verdicts) == 14
    assert verdicts[report["chosen"]]["verdict"] == "chosen"
    assert report["nodes"][0]["node"] == report["chosen"]
    # l4-spot-0 holds a foreign one-GPU pod: only three of its four GPUs are free
    assert verdicts["l4-spot-0"]["verdict"] == "infeasible"
    assert all(n["score"] is not None for n in report["nodes"] if n["verdict"] in ("chosen", "feasible"))


def test_explain_text_and_unplaceable_pod(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_pod(tmp_path, pod("huge", gpus=16))
    assert main(["explain", "--cluster-file", str(EXAMPLE_CLUSTER), "--pod", str(path)]) == 0
    out = capsys.readouterr().out
    assert "chosen: none" in out and "not enough free GPU capacity" in out


def test_explain_bad_request_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_pod(tmp_path, pod("mixed", gpus=1, milli=100))
    assert main(["explain", "--cluster-file", str(EXAMPLE_CLUSTER), "--pod", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "mixes" in report["error"] and {n["verdict"] for n in report["nodes"]} == {"unresolvable"}
    assert main(["explain", "--cluster-file", str(tmp_path / "none.yaml"), "--pod", str(path)]) == 2
    assert main(["explain", "--cluster-file", str(EXAMPLE_CLUSTER), "--pod", str(EXAMPLE_CLUSTER)]) == 2
    assert "exactly one Pod" in capsys.readouterr().err


def test_explain_score_parts_add_up_to_the_kernel_score(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The parts come from the plain-Python reference; their sum is the numba kernel's score."""
    path = write_pod(tmp_path, pod("train", gpus=2))
    assert main(["explain", "--cluster-file", str(EXAMPLE_CLUSTER), "--pod", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    feasible = [n for n in report["nodes"] if n["verdict"] in ("chosen", "feasible")]
    assert feasible
    for n in feasible:
        assert {"fragmentation", "packing", "topology"} <= set(n["parts"])
        assert sum(n["parts"].values()) == pytest.approx(n["score"], abs=1e-9)
    spot = [n for n in feasible if n["node"].endswith(("spot-0", "spot-1"))]
    assert all(n["parts"]["spot"] < 0 for n in spot)  # the pod is not interruptible
