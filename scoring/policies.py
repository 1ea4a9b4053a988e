"""Scheduling policies: typed, documented arguments and what the kernels need to run them.

Every policy is one row of `POLICY_TABLE`: how it picks a GPU for a share and for a MIG
instance (PICK_* rules), whether it measures fragmentation, and the weight of each score part it adds
up (`scoring.layout` W_* columns); gpupack's weights are `GpupackWeights`. The engine knows a policy
only through `PolicySpec`: that row as two vectors (`rules`, `params`), the workload mix it measures
fragmentation against, and how ties between nodes are broken.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from gpupack.scoring import layout as k  # the kernels' codes and columns
from gpupack.scoring.layout import (
    PICK_BEST_FIT,
    PICK_FGD,
    PICK_FIRST,
    PICK_FULLEST_LEAST_FRAG,
    PICK_LEAST_FRAG,
    PICK_RANDOM,
)
from gpupack.scoring.mix import LearnedMix, WorkloadMix, default_prior, empty_mix


class TieBreak(StrEnum):
    """How equal scores are resolved: a seeded order fixed per run, or a fresh draw per pod."""

    FIXED = "fixed"
    PER_POD = "per-pod"


class GpupackWeights(BaseModel):
    """Weights of the `gpupack` score; every term is in [0, 1] or in GPUs, higher score is better.

    score = -fragmentation * (expected fragmentation added, GPUs; mig_fragmentation for a MIG request)
            + packing * (node GPU use after placement, 0..1)   (busy nodes first: idle ones can drain)
            - order * (rank of the node in a fixed order / max(nodes, 100))  (keep filling the same nodes;
                       mig_order * rank / max(nodes, 16) for a MIG request)
            + topology * (NVLink quality of a multi-GPU set, 0..1: 3/4 share of NVLinked pairs,
                          1/4 affinity against the best set the node could offer)
            - model_fit * (GPU memory of the node's model / largest in the cluster)
            + spot (interruptible pods on spot nodes) - spot_avoid (the others on spot nodes)
            - price * (price of the node / highest among candidates), when the pod is the node's first:
              a busy node costs nothing more, an idle one is switched on

    The field names are the ones of the service config (`policy.weights`, camelCase there).
    """

    model_config = ConfigDict(extra="forbid")

    fragmentation: float = Field(1.5, ge=0, description="expected fragmentation growth (FGD, learned mix)")
    packing: float = Field(0.05, ge=0, description="prefer nodes that are already busy")
    topology: float = Field(3.0, ge=0, description="NVLink quality of multi-GPU sets")
    model_fit: float = Field(0.2, ge=0, description="prefer smaller GPU models that fit")
    spot: float = Field(0.5, ge=0, description="spot affinity of interruptible pods")
    spot_avoid: float = Field(5.0, ge=0, description="non-interruptible pods on spot: only when little else fits")
    price: float = Field(1.0, ge=0, description="avoid switching on expensive idle nodes")
    order: float = Field(3.2, ge=0, description="prefer nodes early in a fixed order (consolidation), in GPUs")
    frag_step: float = Field(0.0, ge=0, description="round fragmentation growth to this many GPUs")
    share_slack: float = Field(
        0.5, ge=0, description="fragmentation per milli a share leaves beyond the largest share type that fits"
    )
    mig_fragmentation: float = Field(5.0, ge=0, description="`fragmentation` for MIG requests")
    mig_order: float = Field(1.0, ge=0, description="`order` for MIG requests, over max(nodes, 16)")


class GpupackArgs(BaseModel):
    """Arguments of the `gpupack` policy."""

    model_config = ConfigDict(extra="forbid")

    weights: GpupackWeights = GpupackWeights()
    forbid_spot_for_non_interruptible: bool = False
    mix_half_life: float = Field(2000.0, gt=0, description="requests after which a shape's weight halves")
    mix_coverage: float = Field(0.95, gt=0, le=1, description="share of the mix kept as typical types")
    mix_prior_weight: float = Field(1.0, ge=0, description="pseudo-requests spread over the prior shapes")
    mix_gpu_weight: float = Field(0.0, ge=0, description="extra weight per whole GPU a request asks for")
    mix_with_memory: bool = Field(True, description="tell task types apart by memory request too")
    mix_whole_weight: float = Field(0.5, gt=0, description="weight of a whole-GPU request in the mix")


@dataclass
class PolicySpec:
    """What the engine needs to run one policy: its row of `POLICY_TABLE`, with the weights filled in."""

    name: str
    kernel_id: int  # P_*: names the policy (the kernels read only `rules` and `params`)
    params: np.ndarray  # float weights of the score parts and settings, by `scoring.layout` W_* column
    mix: WorkloadMix
    tie_break: TieBreak
    learns: bool = False  # feed every decided request to the mix
    rules: np.ndarray = field(default_factory=lambda: np.zeros(k.N_RULES, dtype=np.int64))  # by RULE_* column

    @property
    def kernel_policy(self) -> tuple[np.ndarray, np.ndarray]:
        """The kernels' `policy` argument (`scoring.layout.POLICY_*`)."""
        return self.rules, self.params


@dataclass(frozen=True)
class PolicyRow:
    """One policy of the table: how it picks among a node's GPUs, and what its score adds up.

    `share` and `mig` are PICK_* rules; `fragmentation` measures FGD's fragmentation before and after
    (PICK_LEAST_FRAG, PICK_FGD and the W_FRAG / W_FGD parts need it); `parts` weighs score parts
    (W_* column: weight); gpupack's weights come from `GpupackWeights` instead.
    """

    kernel_id: int
    share: int
    mig: int
    fragmentation: bool
    parts: dict[int, float]
    tie_break: TieBreak = TieBreak.FIXED

    def __post_init__(self) -> None:
        frag_rules = {self.share, self.mig} & {PICK_LEAST_FRAG, PICK_FGD, PICK_FULLEST_LEAST_FRAG}
        if not self.fragmentation and (frag_rules or {k.W_FRAG, k.W_FGD} & set(self.parts)):
            raise ValueError(f"policy {self.kernel_id}: a fragmentation rule without measuring fragmentation")
        if self.mig in {PICK_RANDOM, PICK_FGD}:
            raise ValueError(f"policy {self.kernel_id}: PICK_RANDOM and PICK_FGD pick shares only")
        if self.share == PICK_FULLEST_LEAST_FRAG:
            raise ValueError(f"policy {self.kernel_id}: PICK_FULLEST_LEAST_FRAG picks MIG instances only")


# Every policy, one row each: this table is the only place a policy's behaviour is chosen; the kernels
# and the reference switch on its rules and sum its weights, never on its name. Ties go to a seeded
# node order fixed for the run: the ATC'23 simulator names nodes with a seeded random prefix and its
# results are reproduced with that order; `random` draws anew for every pod.
POLICY_TABLE: dict[str, PolicyRow] = {
    #                    id             share            MIG              frag   score parts
    "gpupack": PolicyRow(k.P_GPUPACK, PICK_LEAST_FRAG, PICK_FULLEST_LEAST_FRAG, True, {}),  # weights: GpupackWeights
    "random": PolicyRow(k.P_RANDOM, PICK_RANDOM, PICK_BEST_FIT, False, {}, TieBreak.PER_POD),
    "dot-product": PolicyRow(k.P_DOT, PICK_BEST_FIT, PICK_BEST_FIT, False, {k.W_DOT: 1.0}),
    "gpu-clustering": PolicyRow(k.P_CLUSTER, PICK_BEST_FIT, PICK_BEST_FIT, False, {k.W_CLUSTER: 1.0}),
    "gpu-packing": PolicyRow(k.P_PACKING, PICK_BEST_FIT, PICK_BEST_FIT, False, {k.W_GPU_PACKING: 1.0}),
    "best-fit": PolicyRow(k.P_BESTFIT, PICK_BEST_FIT, PICK_BEST_FIT, False, {k.W_BESTFIT: 1.0}),
    "kube-default": PolicyRow(k.P_KUBE, PICK_FIRST, PICK_FIRST, False, {k.W_KUBE: 1.0}),
    "first-fit": PolicyRow(k.P_FIRSTFIT, PICK_FIRST, PICK_FIRST, False, {}),
    "fgd": PolicyRow(k.P_FGD, PICK_FGD, PICK_BEST_FIT, True, {k.W_FGD: 1.0}),
}
POLICY_NAMES = tuple(POLICY_TABLE)


def _spec(
    name: str, row: PolicyRow, weights: dict[int, float], mix: WorkloadMix, learns: bool = False, **rules: int
) -> PolicySpec:
    """A PolicySpec from a table row, its weights (W_* column: value) and the rules besides the row's."""
    params = np.zeros(k.N_WEIGHTS, dtype=np.float64)
    for column, value in weights.items():
        params[column] = value
    rule_values = np.zeros(k.N_RULES, dtype=np.int64)
    rule_values[k.RULE_FRAG] = row.fragmentation
    rule_values[k.RULE_SHARE] = row.share
    rule_values[k.RULE_MIG] = row.mig
    for rule, value in rules.items():
        rule_values[getattr(k, rule)] = value
    return PolicySpec(name, row.kernel_id, params, mix, row.tie_break, learns=learns, rules=rule_values)


def gpupack(args: GpupackArgs | None = None) -> PolicySpec:
    """The gpupack policy: fragmentation against a learned mix, packing, topology, model fit, cost."""
    args = args or GpupackArgs()
    w = args.weights
    weights = {
        k.W_FRAG: w.fragmentation,
        k.W_PACK: w.packing,
        k.W_TOPO: w.topology,
        k.W_MODEL: w.model_fit,
        k.W_SPOT: w.spot,
        k.W_SPOT_AVOID: w.spot_avoid,
        k.W_COST: w.price,
        k.FRAG_STEP: w.frag_step,
        k.W_ORDER: w.order,
        k.W_SHARE_SLACK: w.share_slack,
        k.W_MIG_FRAG: w.mig_fragmentation,
        k.W_MIG_ORDER: w.mig_order,
    }
    mix = LearnedMix(
        default_prior(),
        prior_weight=args.mix_prior_weight,
        half_life=args.mix_half_life,
        coverage=args.mix_coverage,
        gpu_weight=args.mix_gpu_weight,
        with_memory=args.mix_with_memory,
        whole_weight=args.mix_whole_weight,
    )
    spot_forbid = int(args.forbid_spot_for_non_interruptible)
    row = POLICY_TABLE["gpupack"]
    return _spec("gpupack", row, weights, mix, learns=True, RULE_SETS=1, RULE_SPOT_FORBID=spot_forbid)


def fgd(oracle: WorkloadMix) -> PolicySpec:
    """FGD (ATC'23) with its oracle mix (the trace's most frequent shapes)."""
    row = POLICY_TABLE["fgd"]
    return _spec("fgd", row, row.parts, oracle)


def baseline(name: str, topology_sets: bool = False) -> PolicySpec:
    """One of the baselines that need no mix; `topology_sets` picks multi-GPU sets go-gpuallocator style."""
    row = POLICY_TABLE.get(name)
    if row is None or row.fragmentation:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    label = f"{name}+besteffort" if topology_sets else name
    return _spec(label, row, row.parts, empty_mix(), RULE_SETS=int(topology_sets))
