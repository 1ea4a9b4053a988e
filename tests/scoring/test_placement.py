"""Where the engine puts pods: MIG packing, static instances, shares, NVLink sets, spot and model fit.

Every test uses the `gpupack` policy unless it says otherwise, and checks each decision against the
plain-Python reference on the way.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from gpupack.scoring import kernels as k
from gpupack.scoring.engine import Decision, Engine
from gpupack.scoring.facts import GpuSlot, MigMode, NodeFacts, Placement
from gpupack.scoring.inventory import Inventory, InventoryError
from gpupack.scoring.policies import GpupackArgs, PolicySpec, baseline, gpupack
from gpupack.scoring.reference import reference_decide
from gpupack.scoring.request import Kind, PodRequest

GIB = 1 << 30
H100 = "NVIDIA-H100-80GB-HBM3"


def node(
    name: str, product: str = "", count: int = 0, mode: MigMode = MigMode.NONE, **kw: Any
) -> NodeFacts:
    return NodeFacts(name, 64000, 512 * GIB, gpu_product=product, gpu_count=count, mig_mode=mode, **kw)


def mig(*profiles: str, **kw: Any) -> PodRequest:
    counts: dict[str, int] = {}
    for p in profiles:
        counts[p] = counts.get(p, 0) + 1
    return PodRequest(cpu_milli=100, kind=Kind.MIG, mig=tuple(counts.items()), **kw)


def whole(gpus: int, **kw: Any) -> PodRequest:
    return PodRequest(cpu_milli=100, kind=Kind.WHOLE, gpus=gpus, **kw)


def share(milli: int) -> PodRequest:
    return PodRequest(cpu_milli=100, kind=Kind.SHARE, milli=milli)


class Cluster:
    """An inventory, an engine over it, and a decide-and-commit helper checked against the reference."""

    def __init__(self, *nodes: NodeFacts, policy: PolicySpec | None = None) -> None:
        self.inventory = Inventory()
        for facts in nodes:
            self.inventory.add_node(facts)
        self.policy = policy or gpupack()
        self.engine = Engine(self.inventory, self.policy)

    def decide(self, request: PodRequest) -> Decision:
        decision = self.engine.decide(request)
        expected = reference_decide(self.inventory, self.policy, request)
        assert decision.placement == expected.placement
        assert decision.verdicts.tolist() == expected.verdicts.tolist()
        assert decision.scores.tolist() == expected.scores.tolist()
        return decision

    def place(self, request: PodRequest) -> Placement | None:
        """Decide and commit; None when nothing fits."""
        placement = self.decide(request).placement
        if placement is not None:
            self.inventory.commit(placement)
        return placement


def slots(placement: Placement | None) -> list[tuple[int, str, int]]:
    assert placement is not None
    return [(s.index, s.mig, s.start) for s in placement.slots]


# ----------------------------------------------------------------------------- dynamic MIG


@pytest.mark.parametrize("count", [1, 2, 4])
def test_three_1g_leave_room_for_a_4g_on_the_same_gpu(count: int) -> None:
    cluster = Cluster(node("h", H100, count, MigMode.DYNAMIC))
    small = [slots(cluster.place(mig("1g.10gb"))) for _ in range(3)]
    assert [gpu for ((gpu, _, _),) in small] == [0, 0, 0]
    assert sorted(start for ((_, _, start),) in small) == [4, 5, 6]  # the 4g's half stays free
    assert slots(cluster.place(mig("4g.40gb"))) == [(0, "4g.40gb", 0)]


def test_2g_then_4g_share_one_gpu() -> None:
    cluster = Cluster(node("h", H100, 1, MigMode.DYNAMIC))
    assert slots(cluster.place(mig("2g.20gb"))) == [(0, "2g.20gb", 4)]
    assert slots(cluster.place(mig("4g.40gb"))) == [(0, "4g.40gb", 0)]
    assert cluster.inventory.gpu_compute[0] == 6


def test_an_instance_goes_to_the_fullest_gpu_at_the_start_that_keeps_room() -> None:
    """gpupack: the fullest GPU (a light one stays light, so departures empty it for a 7g), and on it the
    start of least fragmentation; least fragmentation alone takes the lighter GPU, best fit the lowest start."""

    def first_1g(policy: PolicySpec) -> list[tuple[int, str, int]]:
        cluster = Cluster(node("h", H100, 2, MigMode.DYNAMIC), policy=policy)
        cluster.inventory.commit(Placement("h", (GpuSlot(0, mig="2g.20gb", start=4),)))
        cluster.inventory.commit(Placement("h", (GpuSlot(1, mig="4g.40gb", start=0),)))
        return slots(cluster.place(mig("1g.10gb")))

    least_frag = gpupack()
    least_frag.rules[k.RULE_MIG] = k.PICK_LEAST_FRAG
    assert first_1g(gpupack()) == [(1, "1g.10gb", 6)]  # 2g.20gb at 4 still fits beside it
    assert first_1g(least_frag) == [(0, "1g.10gb", 6)]
    assert first_1g(baseline("best-fit")) == [(1, "1g.10gb", 4)]


def test_first_fit_blocks_the_4g_that_gpupack_keeps_room_for() -> None:
    cluster = Cluster(node("h", H100, 1, MigMode.DYNAMIC), policy=baseline("first-fit"))
    assert slots(cluster.place(mig("1g.10gb"))) == [(0, "1g.10gb", 0)]
    decision = cluster.decide(mig("4g.40gb"))
    assert decision.placement is None
    assert decision.verdicts[0] == k.NO_MIG


def test_multi_instance_request_largest_first() -> None:
    cluster = Cluster(node("h", H100, 1, MigMode.DYNAMIC))
    placed = slots(cluster.place(mig("1g.10gb", "3g.40gb", "1g.10gb")))
    assert placed[0][1] == "3g.40gb"
    masks = [((1 << (4 if p == "3g.40gb" else 1)) - 1) << start for _, p, start in placed]
    assert sum(masks) == int(np.bitwise_or.reduce(masks))  # disjoint


def test_plus_me_instances_one_per_gpu() -> None:
    one_gpu = Cluster(node("h", H100, 1, MigMode.DYNAMIC))
    assert one_gpu.decide(mig("1g.10gb+me", "1g.10gb+me")).verdicts[0] == k.NO_MIG
    assert slots(one_gpu.place(mig("1g.10gb+me")))[0][1] == "1g.10gb+me"
    assert one_gpu.decide(mig("1g.10gb+me")).verdicts[0] == k.NO_MIG
    assert one_gpu.place(mig("1g.10gb")) is not None  # a plain 1g still fits
    two_gpus = Cluster(node("h", H100, 2, MigMode.DYNAMIC))
    placed = slots(two_gpus.place(mig("1g.10gb+me", "1g.10gb+me")))
    assert sorted(gpu for gpu, _, _ in placed) == [0, 1]


# ----------------------------------------------------------------------------- static MIG


def test_static_mig_uses_existing_free_instances_only() -> None:
    layout = {
        0: (("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)),
        1: (("4g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5)),  # slices 6-7 have no instance
    }
    cluster = Cluster(node("a", "NVIDIA-A100-SXM4-80GB", 2, MigMode.STATIC, mig_layout=layout))
    assert slots(cluster.place(mig("2g.20gb"))) == [(0, "2g.20gb", 4)]
    assert cluster.decide(mig("2g.20gb")).verdicts[0] == k.NO_MIG  # the only one is taken
    assert cluster.decide(mig("1g.20gb")).verdicts[0] == k.NO_MIG  # no such instance exists
    assert cluster.decide(mig("7g.80gb")).verdicts[0] == k.NO_MIG
    ones = {tuple(slots(cluster.place(mig("1g.10gb")))[0]) for _ in range(3)}
    assert ones == {(0, "1g.10gb", 6), (1, "1g.10gb", 4), (1, "1g.10gb", 5)}
    assert cluster.decide(mig("1g.10gb")).verdicts[0] == k.NO_MIG
    assert slots(cluster.place(mig("4g.40gb"))) == [(1, "4g.40gb", 0)]
    assert slots(cluster.place(mig("3g.40gb"))) == [(0, "3g.40gb", 0)]
    assert cluster.decide(mig("3g.40gb")).verdicts[0] == k.NO_MIG
    # whole GPUs and shares never use a GPU that has a static layout
    assert cluster.decide(whole(1)).verdicts[0] == k.NO_GPU
    assert cluster.decide(share(100)).verdicts[0] == k.NO_GPU


@pytest.mark.parametrize(
    "policy", [gpupack(), baseline("best-fit"), baseline("first-fit")], ids=["gpupack", "best-fit", "first-fit"]
)
def test_static_plus_me_instances_go_to_plus_me_requests_only(policy: PolicySpec) -> None:
    """A `.me` request takes the layout's +me instance and nothing else; a plain 1g never takes it."""
    layout = {0: (("1g.10gb+me", 0), ("1g.10gb", 1)), 1: (("1g.10gb", 0), ("1g.10gb", 1))}
    cluster = Cluster(node("a", H100, 2, MigMode.STATIC, mig_layout=layout), policy=policy)
    assert cluster.decide(mig("1g.10gb+me", "1g.10gb+me")).verdicts[0] == k.NO_MIG  # one +me instance
    assert slots(cluster.place(mig("1g.10gb+me"))) == [(0, "1g.10gb+me", 0)]
    assert cluster.decide(mig("1g.10gb+me")).verdicts[0] == k.NO_MIG  # a plain instance is no +me
    plain = {tuple(slots(cluster.place(mig("1g.10gb")))[0]) for _ in range(3)}
    assert plain == {(0, "1g.10gb", 1), (1, "1g.10gb", 0), (1, "1g.10gb", 1)}
    assert cluster.decide(mig("1g.10gb")).verdicts[0] == k.NO_MIG  # the +me one is not for it


def test_static_plus_me_instance_is_not_committed_for_a_plain_slot() -> None:
    layout = {0: (("1g.10gb+me", 0),)}
    cluster = Cluster(node("a", H100, 1, MigMode.STATIC, mig_layout=layout))
    with pytest.raises(InventoryError, match=r"has no 1g\.10gb@0 instance"):
        cluster.inventory.commit(Placement("a", (GpuSlot(0, mig="1g.10gb", start=0),)))
    cluster.inventory.commit(Placement("a", (GpuSlot(0, mig="1g.10gb+me", start=0),)))


# ----------------------------------------------------------------------------- shares


@pytest.mark.parametrize("policy", [gpupack(), baseline("best-fit")], ids=["gpupack", "best-fit"])
def test_shares_go_to_the_tightest_gpu_that_fits(policy: PolicySpec) -> None:
    cluster = Cluster(node("l", "NVIDIA-L4", 4), policy=policy)
    cluster.inventory.commit(Placement("l", (GpuSlot(1, milli=400),)))  # GPU 1: 600 free
    cluster.inventory.commit(Placement("l", (GpuSlot(2, milli=700),)))  # GPU 2: 300 free
    assert slots(cluster.decide(share(250)).placement) == [(2, "", -1)]
    assert slots(cluster.decide(share(500)).placement) == [(1, "", -1)]
    assert slots(cluster.decide(share(700)).placement) == [(0, "", -1)]


# ----------------------------------------------------------------------------- NVLink

# DGX-1 (V100) hybrid cube-mesh: quads 0-3 and 4-7 fully connected, plus i <-> i+4
DGX1_LINKS = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
    (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
}  # fmt: skip
QUADS = ({0, 1, 2, 3}, {4, 5, 6, 7})


def dgx1(name: str = "dgx") -> NodeFacts:
    matrix = [[0] * 8 for _ in range(8)]
    for (a, b), links in DGX1_LINKS.items():
        matrix[a][b] = matrix[b][a] = links
    return node(
        name,
        "Tesla-V100-SXM2-32GB",
        8,
        nvlink=tuple(tuple(row) for row in matrix),
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
    )


def gpus_of(placement: Placement | None) -> set[int]:
    assert placement is not None
    return {s.index for s in placement.slots}


def test_dgx1_fixture_is_a_hybrid_cube_mesh() -> None:
    for quad in QUADS:
        assert all(tuple(sorted(p)) in DGX1_LINKS for p in itertools.combinations(quad, 2))
    assert all(DGX1_LINKS[(i, i + 4)] for i in range(4))
    for gpu in range(8):  # six NVLink2 links per V100
        assert sum(n for pair, n in DGX1_LINKS.items() if gpu in pair) == 6


def test_four_gpu_pod_gets_a_fully_connected_quad() -> None:
    assert gpus_of(Cluster(dgx1()).place(whole(4))) in QUADS


def test_two_gpu_pod_gets_a_double_link_pair() -> None:
    a, b = sorted(gpus_of(Cluster(dgx1()).place(whole(2))))
    assert DGX1_LINKS[(a, b)] == 2


def test_quad_survives_a_one_gpu_pod() -> None:
    cluster = Cluster(dgx1())
    single = gpus_of(cluster.place(whole(1)))
    quad = gpus_of(cluster.place(whole(4)))
    assert quad in QUADS and not quad & single


def cube_mesh() -> NodeFacts:
    """A DGX-1-style cube mesh: quads 0-3 and 4-7 fully linked, plus i <-> i+4 (two links each), one NUMA
    node. With GPU 0 taken, the free quad 4-7 and a set such as {1, 2, 5, 6} (four links, two of them
    double) have the same link count and the same affinity."""
    matrix = [[0] * 8 for _ in range(8)]
    for quad in QUADS:
        for a, b in itertools.combinations(sorted(quad), 2):
            matrix[a][b] = matrix[b][a] = 1
    for i in range(4):
        matrix[i][i + 4] = matrix[i + 4][i] = 2
    return node("cube", "Tesla-V100-SXM2-32GB", 8, nvlink=tuple(tuple(row) for row in matrix))


@pytest.mark.parametrize(
    "policy", [gpupack(), baseline("kube-default", topology_sets=True)], ids=["gpupack", "kube-default+sets"]
)
def test_on_a_tie_the_set_whose_every_pair_is_nvlinked_wins(policy: PolicySpec) -> None:
    """#15 item 4: among GPU sets of equal affinity, the fully NVLinked one (kernel and reference both)."""
    cluster = Cluster(cube_mesh(), policy=policy)
    cluster.inventory.commit(Placement("cube", (GpuSlot(0),)))
    facts = cluster.inventory.facts[0]
    assert facts is not None and facts.nvlink is not None
    links = facts.nvlink
    affinity = {
        gpus: sum(100 * links[a][b] + 20 for a, b in itertools.combinations(gpus, 2))
        for gpus in ((4, 5, 6, 7), (1, 2, 5, 6))
    }
    assert affinity[(4, 5, 6, 7)] == affinity[(1, 2, 5, 6)]  # the tie the rule breaks
    assert gpus_of(cluster.place(whole(4))) == {4, 5, 6, 7}


# ----------------------------------------------------------------------------- spot


def spot_pair() -> tuple[NodeFacts, NodeFacts]:
    return node("spot", H100, 8, spot=True), node("ondemand", H100, 8)


def test_interruptible_pods_prefer_spot_and_others_avoid_it() -> None:
    cluster = Cluster(*spot_pair())
    assert cluster.decide(whole(1, interruptible=True)).node == "spot"
    assert cluster.decide(whole(1)).node == "ondemand"
    ondemand_only = Cluster(node("spot", H100, 8, spot=True))
    assert ondemand_only.decide(whole(1)).node == "spot"  # only a preference by default


def test_forbidden_spot_gets_its_own_verdict() -> None:
    policy = gpupack(GpupackArgs(forbid_spot_for_non_interruptible=True))
    cluster = Cluster(*spot_pair(), policy=policy)
    decision = cluster.decide(whole(1))
    spot_row = cluster.inventory.index["spot"]
    assert decision.verdicts[spot_row] == k.SPOT_FORBIDDEN
    assert decision.reasons() == {"spot": "spot node and the pod is not interruptible"}
    assert decision.node == "ondemand"
    assert cluster.decide(whole(1, interruptible=True)).node == "spot"


# ----------------------------------------------------------------------------- model fit

DYN = MigMode.DYNAMIC
h200_and_a30 = (node("h200", "NVIDIA-H200", 1, DYN), node("a30", "NVIDIA-A30", 1, DYN))


def test_smaller_model_wins_when_both_fit() -> None:
    # MIG resource names are per profile (nvidia.com/mig-1g.6gb vs -1g.18gb), so no single MIG
    # request can land on both an A30 and an H200: the whole-GPU pod shows the A30-over-H200
    # preference, and 1g.10gb (a profile of both A100-40GB and H100-80GB) shows it for MIG.
    cluster = Cluster(
        node("h200", "NVIDIA-H200", 1, MigMode.DYNAMIC), node("a30", "NVIDIA-A30", 1, MigMode.DYNAMIC)
    )
    assert cluster.decide(whole(1)).node == "a30"
    cluster = Cluster(
        node("h100", H100, 1, MigMode.DYNAMIC), node("a100", "NVIDIA-A100-SXM4-40GB", 1, MigMode.DYNAMIC)
    )
    assert cluster.decide(mig("1g.10gb")).node == "a100"


def test_1g_slices_of_a30_and_h200_each_by_name() -> None:
    cluster = Cluster(
        node("h200", "NVIDIA-H200", 1, MigMode.DYNAMIC), node("a30", "NVIDIA-A30", 1, MigMode.DYNAMIC)
    )
    a30 = cluster.decide(mig("1g.6gb"))
    assert a30.node == "a30" and a30.verdicts[cluster.inventory.index["h200"]] == k.NO_PROFILE
    h200 = cluster.decide(mig("1g.18gb"))
    assert h200.node == "h200" and h200.verdicts[cluster.inventory.index["a30"]] == k.NO_PROFILE


def test_allowed_products_exclude_other_models() -> None:
    cluster = Cluster(node("h200", "NVIDIA-H200", 1), node("a30", "NVIDIA-A30", 1))
    decision = cluster.decide(whole(1, allowed_products=frozenset({"NVIDIA-H200"})))
    assert decision.node == "h200"
    assert decision.verdicts[cluster.inventory.index["a30"]] == k.MODEL_NOT_ALLOWED


def test_same_candidates_follow_their_names_to_new_rows() -> None:
    """The engine keeps the last candidate mask; a node leaving and coming back on another row must
    not leave the mask pointing at the row's new owner."""
    cluster = Cluster(node("a", H100, 8), node("b", H100, 8))
    candidates = ("a",)
    assert cluster.engine.decide(whole(1), candidates).node == "a"
    cluster.inventory.remove_node("a")
    cluster.inventory.add_node(node("x", H100, 8))  # reuses a's row
    cluster.inventory.add_node(node("a", H100, 8))  # a new row
    decision = cluster.engine.decide(whole(1), candidates)
    assert decision.node == "a"
    assert decision.rows.tolist() == [cluster.inventory.index["a"]]
