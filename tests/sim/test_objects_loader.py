"""Loading Node / Pod objects from YAML and JSON files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupack.scoring.request import Kind
from gpupack.sim.load import load_nodes, load_pods, load_trace
from gpupack.sim.objects_loader import load_objects
from gpupack.sim.workload import TraceError

NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "gpu-a",
        "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8"},
    },
    "status": {
        "capacity": {"cpu": "96", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": "8"},
        "allocatable": {"cpu": "96", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": "8"},
    },
}
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "train", "namespace": "ml"},
    "spec": {
        "containers": [
            {
                "name": "main",
                "image": "trainer",
                "resources": {
                    "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "2"},
                    "limits": {"nvidia.com/gpu": "2"},
                },
            }
        ]
    },
}
CONFIG_MAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}}


def _yaml_docs(*docs: object) -> str:
    return "\n---\n".join(json.dumps(doc) for doc in docs)  # JSON is YAML


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("list.json", json.dumps([NODE, POD, CONFIG_MAP])),
        ("kindlist.json", json.dumps({"apiVersion": "v1", "kind": "List", "items": [NODE, POD, CONFIG_MAP]})),
        ("plain.yaml", f"- {json.dumps(NODE)}\n- {json.dumps(POD)}\n- {json.dumps(CONFIG_MAP)}\n"),
        (
            "multi.yml",
            "---\n" + _yaml_docs(NODE, {"kind": "PodList", "items": [POD]}, CONFIG_MAP) + "\n---\n",
        ),
    ],
)
def test_layouts_flatten_to_objects(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert [obj["kind"] for obj in load_objects(path)] == ["Node", "Pod", "ConfigMap"]


@pytest.mark.parametrize(
    ("name", "text", "reason"),
    [
        ("bad.json", "[1, 2", "bad.json:1: invalid JSON"),
        ("bad.yaml", "a: [1\nb: 2\n", "invalid YAML"),
        ("scalar.yaml", "42\n", "expected Kubernetes objects, found a int"),
        ("items.yaml", "kind: List\nitems: 3\n", "List.items is not a list"),
    ],
)
def test_malformed_object_files(tmp_path: Path, name: str, text: str, reason: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError, match=reason):
        load_objects(path)


def test_nodes_and_pods_from_one_cluster_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(_yaml_docs({"kind": "List", "items": [NODE, CONFIG_MAP]}, POD))
    [node] = load_nodes(path)
    assert (node.name, node.gpu_count, node.cpu_milli) == ("gpu-a", 8, 96_000)
    assert node.gpu_product == "NVIDIA-A100-SXM4-80GB"
    assert node.memory_bytes == 1024 << 30
    [pod] = load_pods(path)
    assert pod.name == "ml/train"
    assert (pod.request.kind, pod.request.gpus, pod.request.cpu_milli) == (Kind.WHOLE, 2, 4000)
    trace = load_trace(path, path)
    assert trace.gpu_milli_capacity == 8000 and trace.gpu_milli_demand == 2000


def test_duplicate_pods_rejected(tmp_path: Path) -> None:
    path = tmp_path / "pods.json"
    path.write_text(json.dumps([POD, POD]))
    with pytest.raises(TraceError, match="duplicate pod 'ml/train'"):
        load_pods(path)
