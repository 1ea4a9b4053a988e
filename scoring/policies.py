"""Scheduling policies: typed, documented arguments and what the kernels need to run them.

The engine knows a policy only through `PolicySpec`: the kernel policy id, its parameter vector,
the workload mix it measures fragmentation against, and how ties between nodes are broken.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from gpupack.scoring import kernels as k
from gpupack.scoring.mix import LearnedMix, WorkloadMix, default_prior, empty_mix


class TieBreak(StrEnum):
    """How equal scores are resolved: a seeded order fixed per run, or a fresh draw per pod."""

    FIXED = "fixed"
    PER_POD = "per-pod"


class GpupackWeights(BaseModel):
    """Weights of the `gpupack` score; every term is in [0, 1] or in GPUs, higher score is better.

    score = -fragmentation * (expected fragmentation added, GPUs)
            + packing * (node GPU use after placement, 0..1)   (busy nodes first: idle ones can drain)
            - order * (rank of the node in a fixed order / nodes)  (keep filling the same nodes)
            + topology * (NVLink quality of a multi-GPU set, 0..1: 3/4 share of NVLinked pairs,
                          1/4 affinity against the best set the node could offer)
            - model_fit * (GPU memory of the node's model / largest in the cluster)
            + spot (interruptible pods on spot nodes) - spot_avoid (the others on spot nodes)
            - price * (price of the node / highest among candidates), when the pod is the node's first:
              a busy node costs nothing more, an idle one is switched on

    The field names are the ones of the service config (`policy.weights`, camelCase there).
    """

    model_config = ConfigDict(extra="forbid")

    fragmentation: float = Field(1.0, ge=0, description="expected fragmentation growth (FGD, learned mix)")
    packing: float = Field(0.05, ge=0, description="prefer nodes that are already busy")
    topology: float = Field(3.0, ge=0, description="NVLink quality of multi-GPU sets")
    model_fit: float = Field(0.2, ge=0, description="prefer smaller GPU models that fit")
    spot: float = Field(0.5, ge=0, description="spot affinity of interruptible pods")
    spot_avoid: float = Field(5.0, ge=0, description="non-interruptible pods on spot: only when little else fits")
    price: float = Field(1.0, ge=0, description="avoid switching on expensive idle nodes")
    order: float = Field(0.1, ge=0, description="prefer nodes early in a fixed order (consolidation), in GPUs")
    frag_step: float = Field(0.0, ge=0, description="round fragmentation growth to this many GPUs")


class GpupackArgs(BaseModel):
    """Arguments of the `gpupack` policy."""

    model_config = ConfigDict(extra="forbid")

    weights: GpupackWeights = GpupackWeights()
    forbid_spot_for_non_interruptible: bool = False
    mix_half_life: float = Field(2000.0, gt=0, description="requests after which a shape's weight halves")
    mix_coverage: float = Field(0.95, gt=0, le=1, description="share of the mix kept as typical types")
    mix_prior_weight: float = Field(1.0, ge=0, description="pseudo-requests spread over the prior shapes")
    mix_gpu_weight: float = Field(0.0, ge=0, description="extra weight per whole GPU a request asks for")
    mix_with_memory: bool = Field(False, description="tell task types apart by memory request too")


@dataclass
class PolicySpec:
    """What the engine needs to run one policy."""

    name: str
    kernel_id: int
    params: np.ndarray
    mix: WorkloadMix
    tie_break: TieBreak
    learns: bool = False  # feed every decided request to the mix


def _params(**values: float) -> np.ndarray:
    params = np.zeros(k.N_PARAMS, dtype=np.float64)
    for name, value in values.items():
        params[getattr(k, name)] = value
    return params


def gpupack(args: GpupackArgs | None = None) -> PolicySpec:
    """The gpupack policy: fragmentation against a learned mix, packing, topology, model fit, cost."""
    args = args or GpupackArgs()
    w = args.weights
    params = _params(
        W_FRAG=w.fragmentation,
        W_PACK=w.packing,
        W_TOPO=w.topology,
        W_MODEL=w.model_fit,
        W_SPOT=w.spot,
        W_SPOT_AVOID=w.spot_avoid,
        W_COST=w.price,
        FRAG_STEP=w.frag_step,
        W_ORDER=w.order,
        SPOT_FORBID=float(args.forbid_spot_for_non_interruptible),
    )
    mix = LearnedMix(
        default_prior(),
        prior_weight=args.mix_prior_weight,
        half_life=args.mix_half_life,
        coverage=args.mix_coverage,
        gpu_weight=args.mix_gpu_weight,
        with_memory=args.mix_with_memory,
    )
    return PolicySpec("gpupack", k.P_GPUPACK, params, mix, TieBreak.FIXED, learns=True)


def fgd(oracle: WorkloadMix) -> PolicySpec:
    """FGD (ATC'23) with its oracle mix (the trace's most frequent shapes)."""
    return PolicySpec("fgd", k.P_FGD, _params(), oracle, TieBreak.FIXED)


# Ties go to a seeded node order fixed for the run: the ATC'23 simulator names nodes with a seeded
# random prefix and its results are reproduced with that order; `random` draws anew for every pod.
_SIMPLE: dict[str, tuple[int, TieBreak]] = {
    "random": (k.P_RANDOM, TieBreak.PER_POD),
    "dot-product": (k.P_DOT, TieBreak.FIXED),
    "gpu-clustering": (k.P_CLUSTER, TieBreak.FIXED),
    "gpu-packing": (k.P_PACKING, TieBreak.FIXED),
    "best-fit": (k.P_BESTFIT, TieBreak.FIXED),
    "kube-default": (k.P_KUBE, TieBreak.FIXED),
    "first-fit": (k.P_FIRSTFIT, TieBreak.FIXED),
}

POLICY_NAMES = ("gpupack", *(_SIMPLE), "fgd")


def baseline(name: str, topology_sets: bool = False) -> PolicySpec:
    """One of the baselines that need no mix; `topology_sets` picks multi-GPU sets go-gpuallocator style."""
    try:
        kernel_id, tie = _SIMPLE[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}") from None
    label = f"{name}+besteffort" if topology_sets else name
    return PolicySpec(label, kernel_id, _params(TOPO_SETS=float(topology_sets)), empty_mix(), tie)
