"""The rank term (consolidation): `order` over at least 100 nodes, `mig_order` over at least 16."""

from __future__ import annotations

import numpy as np
import pytest

from gpupack.scoring.engine import Engine
from gpupack.scoring.facts import MigMode, NodeFacts
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.layout import MIG_ORDER_MIN_NODES, ORDER_MIN_NODES
from gpupack.scoring.policies import GpupackArgs, GpupackWeights, gpupack
from gpupack.scoring.reference import reference_decide
from gpupack.scoring.request import Kind, PodRequest

GIB = 1 << 30
H100 = "NVIDIA-H100-80GB-HBM3"
WEIGHTS = GpupackWeights(order=2.0, mig_order=0.7)
REQUESTS = {
    "MIG": (PodRequest(cpu_milli=100, kind=Kind.MIG, mig=(("1g.10gb", 1),)), WEIGHTS.mig_order, MIG_ORDER_MIN_NODES),
    "one GPU": (PodRequest(cpu_milli=100, kind=Kind.WHOLE, gpus=1), WEIGHTS.order, ORDER_MIN_NODES),
}


def mig_nodes(count: int) -> Inventory:
    """`count` identical empty nodes of 8 H100s in dynamic MIG mode: only the rank tells them apart."""
    inventory = Inventory()
    for i in range(count):
        inventory.add_node(
            NodeFacts(f"n{i:03d}", 64_000, 512 * GIB, gpu_product=H100, gpu_count=8, mig_mode=MigMode.DYNAMIC)
        )
    return inventory


@pytest.mark.parametrize("count", [4, 30, 96, 150])
@pytest.mark.parametrize("kind", REQUESTS, ids=REQUESTS.keys())
def test_a_rank_step_costs_the_weight_over_the_span(count: int, kind: str) -> None:
    request, weight, min_span = REQUESTS[kind]
    inventory = mig_nodes(count)
    policy = gpupack(GpupackArgs(weights=WEIGHTS))
    scores = Engine(inventory, policy).decide(request).scores
    steps = scores[0] - scores
    # MIG: the weight spans the cluster from 16 nodes up; the others from 100
    assert steps == pytest.approx(weight * np.arange(count) / max(count, min_span), abs=1e-12)
    reference = reference_decide(inventory, policy, request).scores
    assert reference == pytest.approx(scores, abs=1e-12)
