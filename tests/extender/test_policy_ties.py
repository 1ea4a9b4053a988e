"""The service decides through the one decider: `random` is random, every other policy keeps row order."""

from __future__ import annotations

import numpy as np
import pytest

from gpupack.extender.settings import Policy, Settings
from gpupack.extender.state import ClusterState
from tests.extender_helpers import node, pod, state_from

NODES = [f"n{i:02d}" for i in range(16)]


def tied_state(policy: str, rng: np.random.Generator | None = None) -> ClusterState:
    """16 identical empty 8-GPU nodes: every policy scores them alike; `rng`: the decider's generator."""
    state = state_from([node(name) for name in NODES], settings=Settings(policy=Policy(name=policy)))
    if rng is not None:
        state.decider.rng = rng
    return state


def filtered(
    state: ClusterState, pods: int, *, gpus: int = 0, milli: int = 0
) -> list[tuple[str | None, tuple[int, ...]]]:
    """(node, GPUs) that filter reserves for each of `pods` identical pods, one after another."""
    out = []
    for i in range(pods):
        chosen, _, _ = state.decide_for_filter(pod(f"p{i}", gpus=gpus, milli=milli), NODES)
        placement = state.placements().get(f"uid-default-p{i}")
        out.append((chosen, tuple(slot.index for slot in placement.slots) if placement else ()))
    return out


def test_random_spreads_identical_pods_over_tied_nodes() -> None:
    nodes = {chosen for chosen, _ in filtered(tied_state("random"), 8, gpus=1)}
    assert len(nodes) > 1  # row order would put all eight on n00


def test_random_picks_a_shares_gpu_by_noise() -> None:
    gpus = {gpus for _, gpus in filtered(tied_state("random"), 10, milli=100)}
    assert len(gpus) > 1  # without noise all ten fill GPU 0 of their node


def test_fresh_services_do_not_all_make_the_same_first_choice() -> None:
    firsts = {filtered(tied_state("random"), 1, gpus=1)[0] for _ in range(8)}
    assert len(firsts) > 1


def test_a_given_generator_reproduces_the_services_random_choices() -> None:
    def run(seed: int) -> list[tuple[str | None, tuple[int, ...]]]:
        return filtered(tied_state("random", np.random.default_rng(seed)), 10, milli=300)

    assert run(3) == run(3)
    assert run(3) != run(4)


@pytest.mark.parametrize("policy", ["gpupack", "best-fit", "first-fit", "kube-default", "gpu-packing"])
def test_other_policies_break_ties_in_row_order(policy: str) -> None:
    first = filtered(tied_state(policy), 1, gpus=1)
    assert first == [("n00", first[0][1])]
    assert filtered(tied_state(policy), 8, gpus=1) == filtered(tied_state(policy, np.random.default_rng(9)), 8, gpus=1)
