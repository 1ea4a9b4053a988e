"""`scoring.explain_parts`: the parts of the gpupack score from the kernel equal the reference's terms."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpupack.extender.settings import Policy, Settings
from gpupack.extender.state import ClusterState
from gpupack.kube.sources import ClusterFileSource
from gpupack.scoring.explain_parts import score_parts
from gpupack.scoring.policies import GpupackWeights
from gpupack.scoring.reference import reference_decide
from tests.extender_helpers import EXAMPLE_CLUSTER, pod

PODS = {
    "one GPU": pod("p", gpus=1),
    "two GPUs": pod("p", gpus=2),
    "four GPUs, interruptible": pod("p", gpus=4, annotations={"gpupack.io/interruptible": "true"}),
    "a share": pod("p", milli=300),
    "a 1g.10gb instance": pod("p", mig="1g.10gb"),
    "two 3g.40gb instances": pod("p", mig="3g.40gb", mig_count=2),
    "CPU only": pod("p", cpu="4"),
}
WEIGHTS = {
    "defaults": GpupackWeights(),
    "rounded growth, more order and price": GpupackWeights(
        frag_step=0.25, order=0.4, mig_order=2.0, price=2.0, spot=1.5
    ),
}


def example_state(weights: GpupackWeights) -> ClusterState:
    state = ClusterState(Settings(policy=Policy(weights=weights)))
    ClusterFileSource(EXAMPLE_CLUSTER, state.apply).start()
    return state


@pytest.mark.parametrize("weights", WEIGHTS.values(), ids=WEIGHTS.keys())
@pytest.mark.parametrize("obj", PODS.values(), ids=PODS.keys())
def test_parts_equal_the_reference_terms_and_add_up_to_the_score(weights: GpupackWeights, obj: dict[str, Any]) -> None:
    state = example_state(weights)
    evaluation = state.evaluate(obj)
    assert evaluation.request is not None and evaluation.decision is not None
    scores = evaluation.decision.feasible_scores()
    assert scores, "the example cluster takes every one of these pods"
    candidates = np.zeros(state.inventory.size, dtype=np.bool_)
    candidates[evaluation.decision.rows] = True
    parts = score_parts(state.inventory, state.decider.policy, evaluation.request, candidates)
    reference: dict[str, dict[str, float]] = {}
    names = [str(state.inventory.names[row]) for row in evaluation.decision.rows]
    reference_decide(state.inventory, state.decider.policy, evaluation.request, names, parts=reference)
    assert set(parts) == set(scores) == set(reference)
    for node, terms in parts.items():
        assert {"fragmentation", "packing"} <= set(terms)
        for name in {*terms, *reference[node]}:
            assert terms.get(name, 0.0) == pytest.approx(reference[node].get(name, 0.0), abs=1e-12), (node, name)
        total = 0.0
        for value in terms.values():
            total += value  # in the kernel's order of terms
        assert total == pytest.approx(scores[node], abs=1e-12)


def test_other_policies_have_no_parts() -> None:
    state = ClusterState(Settings(policy=Policy(name="best-fit")))
    ClusterFileSource(EXAMPLE_CLUSTER, state.apply).start()
    evaluation = state.evaluate(pod("p", gpus=1))
    assert evaluation.request is not None
    assert score_parts(state.inventory, state.decider.policy, evaluation.request) == {}


def fragmentation_parts(weights: GpupackWeights, obj: dict[str, Any]) -> dict[str, float]:
    state = example_state(weights)
    evaluation = state.evaluate(obj)
    assert evaluation.request is not None
    parts = score_parts(state.inventory, state.decider.policy, evaluation.request)
    return {node: terms["fragmentation"] for node, terms in parts.items()}


def test_mig_requests_weigh_fragmentation_by_their_own_weight() -> None:
    mig, share = PODS["a 1g.10gb instance"], PODS["a share"]
    base = fragmentation_parts(GpupackWeights(), mig)
    assert any(value != 0.0 for value in base.values()), "some node's fragmentation grows: the check can fail"
    assert fragmentation_parts(GpupackWeights(fragmentation=9.0), mig) == base
    doubled = GpupackWeights(mig_fragmentation=2 * GpupackWeights().mig_fragmentation)
    assert fragmentation_parts(doubled, mig) == {node: 2 * value for node, value in base.items()}
    assert fragmentation_parts(doubled, share) == fragmentation_parts(GpupackWeights(), share)
