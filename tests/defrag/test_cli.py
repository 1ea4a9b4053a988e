"""`gpupack defrag` on a cluster file: which pods may move (defrag.movable) and the dry-run plan it prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpupack.cli import main
from gpupack.defrag.movable import why_unmovable
from gpupack.kube.keys import LABEL_MOVABLE
from tests.extender_helpers import node, pod, write_cluster


def owned(obj: dict[str, Any], kind: str | None = "ReplicaSet", movable: bool = True) -> dict[str, Any]:
    if kind is not None:
        obj["metadata"]["ownerReferences"] = [{"kind": kind, "name": "owner", "uid": "u", "controller": True}]
    if movable:
        obj["metadata"]["labels"] = {LABEL_MOVABLE: "true"}
    return obj


def test_only_opted_in_pods_that_a_controller_recreates_may_move() -> None:
    assert why_unmovable(owned(pod("a")), breaks_budget=False) == ""
    assert why_unmovable(owned(pod("a"), "StatefulSet"), False) == ""
    assert why_unmovable(owned(pod("a"), "Job"), False) == ""
    assert "not labelled" in why_unmovable(owned(pod("a"), movable=False), False)
    assert "bare pod" in why_unmovable(owned(pod("a"), None), False)
    assert "DaemonSet" in why_unmovable(owned(pod("a"), "DaemonSet"), False)
    assert "owned by a Node" in why_unmovable(owned(pod("a"), "Node"), False)
    assert "PodDisruptionBudget" in why_unmovable(owned(pod("a")), breaks_budget=True)
    terminating = owned(pod("a"))
    terminating["metadata"]["deletionTimestamp"] = "2026-11-28T00:00:00Z"
    assert why_unmovable(terminating, False) == "terminating already"
    static = owned(pod("a"), "Node")
    static["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "x"}
    assert "static pod" in why_unmovable(static, False)


def fragmented(tmp_path: Path) -> Path:
    """Two dynamic-MIG H100 nodes of one GPU, a 1g instance on each; a 7g pod pending. The 1g on `a` may
    move, the one on `b` is a bare pod."""
    one_g = [{"index": 0, "mig": "1g.10gb", "start": 6}]
    return write_cluster(
        tmp_path / "cluster.yaml",
        [
            node("a", gpus=1, mig="dynamic"),
            node("b", gpus=1, mig="dynamic"),
            owned(pod("small-a", mig="1g.10gb", node_name="a", assignment={"node": "a", "gpus": one_g})),
            owned(pod("small-b", mig="1g.10gb", node_name="b", assignment={"node": "b", "gpus": one_g}), None),
            pod("big", mig="7g.80gb"),
        ],
    )


def test_the_dry_run_plan_moves_the_movable_pod_for_the_pending_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = fragmented(tmp_path)
    assert main(["defrag", "--cluster-file", str(path), "--json", "--goal", "schedule-pending-pod"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["dry_run"] is True and plan["evictions"] == 1
    [move] = plan["moves"]
    assert move["target"] == "default/big" and move["placement"]["node"] == "a"
    beside_the_other_1g = {"node": "b", "gpus": [{"index": 0, "mig": "1g.10gb", "start": 5}]}
    assert move["evictions"] == [{"pod": "default/small-a", "from": "a", "to": beside_the_other_1g}]
    assert main(["defrag", "--cluster-file", str(path)]) == 0
    text = capsys.readouterr().out
    assert "evict default/small-a on a -> b" in text
    assert "default/small-b" not in text.split("no move:")[0]


def test_bad_input_exits_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["defrag", "--cluster-file", str(tmp_path / "missing.yaml")]) == 2
    assert "gpupack defrag:" in capsys.readouterr().err
    assert main(["defrag", "--cluster-file", str(fragmented(tmp_path)), "--max-evictions", "-1"]) == 2
    assert "--max-evictions" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        (["--every", "0"], "--every"),
        (["--window-evictions", "-1"], "--window-evictions"),
        (["--metrics-port", "70000"], "--metrics-port"),
        (["--cluster-file", "c.yaml"], "live cluster"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "kubeconfig"),
    ],
)
def test_the_loop_refuses_unusable_arguments_with_exit_2(
    arguments: list[str], reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["defrag", "--loop", "--metrics-port", "0", *arguments]) == 2
    assert reason in capsys.readouterr().err
