"""NodeFacts from v1.Node dicts (docs/contracts.md#node-labels)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpupack.kube.keys import LABEL_GPU_COUNT
from gpupack.kube.mig_layout import MigLayoutError, parse_layout, synthesize_layout
from gpupack.kube.node_facts import NodeFactsError, facts_from_node, is_spot, node_is_schedulable
from gpupack.kube.objects import H100, make_node
from gpupack.scoring.facts import MigMode
from gpupack.scoring.geometry import FAMILIES
from gpupack.scoring.inventory import Inventory
from tests.wire_captures import captured_nodes

H100_FAMILY = FAMILIES["H100-80GB"]


def node(
    name: str = "n1",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    allocatable: dict[str, Any] | None = None,
    **status: Any,
) -> dict[str, Any]:
    """`make_node` with 96 CPUs and 1Ti, 8 H100 GPUs unless told otherwise, and no gpu.count label
    (each test here decides it); keyword arguments go into status."""
    obj = make_node(
        name,
        cpu="96",
        memory="1Ti",
        labels={LABEL_GPU_COUNT: None, **(labels or {})},
        annotations=annotations,
        allocatable=allocatable,
    )
    obj["status"].update(status)
    return obj


# ----------------------------------------------------------------- captured nodes


def test_captured_nodes() -> None:
    nodes = captured_nodes()
    assert sorted(nodes) == ["gpu-node-a", "gpu-node-b", "gpu-node-c"]
    facts = {name: facts_from_node(obj) for name, obj in nodes.items()}
    for f in facts.values():
        assert (f.cpu_milli, f.memory_bytes, f.pods) == (192_000, 2**41, 110)
        assert (f.gpu_product, f.gpu_count) == (H100, 8)
        assert f.hourly_cost is None
        assert f.labels["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    assert [facts[n].spot for n in sorted(facts)] == [False, True, False]
    assert facts["gpu-node-a"].mig_mode == MigMode.NONE
    c = facts["gpu-node-c"]
    assert c.mig_mode == MigMode.STATIC
    assert c.mig_layout == {0: tuple(("1g.10gb", start) for start in range(7))}
    assert all(node_is_schedulable(obj) for obj in nodes.values())


def test_captured_nodes_are_accepted_by_the_inventory() -> None:
    inventory = Inventory()
    for obj in captured_nodes().values():
        inventory.add_node(facts_from_node(obj))
    assert inventory.gpus_total() == 24


def test_price_table_by_instance_and_capacity_type() -> None:
    table = {("p5.48xlarge", "on-demand"): 98.32, ("p5.48xlarge", "spot"): 40.0}
    nodes = captured_nodes()
    assert facts_from_node(nodes["gpu-node-a"], table).hourly_cost == 98.32
    assert facts_from_node(nodes["gpu-node-b"], table).hourly_cost == 40.0
    assert facts_from_node(nodes["gpu-node-a"], {}).hourly_cost is None


# ----------------------------------------------------------------- capacity, price, schedulability


def test_allocatable_falls_back_to_capacity() -> None:
    obj = node()
    obj["status"] = {"capacity": obj["status"].pop("allocatable")}
    assert facts_from_node(obj).cpu_milli == 96_000
    obj["status"] = {"allocatable": {"cpu": "4"}}
    facts = facts_from_node(obj)
    assert (facts.memory_bytes, facts.pods, facts.gpu_count) == (0, 110, 0)


@pytest.mark.parametrize(
    ("labels", "spot"),
    [
        ({"karpenter.sh/capacity-type": "spot"}, True),
        ({"karpenter.sh/capacity-type": "on-demand"}, False),
        ({"eks.amazonaws.com/capacityType": "SPOT"}, True),
        ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, False),
        ({"cloud.google.com/gke-spot": "true"}, True),
        ({"kubernetes.azure.com/scalesetpriority": "spot"}, True),
        ({"kubernetes.azure.com/scalesetpriority": "regular"}, False),
        ({}, False),
    ],
)
def test_capacity_type(labels: dict[str, str], spot: bool) -> None:
    assert is_spot(labels) is spot
    assert facts_from_node(node(labels=labels)).spot is spot


def test_hourly_cost_annotation_beats_price_table() -> None:
    obj = node(
        labels={"node.kubernetes.io/instance-type": "p5"}, annotations={"gpupack.io/hourly-cost": "98.32"}
    )
    assert facts_from_node(obj, {("p5", "on-demand"): 1.0}).hourly_cost == 98.32
    assert (
        facts_from_node(
            node(labels={"node.kubernetes.io/instance-type": "p5"}), {("p5", "on-demand"): 1.0}
        ).hourly_cost
        == 1.0
    )


@pytest.mark.parametrize(
    ("cost", "reason"),
    [
        ("-1", "finite, non-negative"),
        ("abc", "not a number"),
        ("nan", "not a number"),
        ("inf", "not a number"),
        ("1_000", "not a number"),
        ("", "not a number"),
        ("1e999", "finite"),
    ],
)
def test_bad_hourly_cost(cost: str, reason: str) -> None:
    with pytest.raises(NodeFactsError, match=f"node n1: gpupack.io/hourly-cost: .*{reason}"):
        facts_from_node(node(annotations={"gpupack.io/hourly-cost": cost}))


def test_schedulability() -> None:
    assert node_is_schedulable(node())  # no conditions: a node from a cluster file
    cordoned = node()
    cordoned["spec"]["unschedulable"] = True
    assert not node_is_schedulable(cordoned)
    assert facts_from_node(cordoned).gpu_count == 8  # still has facts
    assert node_is_schedulable(node(conditions=[{"type": "Ready", "status": "True"}]))
    assert not node_is_schedulable(node(conditions=[{"type": "Ready", "status": "False"}]))
    assert not node_is_schedulable(node(conditions=[{"type": "Ready", "status": "Unknown"}]))
    assert not node_is_schedulable(node(conditions=[{"type": "MemoryPressure", "status": "False"}]))


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"metadata": {}}, "node <unnamed>: metadata.name: missing"),
        (
            node(labels={"nvidia.com/gpu.count": "eight"}),
            "node n1: label nvidia.com/gpu.count: 'eight' is not a whole",
        ),
        (node(labels={"nvidia.com/gpu.memory": "-1"}), "label nvidia.com/gpu.memory"),
        (node(allocatable={"nvidia.com/gpu": "1.5"}), "node n1: allocatable nvidia.com/gpu: .*whole number"),
        (node(allocatable={"memory": "lots"}), "allocatable memory: invalid quantity 'lots'"),
        (node(allocatable={"nvidia.com/gpu": "17"}), "17 GPUs; gpupack supports at most 16"),
        (
            node(annotations={"gpupack.io/mig": "yes"}),
            'gpupack.io/mig: \'yes\' is neither "dynamic" nor "static"',
        ),
        (
            {"metadata": {"name": "n1", "annotations": {"gpupack.io/hourly-cost": 3}}},
            "metadata.annotations: must map",
        ),
    ],
)
def test_garbage_names_node_and_key(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(NodeFactsError, match=message):
        facts_from_node(obj)


def test_gpu_memory_label() -> None:
    assert facts_from_node(node(labels={"nvidia.com/gpu.memory": "81559"})).gpu_memory_mib == 81559


# ----------------------------------------------------------------- MIG


def test_dynamic_mig() -> None:
    obj = node(
        labels={"nvidia.com/gpu.count": "4"},
        annotations={"gpupack.io/mig": "dynamic"},
        allocatable={"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "28"},
    )
    facts = facts_from_node(obj)
    assert (facts.mig_mode, facts.gpu_count, facts.mig_layout) == (MigMode.DYNAMIC, 4, {})


def test_dynamic_mig_needs_a_mig_product() -> None:
    obj = node(labels={"nvidia.com/gpu.product": "NVIDIA-L4"}, annotations={"gpupack.io/mig": "dynamic"})
    with pytest.raises(NodeFactsError, match=r"gpupack.io/mig: GPU product 'NVIDIA-L4' has no MIG geometry"):
        facts_from_node(obj)


def test_unknown_product_is_non_mig() -> None:
    obj = node(labels={"nvidia.com/gpu.product": "NVIDIA-B999"}, allocatable={"nvidia.com/mig-1g.10gb": "7"})
    facts = facts_from_node(obj)
    assert (facts.mig_mode, facts.gpu_count) == (MigMode.NONE, 8)


def test_static_mig_synthesized_without_count_label() -> None:
    obj = node(
        allocatable={"nvidia.com/gpu": "6", "nvidia.com/mig-3g.40gb": "3", "nvidia.com/mig-1g.10gb": "2"}
    )
    facts = facts_from_node(obj)
    assert facts.mig_mode == MigMode.STATIC
    assert facts.gpu_count == 8  # 6 whole + 2 partitioned
    assert facts.mig_layout == {
        0: (("3g.40gb", 0), ("3g.40gb", 4)),
        1: (("3g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5)),
    }
    Inventory().add_node(facts)


def test_static_mig_that_does_not_fit_the_count() -> None:
    obj = node(
        labels={"nvidia.com/gpu.count": "1"},
        allocatable={"nvidia.com/gpu": "0", "nvidia.com/mig-7g.80gb": "2"},
    )
    with pytest.raises(
        NodeFactsError, match=r"node n1: allocatable nvidia.com/mig-\*: 2 x 7g.80gb .* do not fit on 1 GPUs"
    ):
        facts_from_node(obj)


def test_static_mig_unknown_allocatable_profile() -> None:
    with pytest.raises(NodeFactsError, match=r"MIG profile '1g.5gb' does not exist on H100-80GB"):
        facts_from_node(node(allocatable={"nvidia.com/mig-1g.5gb": "1"}))


def test_static_mig_media_extension_instances_are_advertised_as_dot_me() -> None:
    obj = node(allocatable={"nvidia.com/gpu": "7", "nvidia.com/mig-1g.10gb.me": "1", "nvidia.com/mig-1g.10gb": "6"})
    facts = facts_from_node(obj)
    assert facts.mig_layout == {0: (("1g.10gb+me", 0), *(("1g.10gb", start) for start in range(1, 7)))}
    with pytest.raises(NodeFactsError, match=r"node n1: nvidia.com/mig-1g.10gb\+me: .* cannot hold '\+'"):
        facts_from_node(node(allocatable={"nvidia.com/mig-1g.10gb+me": "1"}))


def test_layout_accepts_both_media_extension_spellings() -> None:
    allocatable = {"nvidia.com/mig-1g.10gb.me": "1", "nvidia.com/mig-1g.10gb": "1"}
    for spelling in ("1g.10gb+me", "1g.10gb.me"):
        facts = facts_from_node(layout_node({"0": [f"{spelling}@0", "1g.10gb@1"]}, allocatable))
        assert facts.mig_layout == {0: (("1g.10gb+me", 0), ("1g.10gb", 1))}
        Inventory().add_node(facts)


def layout_node(layout: object, allocatable: dict[str, str] | None = None, **labels: str) -> dict[str, Any]:
    text = layout if isinstance(layout, str) else json.dumps(layout)
    return node(
        labels={f"nvidia.com/{k.replace('_', '.')}": v for k, v in labels.items()},
        annotations={"gpupack.io/mig-layout": text},
        allocatable={
            "nvidia.com/gpu": "6",
            **(
                allocatable
                or {
                    "nvidia.com/mig-4g.40gb": "1",
                    "nvidia.com/mig-3g.40gb": "1",
                    "nvidia.com/mig-1g.10gb": "2",
                }
            ),
        },
    )


def test_static_mig_layout_annotation() -> None:
    layout = {"2": ["4g.40gb@0", "3g.40gb@4"], "5": ["1g.10gb@0", "1g.10gb@6"]}
    facts = facts_from_node(layout_node(layout, gpu_count="8"))
    assert facts.mig_mode == MigMode.STATIC
    assert facts.gpu_count == 8
    assert facts.mig_layout == {2: (("4g.40gb", 0), ("3g.40gb", 4)), 5: (("1g.10gb", 0), ("1g.10gb", 6))}
    Inventory().add_node(facts)
    # without the count label: 6 whole GPUs + 2 partitioned
    assert facts_from_node(layout_node(layout)).gpu_count == 8


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("{oops", "malformed JSON"),
        (["4g.40gb@0"], "must be a JSON object"),
        ({"0": ["9g.99gb@0"]}, "MIG profile '9g.99gb' does not exist on H100-80GB"),
        ({"0": ["4g.40gb@0", "3g.40gb@0"]}, "GPU 0: 3g.40gb@0 overlaps another instance"),
        ({"0": ["4g.40gb@4"]}, "GPU 0: 4g.40gb cannot start at slice 4"),
        ({"0": ["4g.40gb"]}, 'is not "profile@start"'),
        ({"-1": ["4g.40gb@0"]}, "GPU index '-1' is not a non-negative integer"),
        ({"8": ["4g.40gb@0"]}, "GPU index 8 does not exist on a node with 8 GPUs"),
        ({"0": "4g.40gb@0"}, "expected a list"),
        (
            {"0": ["4g.40gb@0", "3g.40gb@4"], "1": ["1g.10gb@0"]},
            r"holds \{.*1g.10gb: 1.*\} but allocatable advertises \{.*1g.10gb: 2",
        ),
    ],
)
def test_bad_layout_annotation(layout: object, message: str) -> None:
    with pytest.raises(NodeFactsError, match=f"node n1: gpupack.io/mig-layout: .*{message}"):
        facts_from_node(layout_node(layout, gpu_count="8"))


def test_layout_beyond_the_gpus_without_count_label() -> None:
    layout = {"9": ["4g.40gb@0", "3g.40gb@4", "1g.10gb@0"]}
    with pytest.raises(NodeFactsError, match=r"gpupack.io/mig-layout"):
        facts_from_node(layout_node(layout))


def test_layout_annotation_on_a_non_mig_product() -> None:
    obj = layout_node({}, gpu_product="Tesla-T4")
    with pytest.raises(NodeFactsError, match=r"gpupack.io/mig-layout: GPU product 'Tesla-T4' has no MIG"):
        facts_from_node(obj)


def test_layout_allows_one_me_instance_per_gpu() -> None:
    assert parse_layout({"0": ["1g.10gb+me@0", "1g.10gb@1"]}, H100_FAMILY, 8)[0][0] == ("1g.10gb+me", 0)
    with pytest.raises(MigLayoutError, match=r"only one \+me instance"):
        parse_layout({"0": ["1g.10gb+me@0", "1g.10gb+me@1"]}, H100_FAMILY, 8)


def test_synthesis_packs_largest_first() -> None:
    layout = synthesize_layout(H100_FAMILY, {"1g.10gb": 3, "4g.40gb": 1, "2g.20gb": 2}, None)
    assert layout == {
        0: (("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)),
        1: (("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3)),
    }


# ----------------------------------------------------------------- topology


def test_topology() -> None:
    nvlink = [[0, 12], [12, 0]]
    obj = node(
        allocatable={"nvidia.com/gpu": "2"},
        annotations={"gpupack.io/gpu-topology": json.dumps({"nvlink": nvlink, "numa": [0, 1]})},
    )
    facts = facts_from_node(obj)
    assert facts.nvlink == ((0, 12), (12, 0))
    assert facts.numa == (0, 1)
    Inventory().add_node(facts)
    only_numa = node(
        allocatable={"nvidia.com/gpu": "2"}, annotations={"gpupack.io/gpu-topology": '{"numa": [0, 0]}'}
    )
    assert (facts_from_node(only_numa).nvlink, facts_from_node(only_numa).numa) == (None, (0, 0))
    # -1 is N/A (as `gpupack topology` writes it): the node's NUMA layout is unknown, no preference
    unknown = node(allocatable={"nvidia.com/gpu": "2"}, annotations={"gpupack.io/gpu-topology": '{"numa": [0, -1]}'})
    assert facts_from_node(unknown).numa is None


@pytest.mark.parametrize(
    ("topology", "message"),
    [
        ({"nvlink": [[0, 1], [1, 0]]}, "nvlink must be a 3x3 matrix"),
        ({"nvlink": [[0, 1, 1], [1, 0, 1]]}, "nvlink must be a 3x3 matrix"),
        ({"nvlink": [[0, 1, 1], [1, 0], [1, 1, 0]]}, "nvlink must be a 3x3 matrix"),
        ({"nvlink": [[0, 1, 2], [1, 0, 1], [1, 1, 0]]}, r"not symmetric: \[2\]\[0\] != \[0\]\[2\]"),
        ({"nvlink": [[0, -1, 0], [-1, 0, 0], [0, 0, 0]]}, "nvlink entry -1 is not an integer in 0..64"),
        ({"nvlink": [[0, 1.5, 0], [1.5, 0, 0], [0, 0, 0]]}, "nvlink entry 1.5"),
        ({"numa": [0, 1]}, r"numa must list one NUMA node per GPU \(3\)"),
        ({"numa": [0, True, 1]}, "numa entry True"),
        ({"numa": [0, -2, 1]}, "numa entry -2"),
        ({"nvlinks": []}, 'keys "nvlink" and/or "numa"'),
        ([], 'keys "nvlink" and/or "numa"'),
    ],
)
def test_bad_topology(topology: object, message: str) -> None:
    obj = node(
        allocatable={"nvidia.com/gpu": "3"}, annotations={"gpupack.io/gpu-topology": json.dumps(topology)}
    )
    with pytest.raises(NodeFactsError, match=f"node n1: gpupack.io/gpu-topology: .*{message}"):
        facts_from_node(obj)
