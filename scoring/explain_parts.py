"""The parts of the `gpupack` score of every feasible node, computed by the engine's own kernel.

The gpupack score is a sum of terms, each one weight times a quantity that no weight changes: the
placement a node would get is chosen by fragmentation (shares, MIG) or NVLink quality (GPU sets),
never by the weights, and so are the verdicts. Running the kernel once per term, with every other
weight set to zero, therefore yields that term alone, bit for bit as the full score adds it; added
up in the kernel's order the parts give its score exactly. `gpupack explain` shows them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from gpupack.scoring.engine import Engine
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.layout import (
    P_GPUPACK,
    W_COST,
    W_FRAG,
    W_MIG_FRAG,
    W_MIG_ORDER,
    W_MODEL,
    W_ORDER,
    W_PACK,
    W_SPOT,
    W_SPOT_AVOID,
    W_TOPO,
)
from gpupack.scoring.policies import PolicySpec
from gpupack.scoring.request import Kind, PodRequest

# each part of the score and the weights it is made of, in the order the kernel adds them
SCORE_PARTS: dict[str, tuple[int, ...]] = {
    "fragmentation": (W_FRAG, W_MIG_FRAG),
    "packing": (W_PACK,),
    "topology": (W_TOPO,),
    "model_fit": (W_MODEL,),
    "spot": (W_SPOT, W_SPOT_AVOID),
    "cost": (W_COST,),
    "order": (W_ORDER, W_MIG_ORDER),
}
ALWAYS_SHOWN = ("fragmentation", "packing")  # the other parts are shown when they count


def score_parts(
    inventory: Inventory,
    policy: PolicySpec,
    request: PodRequest,
    candidates: Sequence[str] | np.ndarray | None = None,
    rank: np.ndarray | None = None,
) -> dict[str, dict[str, float]]:
    """Node name -> {part: value} for every feasible candidate of `request` under the gpupack `policy`
    (empty for other policies), the arguments as `Engine.decide` takes them. Changes nothing.

    A part is listed when it is nonzero, or always for fragmentation and packing, and topology for
    requests of several whole GPUs (it is rated then, even when it rates 0).
    """
    if policy.kernel_id != P_GPUPACK:
        return {}
    every_weight = [index for indices in SCORE_PARTS.values() for index in indices]
    parts: dict[str, dict[str, float]] = {}
    for part, indices in SCORE_PARTS.items():
        params = policy.params.copy()
        params[[index for index in every_weight if index not in indices]] = 0.0
        # a fresh engine: the caller's keeps its caches and memo for its own weights
        decision = Engine(inventory, replace(policy, params=params)).decide(request, candidates, rank=rank)
        for node, value in decision.feasible_scores().items():
            if value != 0.0 or part in _shown_anyway(request):
                parts.setdefault(node, {})[part] = value + 0.0  # -0.0 reads as 0.0
    order = list(SCORE_PARTS)
    return {node: dict(sorted(terms.items(), key=lambda kv: order.index(kv[0]))) for node, terms in parts.items()}


def _shown_anyway(request: PodRequest) -> tuple[str, ...]:
    if request.kind == Kind.WHOLE and request.gpus > 1:
        return (*ALWAYS_SHOWN, "topology")
    return ALWAYS_SHOWN
