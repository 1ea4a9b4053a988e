"""How an assignment is split between a pod's containers (agent.claims): containers in order, init first."""

from __future__ import annotations

from gpupack.agent.claims import claims_for
from gpupack.scoring.facts import GpuSlot
from tests.agent.conftest import NODE, make_pod

GPU, MILLI, MIG_1G = "nvidia.com/gpu", "gpupack.io/gpu-milli", "nvidia.com/mig-1g.10gb"


def _split(pod: dict, resource: str) -> dict[str, tuple[GpuSlot, ...]]:
    return {claim.container: claim.slots for claim in claims_for([pod], NODE, resource).claims}


def test_containers_take_the_slots_in_order() -> None:
    pod = make_pod("p", [{GPU: 2}, {GPU: 1}], [{"index": 3}, {"index": 1}, {"index": 0}])
    assert _split(pod, GPU) == {"c0": (GpuSlot(3), GpuSlot(1)), "c1": (GpuSlot(0),)}


def test_an_init_container_takes_the_first_slots_which_later_containers_reuse() -> None:
    pod = make_pod("p", [{GPU: 1}, {GPU: 1}], [{"index": 2}, {"index": 5}], init=[{GPU: 2}])
    assert _split(pod, GPU) == {"init0": (GpuSlot(2), GpuSlot(5)), "c0": (GpuSlot(2),), "c1": (GpuSlot(5),)}


def test_every_share_container_gets_the_one_share_slot_with_its_own_amount() -> None:
    pod = make_pod("p", [{MILLI: 100}, {MILLI: 150}], [{"index": 1, "milli": 250}])
    claims = claims_for([pod], NODE, MILLI).claims
    assert [(c.container, c.amount, c.slots) for c in claims] == [
        ("c0", 100, (GpuSlot(1, milli=250),)), ("c1", 150, (GpuSlot(1, milli=250),))
    ]


def test_mig_slots_are_split_per_resource_and_a_short_assignment_is_a_problem() -> None:
    slots = [{"index": 0, "mig": "1g.10gb", "start": 0}, {"index": 0, "mig": "1g.10gb", "start": 1}]
    pod = make_pod("p", [{MIG_1G: 1}, {MIG_1G: 1}], slots)
    assert _split(pod, MIG_1G) == {"c0": (GpuSlot(0, mig="1g.10gb", start=0),),
                                   "c1": (GpuSlot(0, mig="1g.10gb", start=1),)}
    short = make_pod("s", [{GPU: 1}, {GPU: 2}], [{"index": 0}, {"index": 1}])
    found = claims_for([short], NODE, GPU)
    assert found.claims == () and "ml/s" in found.problems[0]
