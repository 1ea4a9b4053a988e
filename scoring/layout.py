"""The numba kernels' data layout: every code, column and unit that `scoring.kernels` shares with its callers.

`scoring.engine` packs the inventory's arrays into plain tuples in the column order below, and the
kernels read each array by its column name (`nodes[NODE_CPU_FREE]`); a column constant is a
compile-time constant to numba, so naming a column costs nothing. Everything is defined once, here.

Capacity unit: one GPU = 7000 units, so a milli-share is 7 units and a MIG compute slice is 1000
units on 7-slice GPUs (1750 on the 4-slice A30): every quantity stays an exact integer.
"""

from __future__ import annotations

from enum import IntEnum

from gpupack.errors import GpupackError
from gpupack.scoring.facts import MigMode
from gpupack.scoring.request import MAX_GPUS_PER_NODE, Kind

UNIT = 7000  # capacity units of one GPU
MILLI_UNIT = 7  # units of one thousandth of a GPU
MAX_GPUS = MAX_GPUS_PER_NODE  # GPU rows reserved per node: node n owns rows n * MAX_GPUS ..
MAX_SPEC_CPU = 128000.0  # normalisers of the ATC'23 baselines' scores: 128 cores, 8 GPUs
MAX_SPEC_GPU = 8000.0

# request kinds (`scoring.request.Kind`) and MIG modes (`scoring.facts.MigMode`) as the kernels see them
KIND_NONE, KIND_WHOLE, KIND_SHARE, KIND_MIG = 0, 1, 2, 3
MODE_NONE, MODE_STATIC, MODE_DYNAMIC = 0, 1, 2

# policy ids (`PolicySpec.kernel_id`): one row each of `scoring.policies.POLICY_TABLE`
P_GPUPACK, P_RANDOM, P_DOT, P_CLUSTER, P_PACKING, P_BESTFIT, P_FGD, P_KUBE, P_FIRSTFIT = range(9)

# `policy`: a policy reaches the kernels as its row of the policy table, two vectors: `rules` (ints,
# how it picks among a node's GPUs) and `weights` (floats, what its score adds up); no kernel reads a P_* id
POLICY_RULES, POLICY_WEIGHTS = range(2)
# rules: measures fragmentation (FGD) before and after; how a share's GPU is picked; how a MIG
# instance's GPU and start are picked; multi-GPU sets by NVLink topology; spot nodes refused to
# pods that are not interruptible
RULE_FRAG, RULE_SHARE, RULE_MIG, RULE_SETS, RULE_SPOT_FORBID = range(5)
N_RULES = 5
# picks (RULE_SHARE, RULE_MIG): the first option; best fit (share: the tightest GPU, MIG: the fullest);
# a draw from the per-node noise (share only); least fragmentation after, then best fit (gpupack's
# shares); the highest FGD score (share only); the fullest GPU, then least fragmentation after among
# its placements (gpupack's MIG instances: a lightly used GPU stays light, so departures empty it for a
# large instance, while the instance's start on its GPU still keeps the larger profiles' places free)
PICK_FIRST, PICK_BEST_FIT, PICK_RANDOM, PICK_LEAST_FRAG, PICK_FGD, PICK_FULLEST_LEAST_FRAG = range(6)

# weights: a feasible node's score is the sum of weight * part over its parts with a non-zero weight,
# added in this column order (`kernels.weighted_part` and `reference.weighted_parts` define each part):
# gpupack's (expected fragmentation added, GPUs used after, NVLink rating of a set, GPU memory of the
# model, spot for interruptible pods, spot for the others, price of an idle node), then one per baseline
(W_FRAG, W_PACK, W_TOPO, W_MODEL, W_SPOT, W_SPOT_AVOID, W_COST, W_FGD, W_BESTFIT, W_DOT, W_CLUSTER, W_GPU_PACKING,
 W_KUBE) = range(13)  # fmt: skip
N_PARTS = 13
# after the parts: the weight of the rank term (subtracted outside the memo: gpupack's consolidation)
# and the step fragmentation growth is rounded to (GPUs; 0: not rounded); then the weight of what a share
# adds to the fragmentation after it under PICK_LEAST_FRAG (`kernels.share_slack`): the milli its GPU
# is left with beyond the largest share type of the mix that still fits there; then the weight W_FRAG
# has for a MIG request (MIG churn wants more of it than shares and whole GPUs do); last, W_ORDER's
# counterpart for a MIG request
W_ORDER, FRAG_STEP, W_SHARE_SLACK, W_MIG_FRAG, W_MIG_ORDER = range(N_PARTS, N_PARTS + 5)
N_WEIGHTS = N_PARTS + 5
# the rank term is W_ORDER * rank / max(nodes, ORDER_MIN_NODES): it spans W_ORDER GPUs over a large
# cluster, and in a small one a rank step stays small beside model fit, topology and price. For a MIG
# request it is W_MIG_ORDER * rank / max(nodes, MIG_ORDER_MIN_NODES): the same span from 16 nodes up,
# as a fixed step outweighs fragmentation on a large cluster (docs/packing-experiments.md: round 5b
# found that, round 5c chose this span)
ORDER_MIN_NODES, MIG_ORDER_MIN_NODES = 100, 16
# what `gpupack explain` calls each part (the two spot parts never apply together)
PART_NAMES = ("fragmentation", "packing", "topology", "model_fit", "spot", "spot", "cost", "fgd", "best-fit",
              "dot-product", "gpu-clustering", "gpu-packing", "kube-default")  # fmt: skip

# verdict codes per node (0 = feasible); from FIRST_UNRESOLVABLE on, what the node lacks whatever runs on
# it (no preemption can help): MIG asked of a node without MIG, a MIG profile its model does not have,
# more GPUs than it has
OK, NOT_CANDIDATE, NO_CPU, NO_MEMORY, NO_POD_SLOT, MODEL_NOT_ALLOWED, NO_GPU, NO_MIG, SPOT_FORBIDDEN = range(9)
NOT_MIG, NO_PROFILE, TOO_FEW_GPUS = range(9, 12)
FIRST_UNRESOLVABLE, N_VERDICTS = NOT_MIG, 12

# `nodes`: per node row n (N rows); tags is [N * (MAX_GPUS + 1)]: pods per GPU tag (GpuClustering); class:
# nodes of one class have the same hardware, capacity, price and spot (`Inventory.node_class`), so while
# nothing runs on them they get the same verdict and score
(NODE_ACTIVE, NODE_CPU_FREE, NODE_MEM_FREE, NODE_PODS_FREE, NODE_MODEL, NODE_MIG_MODE, NODE_GPU_COUNT, NODE_SPOT,
 NODE_PRICE, NODE_CPU_CAP, NODE_MEM_CAP, NODE_PODS_CAP, NODE_TAGS, NODE_VERSION, NODE_CLASS) = range(15)  # fmt: skip

# `gpus`: per GPU row (N * MAX_GPUS rows): free milli, taken whole, dynamic MIG memory-slice mask and
# compute slices in use, +me marker (dynamic: 1 while a +me instance exists; static: placement-id mask
# of the +me instances), static MIG placement-id masks of the instances that exist and of those in use,
# NUMA node; link is [N * MAX_GPUS * MAX_GPUS]: NVLink count from GPU row g to each peer of its node
(GPU_MILLI, GPU_WHOLE, GPU_SLICES, GPU_COMPUTE, GPU_ME, GPU_STATIC, GPU_STATIC_USED, GPU_NUMA,
 GPU_LINK) = range(9)  # fmt: skip

# `models`: per GPU model id: memory (MiB), compute slices of a whole GPU (7, or 4 on A30)
MODEL_MEMORY, MODEL_COMPUTE = range(2)

# `request`: (scalars[7], MIG shape per instance and model [I, M], +me per instance [I], allowed model ids [M])
REQUEST_SCALARS, REQUEST_SHAPES, REQUEST_ME, REQUEST_ALLOWED = range(4)
# request scalars: kind, CPU milli, memory bytes, whole GPUs, milli of a share, interruptible, MIG instances
REQ_KIND, REQ_CPU, REQ_MEMORY, REQ_GPUS, REQ_MILLI, REQ_INTERRUPTIBLE, REQ_INSTANCES = range(7)
N_REQ = 7

# `mix` (`WorkloadMix.arrays`): weight[T], task ints [T, 5], MIG shape per model [T, M], allowed per model [T, M]
MIX_WEIGHT, MIX_TASK, MIX_SHAPE, MIX_ALLOWED = range(4)
# columns of the task ints
TASK_KIND, TASK_CPU, TASK_MEMORY, TASK_GPUS, TASK_MILLI = range(5)

# `cache`: per node, kept while the node's version is unchanged: version stamp, per task type the units
# the type cannot use and the GPUs that can host one unit of it [N, T], fragmentation and the weights
# version it was computed for, free units, mask of untouched plain GPUs, mask of plain GPUs, best k-GPU
# set [N, MAX_GPUS + 1] and its topology rating (-1: not computed), whether nothing runs on the node
# (pristine); last, the current weights version
(CACHE_STAMP, CACHE_UNUSABLE, CACHE_HOSTS, CACHE_FRAG, CACHE_WEIGHTS_STAMP, CACHE_FREE, CACHE_FREE_MASK,
 CACHE_PLAIN_MASK, CACHE_SET, CACHE_TOPO, CACHE_PRISTINE, CACHE_WEIGHTS_VERSION) = range(12)  # fmt: skip

# `memo`: per node: version stamp, epoch, verdict, score before the rank term; then the current
# epoch [1] and the candidates' (highest price, largest GPU memory) it was for [2]; then per node class
# (NODE_CLASS) the epoch, verdict and score of a pristine node of that class
(MEMO_STAMP, MEMO_EPOCH, MEMO_VERDICT, MEMO_SCORE, MEMO_CURRENT, MEMO_MAXIMA, MEMO_CLASS_EPOCH, MEMO_CLASS_VERDICT,
 MEMO_CLASS_SCORE) = range(9)  # fmt: skip

# `scratch` (`kernels.make_scratch`): sums of the node being changed [1, T] twice, its GPUs' state
# [LOCAL_ROWS, MAX_GPUS], the current node's placement (GPU, MIG start, shape per slot), the ideal
# GPU set, best_gpu_set's scratch [MAX_GPUS] and [MAX_GPUS * MAX_GPUS], node_summary's per-GPU terms
# [MAX_GPUS, T] twice
(SCRATCH_UNUSABLE, SCRATCH_HOSTS, SCRATCH_LOCAL, SCRATCH_GPU, SCRATCH_START, SCRATCH_SHAPE, SCRATCH_IDEAL_SET,
 SCRATCH_FREE_IDX, SCRATCH_PAIRS, SCRATCH_GPU_UNUSABLE, SCRATCH_GPU_HOSTS) = range(11)  # fmt: skip
# rows of the scratch copy of a node's GPU state
LOCAL_MILLI, LOCAL_WHOLE, LOCAL_SLICES, LOCAL_COMPUTE, LOCAL_ME, LOCAL_STATIC_USED = range(6)
LOCAL_ROWS = 6

# `out`: per node score [N] and verdict [N]; the chosen node's GPU, MIG start and shape per slot
OUT_SCORE, OUT_VERDICT, OUT_GPU, OUT_START, OUT_SHAPE = range(5)


class LayoutError(GpupackError, RuntimeError):
    """The kernels' integer codes disagree with the enums they stand for."""


def check_codes(pairs: dict[str, tuple[int, IntEnum]]) -> None:
    """Raise LayoutError unless every kernel code equals its enum member (`name: (code, member)`)."""
    wrong = [f"{name} = {code}, but {member!r}" for name, (code, member) in pairs.items() if code != int(member)]
    if wrong:
        raise LayoutError("kernel codes out of step with the enums: " + "; ".join(wrong))


CODES: dict[str, tuple[int, IntEnum]] = {
    "KIND_NONE": (KIND_NONE, Kind.NONE),
    "KIND_WHOLE": (KIND_WHOLE, Kind.WHOLE),
    "KIND_SHARE": (KIND_SHARE, Kind.SHARE),
    "KIND_MIG": (KIND_MIG, Kind.MIG),
    "MODE_NONE": (MODE_NONE, MigMode.NONE),
    "MODE_STATIC": (MODE_STATIC, MigMode.STATIC),
    "MODE_DYNAMIC": (MODE_DYNAMIC, MigMode.DYNAMIC),
}

def check_enums_covered() -> None:
    """Raise LayoutError when an enum has a member the kernels have no code for."""
    for enum in (Kind, MigMode):
        missing = [member for member in enum if all(m is not member for _, m in CODES.values())]
        if missing:
            raise LayoutError(f"no kernel code for {missing}")


check_codes(CODES)
check_enums_covered()
