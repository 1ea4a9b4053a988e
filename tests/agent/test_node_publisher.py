"""The agent's node annotations: what it writes, that serve reads them, and that nothing else is touched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpupack.agent.fake_nvml import FakeNvml
from gpupack.agent.node_gpus import NodeGpus
from gpupack.agent.node_publisher import desired_annotations, publish
from gpupack.agent.nvml_topology import read_topology
from gpupack.kube.node_facts import facts_from_node
from gpupack.scoring.facts import MigMode

CAPTURE = Path(__file__).resolve().parents[1] / "data" / "nvml-h100x4.json"


class FakeNodeApi:
    """A Node in memory that applies merge patches to its annotations."""

    def __init__(self, annotations: dict[str, str]) -> None:
        self.node: dict[str, Any] = {"metadata": {"name": "n1", "annotations": dict(annotations)}}
        self.patches: list[dict[str, str | None]] = []

    def get_node(self) -> dict[str, Any]:
        return self.node

    def patch_annotations(self, annotations: dict[str, str | None]) -> None:
        self.patches.append(annotations)
        current = self.node["metadata"]["annotations"]
        for key, value in annotations.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value


def _snapshot(nvml: FakeNvml, dynamic: bool = False) -> dict[str, str | None]:
    topology = read_topology(nvml)
    return desired_annotations(topology, NodeGpus.read(nvml, topology.numa, dynamic))


def test_static_mig_node_gets_topology_and_layout_and_serve_reads_them() -> None:
    nvml = FakeNvml.from_capture(CAPTURE, mig_enabled=False)
    nvml.devices[1].mig_enabled = True
    nvml.create_mig(1, "4g.40gb", 0)
    nvml.create_mig(1, "1g.10gb+me", 6)
    api = FakeNodeApi({"owner/other": "keep", "gpupack.io/hourly-cost": "98.3"})
    patch = publish(api, _snapshot(nvml))
    assert set(patch) == {"gpupack.io/gpu-topology", "gpupack.io/mig-layout"}
    layout = patch["gpupack.io/mig-layout"]
    assert layout is not None and json.loads(layout) == {"1": ["4g.40gb@0", "1g.10gb+me@6"]}
    annotations = api.node["metadata"]["annotations"]
    assert annotations["owner/other"] == "keep" and annotations["gpupack.io/hourly-cost"] == "98.3"
    node = {
        "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                              "nvidia.com/gpu.count": "4"}, "annotations": annotations},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "3",
                                   "nvidia.com/mig-4g.40gb": "1", "nvidia.com/mig-1g.10gb.me": "1"}},
    }
    facts = facts_from_node(node)
    assert facts.mig_mode == MigMode.STATIC and facts.numa == (0, 0, 0, 0)
    assert facts.nvlink is not None and facts.nvlink[0][3] == 18
    assert facts.mig_layout == {1: (("4g.40gb", 0), ("1g.10gb+me", 6))}


def test_republishes_only_on_change_and_drops_a_stale_layout() -> None:
    nvml = FakeNvml.build(count=2, mig_enabled=True)
    nvml.create_mig(0, "7g.80gb", 0)
    api = FakeNodeApi({})
    publish(api, _snapshot(nvml))
    assert publish(api, _snapshot(nvml)) == {}  # nothing changed, nothing written
    nvml.destroy_mig(0, 0)
    nvml.create_mig(0, "3g.40gb", 4)
    assert publish(api, _snapshot(nvml)) == {"gpupack.io/mig-layout": '{"0":["3g.40gb@4"]}'}
    assert publish(api, _snapshot(nvml, dynamic=True)) == {"gpupack.io/mig-layout": None}
    assert "gpupack.io/mig-layout" not in api.node["metadata"]["annotations"]


def test_unknown_numa_is_left_out_rather_than_written_as_minus_one() -> None:
    nvml = FakeNvml.build(count=2, nvlink=[[0, 4], [4, 0]])
    for gpu in nvml.devices:
        gpu.numa, gpu.cpu_numa = None, (0, 1)
    topology = _snapshot(nvml)["gpupack.io/gpu-topology"]
    assert topology is not None and json.loads(topology) == {"nvlink": [[0, 4], [4, 0]]}
