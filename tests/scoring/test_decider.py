"""scoring.decider: tie orders, the random policy's noise, fallbacks, and the simulator's draws kept."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from gpupack.scoring.decider import Decider
from gpupack.scoring.engine import Decision, Engine
from gpupack.scoring.facts import NodeFacts
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.layout import P_RANDOM
from gpupack.scoring.policies import PolicySpec, TieBreak, baseline, gpupack
from gpupack.scoring.request import Kind, PodRequest

GIB = 1 << 30
H100 = "NVIDIA-H100-80GB-HBM3"
NODES = 12


def tied_inventory(count: int = NODES, gpus: int = 8) -> Inventory:
    """`count` identical empty nodes n00, n01, ...: every policy scores them alike."""
    inventory = Inventory()
    for i in range(count):
        inventory.add_node(NodeFacts(f"n{i:02d}", 64_000, 512 * GIB, gpu_product=H100, gpu_count=gpus))
    return inventory


def one_gpu() -> PodRequest:
    return PodRequest(cpu_milli=100, kind=Kind.WHOLE, gpus=1)


def share(milli: int = 100) -> PodRequest:
    return PodRequest(cpu_milli=100, kind=Kind.SHARE, milli=milli)


class Calls:
    """Every `Engine.decide` call of one decider: (candidates, rank, noise), and its `observe` calls."""

    def __init__(self, decider: Decider, monkeypatch: pytest.MonkeyPatch) -> None:
        self.decides: list[tuple[Any, np.ndarray | None, np.ndarray | None]] = []
        self.observed: list[PodRequest] = []
        engine = decider.engine
        decide, observe = engine.decide, engine.observe

        def recording_decide(request: PodRequest, candidates: Any = None, rank: Any = None, noise: Any = None):
            self.decides.append((candidates, rank, noise))
            return decide(request, candidates, rank=rank, noise=noise)

        def recording_observe(request: PodRequest) -> None:
            self.observed.append(request)
            observe(request)

        monkeypatch.setattr(engine, "decide", recording_decide)
        monkeypatch.setattr(engine, "observe", recording_observe)


def rng_state(rng: np.random.Generator) -> Any:
    return rng.bit_generator.state


# ----------------------------------------------------------------------------- tie orders


@pytest.mark.parametrize("policy", [baseline("best-fit"), baseline("first-fit"), gpupack()], ids=lambda p: p.name)
def test_fixed_ties_in_inventory_order_draw_nothing(policy: PolicySpec, monkeypatch) -> None:
    rng = np.random.default_rng(1)
    before = rng_state(rng)
    decider = Decider(tied_inventory(), policy, rng)
    calls = Calls(decider, monkeypatch)
    assert decider.decide(one_gpu()).node == "n00"
    assert calls.decides == [(None, None, None)]  # the engine's default: row order, no noise
    assert rng_state(rng) == before


def test_seeded_ties_follow_the_permutation_drawn_from_the_seed() -> None:
    chosen = set()
    for seed in range(6):
        inventory = tied_inventory()
        first = int(np.argmin(np.random.default_rng(seed).permutation(NODES)))
        decider = Decider.seeded(inventory, baseline("best-fit"), seed)
        assert [decider.decide(one_gpu()).node for _ in range(3)] == [f"n{first:02d}"] * 3  # fixed for the run
        chosen.add(first)
    assert len(chosen) > 1


def test_a_seed_of_none_is_seed_zero() -> None:
    nodes = [Decider.seeded(tied_inventory(), baseline("random"), seed).decide(share()).placement for seed in (None, 0)]
    assert nodes[0] == nodes[1]


def test_per_pod_ties_draw_a_fresh_order_for_every_pod(monkeypatch) -> None:
    policy = dataclasses.replace(baseline("best-fit"), tie_break=TieBreak.PER_POD)
    decider = Decider(tied_inventory(), policy, np.random.default_rng(3))
    calls = Calls(decider, monkeypatch)
    nodes = {decider.decide(one_gpu()).node for _ in range(10)}
    assert len(nodes) > 1
    ranks = [rank for _, rank, _ in calls.decides]
    assert all(rank is not None and sorted(rank.tolist()) == list(range(NODES)) for rank in ranks)
    assert len({rank.tobytes() for rank in ranks if rank is not None}) == len(ranks)
    assert all(noise is None for _, _, noise in calls.decides)  # noise is the random policy's only


def test_nodes_added_after_a_seeded_decider_tie_last_in_row_order(monkeypatch) -> None:
    inventory = tied_inventory(3)
    decider = Decider.seeded(inventory, baseline("best-fit"), 7)
    drawn = np.random.default_rng(7).permutation(3).tolist()
    for i in range(3, 6):
        inventory.add_node(NodeFacts(f"n{i:02d}", 64_000, 512 * GIB, gpu_product=H100, gpu_count=8))
    calls = Calls(decider, monkeypatch)
    decider.decide(one_gpu())
    rank = calls.decides[0][1]
    assert rank is not None and rank.tolist() == [*drawn, 3, 4, 5]


# ----------------------------------------------------------------------------- the random policy's noise


def test_random_noise_is_fresh_per_pod(monkeypatch) -> None:
    decider = Decider(tied_inventory(1), baseline("random"), np.random.default_rng(11))
    calls = Calls(decider, monkeypatch)
    gpus = set()
    for _ in range(20):
        placement = decider.decide(share()).placement
        assert placement is not None
        gpus.add(placement.slots[0].index)
    noises = [noise.tobytes() for _, _, noise in calls.decides if noise is not None]
    assert len(noises) == 20 and len(set(noises)) == 20
    assert len(gpus) > 1  # the noise picks the share's GPU


def random_choices(decider: Decider, pods: int = 15) -> list[tuple[str | None, int]]:
    """(node, GPU) of `pods` shares decided and committed one after another."""
    out: list[tuple[str | None, int]] = []
    for _ in range(pods):
        placement = decider.decide(share()).placement
        assert placement is not None
        decider.inventory.commit(placement)
        out.append((placement.node, placement.slots[0].index))
    return out


@pytest.mark.parametrize("seeded", [True, False], ids=["simulator", "service"])
def test_random_choices_are_reproduced_by_the_seed(seeded: bool) -> None:
    def run(seed: int) -> list[tuple[str | None, int]]:
        if seeded:
            return random_choices(Decider.seeded(tied_inventory(), baseline("random"), seed))
        return random_choices(Decider(tied_inventory(), baseline("random"), np.random.default_rng(seed)))

    assert run(5) == run(5)
    assert run(5) != run(6)
    assert len({node for node, _ in run(5)}) > 1


def test_an_unseeded_decider_draws_differently_each_time() -> None:
    firsts = {random_choices(Decider(tied_inventory(), baseline("random")), 1)[0] for _ in range(8)}
    assert len(firsts) > 1


def old_simulator_placements(policy: PolicySpec, seed: int, requests: list[PodRequest]) -> list[Any]:
    """The simulator's decisions as it drew them before the one decider: a permutation at the start; per
    pod a permutation unless ties are FIXED, then noise for the random policy."""
    inventory = tied_inventory()
    engine = Engine(inventory, policy)
    rng = np.random.default_rng(seed)
    fixed = rng.permutation(inventory.size).astype(np.int64)
    out = []
    for request in requests:
        engine.observe(request)
        rank = fixed if policy.tie_break == TieBreak.FIXED else rng.permutation(inventory.size).astype(np.int64)
        noise = rng.random(inventory.size) if policy.kernel_id == P_RANDOM else None
        placement = engine.decide(request, None, rank=rank, noise=noise).placement
        if placement is not None:
            inventory.commit(placement)
        out.append(placement)
    return out


@pytest.mark.parametrize("name", ["random", "best-fit", "best-fit per pod", "gpupack"])
def test_the_simulators_draws_are_kept_bit_for_bit(name: str) -> None:
    def policy() -> PolicySpec:  # a fresh one per run: gpupack learns
        if name == "gpupack":
            return gpupack()
        if name == "best-fit per pod":
            return dataclasses.replace(baseline("best-fit"), tie_break=TieBreak.PER_POD)
        return baseline(name)

    requests = [share(100 * (i % 9 + 1)) if i % 3 else PodRequest(cpu_milli=100, kind=Kind.WHOLE, gpus=1 + i % 4)
                for i in range(60)]  # fmt: skip
    decider = Decider.seeded(tied_inventory(), policy(), 42)
    placements = []
    for request in requests:
        placement = decider.decide(request).placement
        if placement is not None:
            decider.inventory.commit(placement)
        placements.append(placement)
    assert placements == old_simulator_placements(policy(), 42, requests)


# ----------------------------------------------------------------------------- fallbacks, learning, looks


def masks(inventory: Inventory, *rows: list[int]) -> list[np.ndarray]:
    out = []
    for chosen in rows:
        mask = np.zeros(inventory.size, dtype=np.bool_)
        mask[chosen] = True
        out.append(mask)
    return out


def test_fallbacks_are_tried_in_turn_with_one_draw_and_one_observation(monkeypatch) -> None:
    inventory = tied_inventory(4)
    inventory.add_node(NodeFacts("cpu", 64_000, 512 * GIB))  # row 4: no GPU
    decider = Decider(inventory, gpupack(), np.random.default_rng(0))
    calls = Calls(decider, monkeypatch)
    decision = decider.decide(one_gpu(), [*masks(inventory, [4], [2, 3]), None])
    assert decision.node == "n02"
    assert len(calls.decides) == 2 and len(calls.observed) == 1  # the third set is not tried


def test_random_fallbacks_share_one_draw(monkeypatch) -> None:
    inventory = tied_inventory(4)
    inventory.add_node(NodeFacts("cpu", 64_000, 512 * GIB))
    decider = Decider(inventory, baseline("random"), np.random.default_rng(0))
    calls = Calls(decider, monkeypatch)
    decider.decide(one_gpu(), masks(inventory, [4], [0, 1, 2, 3]))
    (_, rank1, noise1), (_, rank2, noise2) = calls.decides
    assert rank1 is rank2 and noise1 is noise2 and rank1 is not None and noise1 is not None


def test_when_no_set_places_the_last_sets_decision_is_returned() -> None:
    inventory = tied_inventory(2)
    inventory.add_node(NodeFacts("cpu", 64_000, 512 * GIB))
    decision: Decision = Decider(inventory, gpupack()).decide(one_gpu(), masks(inventory, [2], [0, 1]))
    assert decision.node == "n00"
    decision = Decider(inventory, gpupack()).decide(PodRequest(cpu_milli=100, kind=Kind.WHOLE, gpus=9),
                                                   masks(inventory, [0], [1]))  # fmt: skip
    assert decision.placement is None and decision.candidates.tolist() == [False, True, False]


def test_observe_false_leaves_the_policy_unlearnt(monkeypatch) -> None:
    decider = Decider(tied_inventory(2), gpupack())
    calls = Calls(decider, monkeypatch)
    decider.decide(one_gpu(), observe=False)
    decider.decide(one_gpu())
    assert len(calls.observed) == 1


def test_look_draws_nothing_and_learns_nothing(monkeypatch) -> None:
    rng = np.random.default_rng(2)
    decider = Decider(tied_inventory(), baseline("random"), rng)
    before = rng_state(rng)
    calls = Calls(decider, monkeypatch)
    assert decider.look(share()).node == decider.look(share()).node == "n00"
    assert rng_state(rng) == before and not calls.observed


def test_candidate_sets_are_not_node_names() -> None:
    decider = Decider(tied_inventory(2), gpupack())
    with pytest.raises(TypeError, match="not node names"):
        decider.decide(one_gpu(), "n01")
    with pytest.raises(ValueError, match="no candidate set"):
        decider.decide(one_gpu(), ())
    assert decider.decide(one_gpu(), (["n01"],)).node == "n01"
