"""The fake NVML: MIG create/destroy as NVML allows it, and topology as `nvidia-smi topo -m` shows it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupack.agent.fake_nvml import FakeNvml, profiles_from_capture, profiles_from_geometry
from gpupack.agent.nvml import NvmlError
from gpupack.agent.nvml_topology import read_topology
from gpupack.agent.topology import parse_topo_matrix
from gpupack.kube.mig_layout import MigLayoutError, parse_layout
from gpupack.scoring.geometry import FAMILIES

DATA = Path(__file__).resolve().parents[1] / "data"
CAPTURE = DATA / "nvml-h100x4.json"
H100 = FAMILIES["H100-80GB"]
# every H100 profile, and one NVML does not have
PROFILES = ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "5g.50gb"]


def test_nvml_topology_equals_topo_m_on_the_same_host() -> None:
    """The h100x4 capture pair: NVML (all links into the NVSwitch, NUMA N/A) vs `topo -m` (NV18, NUMA 0)."""
    from_nvml = read_topology(FakeNvml.from_capture(CAPTURE))
    from_text = parse_topo_matrix((DATA / "h100x4-topo-m.txt").read_text())
    assert from_nvml == from_text
    assert from_nvml.nvlink[0][1] == 18


def test_direct_nvlinks_count_per_peer_and_numa_falls_back_to_cpu_affinity() -> None:
    nvml = FakeNvml.build(count=3, nvlink=[[0, 4, 0], [4, 0, 2], [0, 2, 0]], numa=[1, 0, 1])
    nvml.devices[2].numa, nvml.devices[2].cpu_numa = None, (1,)
    nvml.devices[0].numa, nvml.devices[0].cpu_numa = None, (0, 1)  # CPUs on two nodes: unknown
    topology = read_topology(nvml)
    assert topology.nvlink == ((0, 4, 0), (4, 0, 2), (0, 2, 0))
    assert topology.numa == (-1, 0, 1)


def test_capture_table_equals_the_design_geometry() -> None:
    """What NVML reported on the H100 equals what gpupack derives from the MIG table of docs/contracts.md."""
    captured = profiles_from_capture(json.loads(CAPTURE.read_text())["gpus"][0]["gi_profiles"])
    assert captured == profiles_from_geometry("NVIDIA-H100-80GB-HBM3")
    assert set(captured) == set(PROFILES) - {"5g.50gb"}


def test_create_refuses_mig_off_occupied_and_a_second_me() -> None:
    nvml = FakeNvml.from_capture(CAPTURE)
    with pytest.raises(NvmlError, match="MIG mode is disabled"):
        nvml.create_mig(0, "1g.10gb", 0)
    nvml = FakeNvml.from_capture(CAPTURE, mig_enabled=True)
    first = nvml.create_mig(0, "3g.40gb", 4)
    assert first.uuid.startswith("MIG-") and nvml.mig_instances(0) == [first]
    with pytest.raises(NvmlError, match="Insufficient Resources"):
        nvml.create_mig(0, "1g.10gb", 5)
    with pytest.raises(NvmlError, match="Invalid Argument"):
        nvml.create_mig(0, "3g.40gb", 2)
    nvml.create_mig(0, "1g.10gb+me", 0)
    with pytest.raises(NvmlError, match="1 instance"):
        nvml.create_mig(0, "1g.10gb+me", 1)
    nvml.destroy_mig(0, 4)
    again = nvml.create_mig(0, "3g.40gb", 4)
    assert again.uuid != first.uuid  # a new instance is a new device
    with pytest.raises(NvmlError, match="Not Found"):
        nvml.destroy_mig(1, 0)


def _legal(instances: list[tuple[str, int]]) -> bool:
    try:
        parse_layout({"0": [f"{profile}@{start}" for profile, start in instances]}, H100, 1)
    except MigLayoutError:
        return False
    return True


_OPS = st.lists(
    st.tuples(st.sampled_from(["create", "create", "destroy"]), st.sampled_from(PROFILES), st.integers(0, 7)),
    max_size=14,
)


@settings(max_examples=400, deadline=None)
@given(_OPS)
def test_fake_accepts_exactly_what_the_geometry_calls_legal(ops: list[tuple[str, str, int]]) -> None:
    nvml = FakeNvml.from_capture(CAPTURE, mig_enabled=True)
    held: list[tuple[str, int]] = []
    for op, profile, start in ops:
        if op == "create":
            legal = _legal([*held, (profile, start)])
            try:
                nvml.create_mig(0, profile, start)
                accepted = True
            except NvmlError:
                accepted = False
            assert accepted == legal, (held, profile, start)
            if accepted:
                held.append((profile, start))
        else:
            present = any(s == start for _, s in held)
            try:
                nvml.destroy_mig(0, start)
                accepted = True
            except NvmlError:
                accepted = False
            assert accepted == present
            held = [(p, s) for p, s in held if s != start]
        assert sorted((i.profile, i.start) for i in nvml.mig_instances(0)) == sorted(held)
