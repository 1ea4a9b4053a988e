"""The shipped manifests on the real node, changed only where this machine forces it.

`kubectl apply -k` of an overlay whose only resource is `manifests/` (with the component of the
release under test). What the overlay changes, and why nothing else may change (a test holds the
rendered objects to it, `changed_paths`):
- image names: nothing can be pulled here, so the locally built images are named `localhost/...`
  (the kube-scheduler tag stays the one the manifests choose for the release);
- host network for the scheduler Deployment and the agent DaemonSet: pods have no network of their own
  here (a loopback-only CNI), and gpupack-system's Pod Security level is lowered only as far as
  host network needs; the shipped levels are checked apart (test_real_node's admission cases);
- `KUBERNETES_SERVICE_HOST/PORT`: no kube-proxy routes the `kubernetes` Service here, so the pods
  are told the API server's loopback address;
- one scheduler replica: two would both need the same host ports on the one node;
- the agent's fake NVML (`GPUPACK_AGENT_FAKE_NVML`, the documented option for GPU-less clusters) and
  the host folder that holds its file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from gpupack.harness.controlplane import REPO_ROOT
from gpupack.harness.kube_programs import NEWEST, MissingBinary, kube_bin_dir

MANIFESTS = REPO_ROOT / "manifests"
FAKE_NVML_DIR = "/var/lib/gpupack-e2e/nvml"  # on the host and in the agent container
FAKE_NVML_FILE = f"{FAKE_NVML_DIR}/gpus.json"
SCHEDULER_CONTAINERS = ("kube-scheduler", "gpupack", "metrics")


def _service_env(api_port: int) -> list[dict[str, str]]:
    return [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(api_port)},
    ]


def scheduler_patch(api_port: int) -> dict[str, Any]:
    """One replica on the host network, told where the API server is."""
    containers = [{"name": name, "env": _service_env(api_port)} for name in SCHEDULER_CONTAINERS]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gpupack-scheduler", "namespace": "gpupack-system"},
        "spec": {"replicas": 1, "template": {"spec": {"hostNetwork": True, "containers": containers}}},
    }


def agent_patch(api_port: int) -> dict[str, Any]:
    """The host network, the API server's address and the fake NVML file from a host folder."""
    env = [*_service_env(api_port), {"name": "GPUPACK_AGENT_FAKE_NVML", "value": FAKE_NVML_FILE}]
    mount = {"name": "fake-nvml", "mountPath": FAKE_NVML_DIR}
    volume = {"name": "fake-nvml", "hostPath": {"path": FAKE_NVML_DIR, "type": "Directory"}}
    container = {"name": "agent", "env": env, "volumeMounts": [mount]}
    spec = {"hostNetwork": True, "containers": [container], "volumes": [volume]}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "gpupack-agent", "namespace": "gpupack-agent"},
        "spec": {"template": {"spec": spec}},
    }


def namespace_patch() -> dict[str, Any]:
    """gpupack-system admits host-network pods (`privileged` is the only level that does)."""
    labels = {"pod-security.kubernetes.io/enforce": "privileged"}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpupack-system", "labels": labels}}


def write_overlay(folder: Path, minor: str, gpupack_image: str, api_port: int) -> Path:
    """The e2e kustomization in `folder`: manifests/ with the component of `minor` (e.g. v1.37)."""
    folder.mkdir(parents=True, exist_ok=True)
    name, tag = gpupack_image.rsplit(":", 1)
    patches = {"scheduler.yaml": scheduler_patch(api_port), "agent.yaml": agent_patch(api_port)}
    patches["namespace.yaml"] = namespace_patch()
    for file_name, patch in patches.items():
        (folder / file_name).write_text(yaml.safe_dump(patch, sort_keys=False))
    relative = os.path.relpath(MANIFESTS, folder)  # kustomize takes no absolute resource paths
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [relative],
        "components": [f"{relative}/kubernetes-versions/{minor}"],
        "images": [
            {"name": "ghcr.io/gpupack/gpupack", "newName": name, "newTag": tag},
            {"name": "registry.k8s.io/kube-scheduler", "newName": "localhost/kube-scheduler"},
        ],
        "patches": [{"path": file_name} for file_name in patches],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return folder


def render(kubectl: Path, folder: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize folder`, as objects."""
    done = subprocess.run([str(kubectl), "kustomize", str(folder)], capture_output=True, text=True, check=True)
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def apply(kubectl: Path, kubeconfig: Path, folder: Path) -> str:
    """`kubectl apply -k folder` against the cluster; its output (CalledProcessError with stderr on failure)."""
    argv = [str(kubectl), f"--kubeconfig={kubeconfig}", "apply", "-k", str(folder)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"kubectl apply -k {folder} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def kubectl() -> Path:
    """The kubectl the e2e suite built (the newest release), else one on PATH."""
    try:
        return kube_bin_dir(NEWEST, ("kubectl",)) / "kubectl"
    except MissingBinary:
        found = shutil.which("kubectl")
        assert found, "no kubectl (build it: tests/e2e/tools/build-kube.sh)"
        return Path(found)
