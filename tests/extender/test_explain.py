"""`gpupack explain`: per-node verdicts for a pod, from a cluster file or a live cluster's lists."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpupack.cli import main
from gpupack.extender.explain import explain
from gpupack.extender.explain_source import load_from_files, load_live, pod_ref_key
from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.kube.sources import ClusterFileSource, SourceError, load_cluster_objects
from tests.extender_helpers import EXAMPLE_CLUSTER, pod
from tests.fake_apiserver import FakeApiServer

EXAMPLE_POD = EXAMPLE_CLUSTER.parent / "pod.yaml"


def write_pod(tmp_path: Path, obj: dict) -> Path:
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(obj))
    return path


def explain_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["explain", "--cluster-file", str(EXAMPLE_CLUSTER), *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_explain_json_names_every_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = explain_json(capsys, "--pod", str(write_pod(tmp_path, pod("train", gpus=4))))
    assert report["pod"] == "default/train" and report["chosen"] and report["bound_to"] is None
    assert len(report["placement"]["gpus"]) == 4
    verdicts = {n["node"]: n for n in report["nodes"]}
    assert len(verdicts) == 14
    assert verdicts[report["chosen"]]["verdict"] == "chosen"
    assert report["nodes"][0]["node"] == report["chosen"]
    # l4-spot-0 holds a foreign one-GPU pod: only three of its four GPUs are free
    assert verdicts["l4-spot-0"]["verdict"] == "infeasible"
    assert all(n["score"] is not None for n in report["nodes"] if n["verdict"] in ("chosen", "feasible"))
    feasible_scores = [n["score"] for n in report["nodes"] if n["verdict"] in ("chosen", "feasible")]
    assert feasible_scores == sorted(feasible_scores, reverse=True)


def test_explain_text_and_unplaceable_pod(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_pod(tmp_path, pod("huge", gpus=16))
    assert main(["explain", "--cluster-file", str(EXAMPLE_CLUSTER), "--pod", str(path)]) == 0
    out = capsys.readouterr().out
    assert "chosen: none" in out and "the pod asks for 16" in out and "why:" not in out  # unresolvable (#18)


def test_explain_bad_request_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_pod(tmp_path, pod("mixed", gpus=1, milli=100))
    report = explain_json(capsys, "--pod", str(path))
    assert "mixes" in report["error"] and {n["verdict"] for n in report["nodes"]} == {"unresolvable"}
    assert main(["explain", "--cluster-file", str(tmp_path / "none.yaml"), "--pod", str(path)]) == 2
    assert main(["explain", "--cluster-file", str(EXAMPLE_CLUSTER), "--pod", str(EXAMPLE_CLUSTER)]) == 2
    assert "exactly one Pod" in capsys.readouterr().err
    assert main(["explain", "--cluster-file", str(EXAMPLE_CLUSTER)]) == 2
    assert "name the pod" in capsys.readouterr().err
    assert main(["explain", "--cluster-file", str(EXAMPLE_CLUSTER), str(path), "--pod", str(EXAMPLE_POD)]) == 2
    assert "two pods named" in capsys.readouterr().err


def test_the_shipped_one_pod_file_works_as_the_readme_says(capsys: pytest.CaptureFixture[str]) -> None:
    report = explain_json(capsys, "--pod", str(EXAMPLE_POD))
    assert report["pod"] == "default/train-4gpu" and len(report["placement"]["gpus"]) == 4
    # the positional form reads the same file
    assert explain_json(capsys, str(EXAMPLE_POD)) == report


def test_score_parts_add_up_to_the_kernel_score(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The parts come from the engine's kernel; added in its order they give its score."""
    report = explain_json(capsys, "--pod", str(write_pod(tmp_path, pod("train", gpus=2))))
    feasible = [n for n in report["nodes"] if n["verdict"] in ("chosen", "feasible")]
    assert feasible
    for n in feasible:
        assert {"fragmentation", "packing", "topology"} <= set(n["parts"])
        assert sum(n["parts"].values()) == pytest.approx(n["score"], abs=1e-12)
    spot = [n for n in feasible if n["node"].endswith(("spot-0", "spot-1"))]
    assert spot and all(n["parts"]["spot"] < 0 for n in spot)  # the pod is not interruptible


def test_the_winner_is_explained_against_the_runner_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_pod(tmp_path, pod("train", gpus=2))
    report = explain_json(capsys, "--pod", str(path))
    winner, second = report["nodes"][0], report["nodes"][1]
    runner_up = report["runner_up"]
    assert runner_up["node"] == second["node"] and second["verdict"] == "feasible"
    assert runner_up["margin"] == pytest.approx(winner["score"] - second["score"])
    differences = runner_up["differences"]
    assert sum(differences.values()) == pytest.approx(runner_up["margin"], abs=1e-12)
    assert runner_up["deciding_part"] == max(differences, key=differences.__getitem__)
    assert differences[runner_up["deciding_part"]] > 0
    assert main(["explain", "--cluster-file", str(EXAMPLE_CLUSTER), "--pod", str(path)]) == 0
    why = [line for line in capsys.readouterr().out.splitlines() if line.startswith("why: ")]
    assert why == [
        f"why: {winner['node']} beat {second['node']} by {runner_up['margin']:.4f} ("
        + ", ".join(f"{name} {diff:+.3f}" for name, diff in differences.items() if abs(diff) >= 5e-4)
        + f"); {runner_up['deciding_part']} made the difference"
    ]


def test_explain_uses_no_test_oracle() -> None:
    """#17: production code does not run `scoring.reference` (the property tests' plain-Python oracle)."""
    code = (
        "import sys, gpupack.cli, gpupack.extender.explain, gpupack.extender.explain_source;"
        "print('gpupack.scoring.reference' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_bound_pod_is_explained_without_its_own_capacity(tmp_path: Path) -> None:
    """The pod is left out of the cluster it is explained against: its GPUs count as free."""
    objects = load_cluster_objects(EXAMPLE_CLUSTER)
    (bound,) = [p for p in objects.pods if p["metadata"]["name"] == "jupyter-alice"]
    path = write_pod(tmp_path, bound)
    loaded = load_from_files(Settings(), str(EXAMPLE_CLUSTER), str(path))
    report = explain(loaded.state, loaded.pod)
    assert report["bound_to"] == "l4-od-0" and report["chosen"]
    whole = ClusterState(Settings())
    ClusterFileSource(EXAMPLE_CLUSTER, whole.apply).start()
    assert loaded.state.snapshot().pods == whole.snapshot().pods - 1
    assert whole.snapshot().gpus_allocated - loaded.state.snapshot().gpus_allocated == pytest.approx(0.25)


def test_live_lists_give_the_same_report_as_the_cluster_file(tmp_path: Path) -> None:
    """`load_live` reads a cluster through the KubeApi lists the extender's source makes."""
    objects = load_cluster_objects(EXAMPLE_CLUSTER)
    api = FakeApiServer(objects.nodes, objects.pods)
    state, target, claims = load_live(Settings(), api, "default/train-0")
    assert claims == {}  # the fake serves no resource.k8s.io
    live = explain(state, target)
    (train,) = [p for p in objects.pods if p["metadata"]["name"] == "train-0"]
    loaded = load_from_files(Settings(), str(EXAMPLE_CLUSTER), str(write_pod(tmp_path, train)))
    assert live == explain(loaded.state, loaded.pod)
    assert live["chosen"] and len(live["nodes"]) == 14
    with pytest.raises(SourceError, match="pod default/nobody not found"):
        load_live(Settings(), api, "default/nobody")
    done = {**train, "metadata": {**train["metadata"], "name": "done"}, "status": {"phase": "Succeeded"}}
    api.put_pod(done)
    with pytest.raises(SourceError, match="has finished"):
        load_live(Settings(), api, "default/done")


def test_pod_references_and_the_kubeconfig_kubectl_would_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert pod_ref_key("ml/train", None) == "ml/train"
    assert pod_ref_key("train", "ml") == "ml/train" and pod_ref_key("train", None) == "default/train"
    for bad in ("a/b/c", "/x", "x/"):
        with pytest.raises(SourceError, match="NAMESPACE/NAME"):
            pod_ref_key(bad, None)
    # which kubeconfig: tests/kube/test_kubeconfig.py (kubectl's rule, shared by every command)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["explain", "default/train-0"]) == 2  # outside a cluster, nothing to read
    assert "in-cluster" in capsys.readouterr().err


def test_an_empty_cluster_is_said_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("[]\n")
    assert main(["explain", "--cluster-file", str(empty), "--pod", str(EXAMPLE_POD)]) == 0
    captured = capsys.readouterr()
    assert "chosen: none (the cluster holds no nodes)" in captured.out
