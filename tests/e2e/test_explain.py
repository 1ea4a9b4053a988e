"""`gpupack explain` against the real API server: a pending and a bound pod, the file mode on the same
objects, and `kubectl gpupack explain` through the real kubectl (a plugin found on PATH)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupack.cli import main
from gpupack.harness.controlplane import pod_body
from tests.e2e.catalogue import A100, H100, L4, PRODUCT_LABEL, all_to_all_nvlink, whole_gpu_node
from tests.e2e.cluster import E2ECluster

VENV_BIN = Path(sys.executable).parent  # where pip put the console scripts, kubectl-gpupack among them


def explain_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["explain", *args, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def nodes_of(report: dict[str, Any], prefix: str) -> dict[str, dict[str, Any]]:
    """This test's nodes' lines (the control plane is shared by the session's tests)."""
    return {n["node"]: n for n in report["nodes"] if n["node"].startswith(prefix)}


def kubectl() -> str:
    path = shutil.which("kubectl", path="/usr/bin:/usr/local/bin")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl is missing (.ci/run installs kubernetes-client)", pytrace=False)
        pytest.skip("no kubectl: apt-get install kubernetes-client")
    return path


def test_explain_a_pending_and_a_bound_pod_of_a_live_cluster(
    cluster: E2ECluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix, ns, kubeconfig = cluster.prefix, cluster.namespace, str(cluster.plane.kubeconfig)
    l4, h100, a100 = f"{prefix}-l4-od-0", f"{prefix}-h100-od-0", f"{prefix}-a100-od-0"
    cluster.add_nodes([
        whole_gpu_node(l4, L4, 2, "on-demand", 1.60),
        whole_gpu_node(h100, H100, 8, "on-demand", 98.32, all_to_all_nvlink(8, 18)),
        whole_gpu_node(a100, A100, 8, "on-demand", 32.77, all_to_all_nvlink(8, 12)),
    ])  # fmt: skip
    cluster.create_pods([pod_body("bound", {"nvidia.com/gpu": 1}, node_affinity={PRODUCT_LABEL: [L4]})])
    assert cluster.wait_all_bound(["bound"]) == {"bound": l4}
    # a scheduler nobody runs: the pod stays pending, as one gpupack could not place yet would
    cluster.create_pods([pod_body("waiting", {"nvidia.com/gpu": 2}, scheduler_name="nobody")])

    pending = explain_json(capsys, "--kubeconfig", kubeconfig, f"{ns}/waiting")
    mine = nodes_of(pending, prefix)
    assert pending["pod"] == f"{ns}/waiting" and pending["bound_to"] is None
    assert pending["chosen"] in (h100, a100) and len(pending["placement"]["gpus"]) == 2
    assert mine[l4]["verdict"] == "infeasible" and mine[l4]["reason"]  # one of its two GPUs is taken
    assert {mine[h100]["verdict"], mine[a100]["verdict"]} == {"chosen", "feasible"}
    runner_up = pending["runner_up"]
    assert runner_up["node"] in (h100, a100) and runner_up["margin"] > 0
    assert runner_up["differences"][runner_up["deciding_part"]] > 0
    for line in mine.values():
        if line["score"] is not None:
            assert sum(line["parts"].values()) == pytest.approx(line["score"], abs=1e-12)

    bound = explain_json(capsys, "--kubeconfig", kubeconfig, "bound", "-n", ns)
    assert bound["bound_to"] == l4 and bound["chosen"] == l4  # its own GPU counts as free again
    assert nodes_of(bound, prefix)[h100]["verdict"] in ("infeasible", "unresolvable")  # not an L4

    # the file mode on the same objects gives the same report
    api_pods = json.loads(cluster.plane.core().list_pod_for_all_namespaces(_preload_content=False).data)["items"]
    cluster_file = tmp_path / "cluster.yaml"
    items = [{"kind": "Node", "apiVersion": "v1", **n} for n in cluster.api_nodes()]
    items += [{"kind": "Pod", "apiVersion": "v1", **p} for p in api_pods]
    cluster_file.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    (waiting,) = [p for p in items if p["metadata"]["name"] == "waiting" and p["metadata"]["namespace"] == ns]
    pod_file = tmp_path / "pod.yaml"
    pod_file.write_text(yaml.safe_dump(waiting))
    from_file = explain_json(capsys, "--cluster-file", str(cluster_file), "--pod", str(pod_file))
    assert {**from_file, "source": ""} == {**pending, "source": ""}

    assert main(["explain", "--kubeconfig", kubeconfig, f"{ns}/missing"]) == 2
    assert f"pod {ns}/missing not found" in capsys.readouterr().err


def test_kubectl_gpupack_explain_runs_as_a_kubectl_plugin(
    cluster: E2ECluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, ns = cluster.prefix, cluster.namespace
    assert (VENV_BIN / "kubectl-gpupack").is_file(), "pyproject's kubectl-gpupack console script is not installed"
    cluster.add_nodes([whole_gpu_node(f"{prefix}-l4-od-0", L4, 2, "on-demand", 1.60)])
    cluster.create_pods([pod_body("waiting", {"nvidia.com/gpu": 1}, scheduler_name="nobody")])
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["KUBECONFIG"] = str(cluster.plane.kubeconfig)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([kubectl(), *args], env=env, capture_output=True, text=True, timeout=120)

    text = run("gpupack", "explain", f"{ns}/waiting")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"pod {ns}/waiting" and f"chosen: {prefix}-l4-od-0" in lines[1]
    assert any(line.startswith(f"{prefix}-l4-od-0 ") and "chosen" in line for line in lines)
    as_json = run("gpupack", "explain", "waiting", "-n", ns, "--json")
    assert as_json.returncode == 0, as_json.stderr
    monkeypatch.setenv("KUBECONFIG", env["KUBECONFIG"])  # no --kubeconfig: kubectl's, as the plugin reads it
    in_process = explain_json(capsys, f"{ns}/waiting")
    assert json.loads(as_json.stdout)["chosen"] == in_process["chosen"] == f"{prefix}-l4-od-0"
    usage = run("gpupack", "explain", "--help")
    assert usage.returncode == 0 and usage.stdout.startswith("usage: kubectl gpupack explain")
