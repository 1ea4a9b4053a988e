"""Plain-Python reference of `scoring.kernels.schedule`: the same answers, computed the obvious way.

The numba kernels keep per-task-type running sums and update them incrementally while they try
placements. This module does none of that: every hypothetical state of a node (a share on this GPU,
a MIG instance at that start, ...) is built as a fresh list of GPU objects and its fragmentation is
summed from scratch. The property tests hold the kernels to this module's verdicts, scores and
placements, so a slip in the incremental bookkeeping shows up as a disagreement.

Scores are computed with the kernels' expression order, so they agree bit for bit: fragmentation
is Σ_t weight[t] * frag_t accumulated in type order, and every frag_t is an exact integer number
of capacity units (one GPU = 7000 units, a milli-share = 7, a MIG compute slice = 7000 / slices).
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from gpupack.scoring import kernels as k
from gpupack.scoring.engine import Decision, RequestArrays, build_placement
from gpupack.scoring.geometry import PLACEMENT_SHAPE, PLACEMENT_START, SHAPES, MigFamily, resolve_profile, slice_bits
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.layout import (
    FRAG_STEP,
    MAX_GPUS,
    MAX_SPEC_CPU,
    MAX_SPEC_GPU,
    MIG_ORDER_MIN_NODES,
    MILLI_UNIT,
    N_PARTS,
    ORDER_MIN_NODES,
    PART_NAMES,
    PICK_FGD,
    PICK_FIRST,
    PICK_FULLEST_LEAST_FRAG,
    PICK_LEAST_FRAG,
    PICK_RANDOM,
    RULE_FRAG,
    RULE_MIG,
    RULE_SETS,
    RULE_SHARE,
    RULE_SPOT_FORBID,
    UNIT,
    W_BESTFIT,
    W_CLUSTER,
    W_COST,
    W_DOT,
    W_FGD,
    W_FRAG,
    W_GPU_PACKING,
    W_KUBE,
    W_MIG_FRAG,
    W_MIG_ORDER,
    W_MODEL,
    W_ORDER,
    W_PACK,
    W_SHARE_SLACK,
    W_SPOT,
    W_SPOT_AVOID,
    W_TOPO,
)
from gpupack.scoring.mix import TaskType
from gpupack.scoring.policies import PolicySpec
from gpupack.scoring.request import MILLI_PER_GPU, Kind, PodRequest


@dataclass(frozen=True)
class Gpu:
    """One GPU's allocation state (immutable: a hypothetical state is a new object)."""

    milli: int  # free thousandths (1000 = untouched, 0 = taken whole)
    whole: bool  # taken whole by one pod
    slices: int  # dynamic MIG: occupied memory-slice mask
    compute: int  # dynamic MIG: compute slices in use
    me: int  # dynamic MIG: 1 while a +me instance exists; static MIG: placement-id mask of the +me instances
    static: int  # static MIG: placement-id mask of the instances that exist
    sused: int  # static MIG: placement-id mask of the instances in use

    @property
    def plain(self) -> bool:
        """No MIG instance and not taken whole: whole GPUs and shares may use it."""
        return self.static == 0 and not self.whole and self.slices == 0 and self.compute == 0


@dataclass(frozen=True)
class Node:
    """One inventory row, read element-wise from the arrays."""

    row: int
    cpu_free: int
    mem_free: int
    pods_free: int
    pods_cap: int
    cpu_cap: int
    mem_cap: int
    model: int
    product: str
    family: MigFamily | None
    memory_mib: float
    mode: int
    compute_total: int  # compute slices of a whole GPU (7, or 4 on A30)
    spot: bool
    price: float
    tags: tuple[int, ...]  # GpuClustering: pods per GPU tag
    gpus: tuple[Gpu, ...]
    numa: tuple[int, ...]
    links: tuple[tuple[int, ...], ...]  # links[a][b]: NVLink count from GPU a to GPU b

    @property
    def count(self) -> int:
        return len(self.gpus)

    def shape_of(self, profile: str) -> int | None:
        """Shape id of a MIG profile on this node's GPU model (None: the model has no such profile)."""
        if not profile or self.family is None:
            return None
        try:
            return resolve_profile(self.family, profile)[0]
        except KeyError:
            return None


@dataclass(frozen=True)
class MixEntry:
    """One task type of the policy's mix as seen on one node."""

    weight: float
    task: TaskType
    shape: int | None  # the type's MIG shape on the node's model
    allowed: bool  # the type may run on the node's model


def read_node(inventory: Inventory, row: int) -> Node:
    """Copy one inventory row into plain Python objects."""
    inv = inventory
    model_id = int(inv.node_model[row])
    model = inv.models[model_id]
    count = int(inv.node_gpu_count[row])
    base = row * MAX_GPUS
    gpus = tuple(
        Gpu(
            milli=int(inv.gpu_milli_free[base + j]),
            whole=bool(inv.gpu_whole[base + j]),
            slices=int(inv.gpu_slices[base + j]),
            compute=int(inv.gpu_compute[base + j]),
            me=int(inv.gpu_me[base + j]),
            static=int(inv.gpu_static[base + j]),
            sused=int(inv.gpu_static_used[base + j]),
        )
        for j in range(count)
    )
    links = tuple(tuple(int(inv.gpu_link[(base + a) * MAX_GPUS + b]) for b in range(count)) for a in range(count))
    return Node(
        row=row,
        cpu_free=int(inv.node_cpu_free[row]),
        mem_free=int(inv.node_mem_free[row]),
        pods_free=int(inv.node_pods_free[row]),
        pods_cap=int(inv.node_pods_cap[row]),
        cpu_cap=int(inv.node_cpu_cap[row]),
        mem_cap=int(inv.node_mem_cap[row]),
        model=model_id,
        product=model.product,
        family=model.mig_family,
        memory_mib=float(inv.model_memory[model_id]),
        mode=int(inv.node_mig_mode[row]),
        compute_total=int(inv.model_compute[model_id]),
        spot=bool(inv.node_spot[row]),
        price=float(inv.node_price[row]),
        tags=tuple(int(t) for t in inv.node_tags[row * (MAX_GPUS + 1) : (row + 1) * (MAX_GPUS + 1)]),
        gpus=gpus,
        numa=tuple(int(inv.gpu_numa[base + j]) for j in range(count)),
        links=links,
    )


# ----------------------------------------------------------------------------- one GPU
def slice_unit(node: Node) -> int:
    """Capacity units of one MIG compute slice on the node's GPUs."""
    return UNIT // node.compute_total


def free_units(node: Node, gpu: Gpu) -> int:
    """Free capacity of one GPU in units."""
    if gpu.static != 0:
        free_slices = sum(
            int(SHAPES[PLACEMENT_SHAPE[pid]].compute)
            for pid in range(len(PLACEMENT_SHAPE))
            if gpu.static & ~gpu.sused & (1 << pid)
        )
        return free_slices * slice_unit(node)
    if gpu.whole:
        return 0
    if gpu.slices != 0 or gpu.compute != 0:
        return (node.compute_total - gpu.compute) * slice_unit(node)
    return gpu.milli * MILLI_UNIT


def static_options(gpu: Gpu, shape: int, need_me: bool) -> list[int]:
    """Placement ids of the free existing static instances of `shape` on a GPU, in id order: the +me
    instances for a +me request, the others otherwise."""
    return [
        pid
        for pid in range(len(PLACEMENT_SHAPE))
        if int(PLACEMENT_SHAPE[pid]) == shape
        and gpu.static & (1 << pid)
        and not gpu.sused & (1 << pid)
        and bool(gpu.me & (1 << pid)) == need_me
    ]


def dynamic_starts(gpu: Gpu, shape: int) -> list[int]:
    """Starts where a new instance of `shape` fits in the free memory slices of a GPU."""
    size = SHAPES[shape].size
    return [start for start in SHAPES[shape].starts if gpu.slices & slice_bits(size, start) == 0]


@functools.cache
def max_instances(shape: int, slices: int) -> int:
    """Most instances of `shape` that fit in the free memory slices (searched over every subset of starts)."""
    spec = SHAPES[shape]
    free = [start for start in spec.starts if slices & slice_bits(spec.size, start) == 0]
    for n in range(len(free), 0, -1):
        for subset in itertools.combinations(free, n):
            masks = [slice_bits(spec.size, start) for start in subset]
            if sum(masks) == functools.reduce(operator.or_, masks):  # pairwise disjoint
                return n
    return 0


def mig_fit(node: Node, gpu: Gpu, shape: int, need_me: bool) -> int:
    """How many more instances of `shape` fit on one GPU (0 when none)."""
    if node.mode == k.MODE_STATIC:
        return len(static_options(gpu, shape, need_me))
    if node.mode != k.MODE_DYNAMIC or gpu.whole or gpu.milli != MILLI_PER_GPU or gpu.static != 0:
        return 0
    if need_me and gpu.me:
        return 0
    by_memory = max_instances(shape, gpu.slices)
    by_compute = (node.compute_total - gpu.compute) // SHAPES[shape].compute
    fit = min(by_memory, by_compute)
    return min(fit, 1) if need_me else fit


def with_instance(node: Node, gpu: Gpu, shape: int, start: int, pid: int, me: bool) -> Gpu:
    """The GPU after one more MIG instance (static: placement `pid`; dynamic: `shape` at `start`)."""
    if node.mode == k.MODE_STATIC:
        return replace(gpu, sused=gpu.sused | (1 << pid))
    spec = SHAPES[shape]
    return replace(
        gpu,
        slices=gpu.slices | slice_bits(spec.size, start),
        compute=gpu.compute + spec.compute,
        me=gpu.me | me,
    )


# ----------------------------------------------------------------------------- fragmentation
def type_terms(node: Node, gpu: Gpu, entry: MixEntry) -> tuple[int, int]:
    """(units of this GPU the task type cannot use, 1 if the GPU can host one unit of the type)."""
    free = free_units(node, gpu)
    task = entry.task
    if task.kind == Kind.SHARE:
        return (0, 1) if gpu.plain and gpu.milli >= task.milli else (free, 0)
    if task.kind == Kind.WHOLE:
        return (0, 1) if gpu.plain and gpu.milli == MILLI_PER_GPU else (free, 0)
    if task.kind == Kind.MIG:
        if entry.shape is None:
            return free, 0
        fit = mig_fit(node, gpu, entry.shape, False)
        if fit == 0:
            return free, 0
        return free - fit * SHAPES[entry.shape].compute * slice_unit(node), 1
    return 0, 0


def fragmentation(node: Node, gpus: Sequence[Gpu], cpu_free: int, mem_free: int, mix: list[MixEntry]) -> float:
    """Expected fragmentation (FGD, ATC'23) of a node whose GPUs are `gpus`, computed from scratch.

    For each task type: if the node could host it (model allowed, CPU and memory free, enough
    GPUs that can take one unit of it), the free units no single unit of the type could use;
    otherwise every free unit. Weighted by the type's probability, summed in type order.
    """
    free = sum(free_units(node, gpu) for gpu in gpus)
    total = 0.0
    for entry in mix:
        if entry.weight == 0.0:
            continue
        task = entry.task
        frag = free
        if task.kind != Kind.NONE and entry.allowed and cpu_free >= task.cpu_milli and mem_free >= task.memory_bytes:
            terms = [type_terms(node, gpu, entry) for gpu in gpus]
            hosts = sum(host for _, host in terms)
            need = task.gpus if task.kind == Kind.WHOLE else 1
            if hosts >= need:
                frag = sum(unusable for unusable, _ in terms)
        total += entry.weight * frag
    return total


def fgd_score(frag_before: float, frag_after: float) -> float:
    """FGD's node score: trunc(100 * sigmoid(-(fragmentation growth in GPUs)))."""
    x = (frag_before - frag_after) / UNIT
    try:
        denominator = 1.0 + math.exp(-x)
    except OverflowError:  # the kernel's exp overflows to inf
        return 0.0
    return float(math.floor(100.0 / denominator))


# ----------------------------------------------------------------------------- GPU sets
def pair_score(node: Node, a: int, b: int) -> int:
    """go-gpuallocator's pair affinity: 100 per NVLink from a to b, plus 20 same NUMA node, 10 across."""
    return 100 * node.links[a][b] + (20 if node.numa[a] == node.numa[b] else 10)


def best_gpu_set(node: Node, free: Sequence[int], size: int) -> tuple[tuple[int, ...], int]:
    """The best-connected `size`-subset of the GPUs `free` and its affinity score.

    Highest total pair score; then a subset whose every pair is NVLinked (#15); then fewest links cut
    to the GPUs left free; then the subset with the smallest bitmask (the kernel enumerates subsets in
    increasing bitmask order).
    """
    free_set = set(free)

    def key(subset: tuple[int, ...]) -> tuple[int, bool, int, int]:
        inside = set(subset)
        pairs = list(itertools.combinations(subset, 2))
        score = sum(pair_score(node, a, b) for a, b in pairs)
        all_linked = all(node.links[a][b] > 0 for a, b in pairs)
        cut = sum(pair_score(node, a, b) for a in subset for b in free_set - inside)
        return (-score, not all_linked, cut, sum(1 << j for j in subset))

    best = min(itertools.combinations(sorted(free_set), size), key=key)
    return best, -key(best)[0]


# ----------------------------------------------------------------------------- one node
@dataclass
class Outcome:
    """What `evaluate` found for one node."""

    verdict: int
    score: float = 0.0
    gpus: tuple[int, ...] = ()  # chosen local GPU per slot
    starts: tuple[int, ...] = ()  # MIG start per slot (-1 otherwise)
    parts: dict[str, float] = field(default_factory=dict)  # the terms of the score, by part name


@dataclass
class _Context:
    """Cluster-wide inputs of one decision."""

    request: PodRequest
    instances: list[str]
    policy: PolicySpec
    types: list[TaskType]
    mix_weights: np.ndarray
    max_price: float
    max_memory: float

    def rule(self, column: int) -> int:
        """The policy's rule in `column` (RULE_*)."""
        return int(self.policy.rules[column])


class _Trial:
    """One node under evaluation: its mix, the CPU and memory left once the request is placed, and its
    fragmentation before (0 for a policy that measures none, as in the kernels)."""

    def __init__(self, node: Node, ctx: _Context) -> None:
        self.node = node
        self.ctx = ctx
        self.mix = [
            MixEntry(
                float(weight),
                task,
                node.shape_of(task.mig_profile),
                task.allowed_products is None or node.product in task.allowed_products,
            )
            for task, weight in zip(ctx.types, ctx.mix_weights, strict=True)
        ]
        self.cpu_after = node.cpu_free - ctx.request.cpu_milli
        self.mem_after = node.mem_free - ctx.request.memory_bytes
        self.frag_before = self.frag(node.gpus, node.cpu_free, node.mem_free)

    def frag(self, gpus: Sequence[Gpu], cpu: int | None = None, mem: int | None = None) -> float:
        """Fragmentation of the node with `gpus` (and by default the request's CPU and memory taken)."""
        if not self.ctx.rule(RULE_FRAG):
            return 0.0
        cpu = self.cpu_after if cpu is None else cpu
        mem = self.mem_after if mem is None else mem
        return fragmentation(self.node, gpus, cpu, mem, self.mix)


@dataclass
class _Picked:
    """A feasible placement on one node: its GPUs after, the chosen GPU and MIG start per slot, and the
    NVLink rating of a multi-GPU set."""

    after: list[Gpu]
    chosen: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    topo: float = 1.0
    extra_frag: float = 0.0  # what the policy adds to the fragmentation after (`share_slack`)


def hardware_verdict(node: Node, ctx: _Context) -> int:
    """What the node lacks for the request whatever runs on it (OK when nothing); kernels: `hardware_verdict`."""
    request = ctx.request
    if (request.kind == Kind.WHOLE and request.gpus > node.count) or (request.kind == Kind.SHARE and not node.count):
        return k.TOO_FEW_GPUS
    if request.kind == Kind.MIG:
        if node.mode == k.MODE_NONE or node.count == 0:
            return k.NOT_MIG
        if any(node.shape_of(profile) is None for profile in ctx.instances):
            return k.NO_PROFILE
    return k.OK


def early_verdict(node: Node, ctx: _Context) -> int:
    """The first check the node fails before its GPUs are read (OK when none); kernels: `early_verdict`."""
    verdict = hardware_verdict(node, ctx)
    if verdict != k.OK:
        return verdict
    request = ctx.request
    allowed = request.allowed_products is None or node.product in request.allowed_products
    if node.cpu_free < request.cpu_milli:
        return k.NO_CPU
    if node.mem_free < request.memory_bytes:
        return k.NO_MEMORY
    if node.pods_free < 1:
        return k.NO_POD_SLOT
    if request.kind != Kind.NONE and not allowed:
        return k.MODEL_NOT_ALLOWED
    if node.spot and not request.interruptible and ctx.rule(RULE_SPOT_FORBID):
        return k.SPOT_FORBIDDEN
    return k.OK


def evaluate(node: Node, ctx: _Context, noise: float) -> Outcome:
    """Verdict, score and placement of the request on one candidate node."""
    verdict = early_verdict(node, ctx)
    if verdict != k.OK:
        return Outcome(verdict)
    trial = _Trial(node, ctx)
    kind = ctx.request.kind
    picked: _Picked | int
    if kind == Kind.SHARE:
        picked = share_pick(trial, noise)
    elif kind == Kind.WHOLE:
        picked = whole_pick(trial)
    elif kind == Kind.MIG:
        picked = mig_pick(trial)
    else:
        picked = _Picked(list(node.gpus))
    if isinstance(picked, int):
        return Outcome(picked)
    free_before = sum(free_units(node, gpu) for gpu in node.gpus)
    free_after = sum(free_units(node, gpu) for gpu in picked.after)
    frag_after = trial.frag(picked.after) + picked.extra_frag
    parts = weighted_parts(trial, free_before, free_after, frag_after, picked.topo)
    score = 0.0
    for value in parts.values():
        score += value  # in column order, as the kernel adds them, so the sums agree bit for bit
    named = {PART_NAMES[part]: value for part, value in parts.items()}
    return Outcome(k.OK, score, tuple(picked.chosen), tuple(picked.starts), named)


def share_pick(trial: _Trial, noise: float) -> _Picked | int:
    """A share: the plain GPU with the milli free that the policy's RULE_SHARE prefers (kernels: `share_choice`)."""
    request = trial.ctx.request
    before = list(trial.node.gpus)
    hosts = [j for j, gpu in enumerate(before) if gpu.plain and gpu.milli >= request.milli]
    if not hosts:
        return k.NO_GPU

    def shared(j: int) -> list[Gpu]:
        trial_gpus = list(before)
        trial_gpus[j] = replace(before[j], milli=before[j].milli - request.milli)
        return trial_gpus

    rule = trial.ctx.rule(RULE_SHARE)
    if rule == PICK_RANDOM:
        pick = hosts[int(noise * len(hosts))]
    elif rule == PICK_FIRST:
        pick = hosts[0]
    elif rule == PICK_FGD:  # the highest FGD score, lowest index on ties
        pick = min(hosts, key=lambda j: (-fgd_score(trial.frag_before, trial.frag(shared(j))), j))
    elif rule == PICK_LEAST_FRAG:  # least fragmentation, then the tightest GPU, then lowest index
        extra = {j: share_slack(trial, before[j].milli) for j in hosts}
        pick = min(hosts, key=lambda j: (trial.frag(shared(j)) + extra[j], before[j].milli, j))
        return _Picked(shared(pick), [pick], [-1], extra_frag=extra[pick])
    else:  # PICK_BEST_FIT: the tightest GPU, lowest index on ties
        pick = min(hosts, key=lambda j: (before[j].milli, j))
    return _Picked(shared(pick), [pick], [-1])


def share_slack(trial: _Trial, left: int) -> float:
    """What the share adds to the fragmentation after it on a GPU with `left` milli free (kernels:
    `share_slack`): W_SHARE_SLACK times the milli left beyond the largest share type of the mix that
    still fits there."""
    slack = float(trial.ctx.policy.params[W_SHARE_SLACK])
    if slack == 0.0:
        return 0.0
    rest = left - trial.ctx.request.milli
    sizes = [e.task.milli for e in trial.mix if e.weight > 0.0 and e.task.kind == Kind.SHARE]
    fit = max((size for size in sizes if size <= rest), default=0)
    return slack * ((rest - fit) * MILLI_UNIT)


def whole_pick(trial: _Trial) -> _Picked | int:
    """Whole GPUs: untouched GPUs, the best-connected set under RULE_SETS, else the lowest (kernels:
    `whole_choice`, and `finish_choice` for a single GPU)."""
    node, request = trial.node, trial.ctx.request
    free = [j for j, gpu in enumerate(node.gpus) if gpu.plain and gpu.milli == MILLI_PER_GPU]
    if len(free) < request.gpus:
        return k.NO_GPU
    topo = 1.0
    if trial.ctx.rule(RULE_SETS) and (len(free) > request.gpus or request.gpus > 1):
        subset, score_set = best_gpu_set(node, free, request.gpus)
        chosen = list(subset)
        if request.gpus > 1:
            _, ideal = best_gpu_set(node, range(node.count), request.gpus)
            pairs = list(itertools.combinations(chosen, 2))
            linked = sum(1 for a, b in pairs if node.links[a][b] > 0)
            topo = 0.75 * linked / len(pairs) + 0.25 * (score_set / ideal if ideal > 0 else 1.0)
    else:
        chosen = free[: request.gpus]
    after = list(node.gpus)
    for j in chosen:
        after[j] = replace(after[j], whole=True, milli=0)
    return _Picked(after, chosen, [-1] * len(chosen), topo)


def mig_pick(trial: _Trial) -> _Picked | int:
    """MIG instances, largest first, each on the GPUs as the earlier ones left them, where the
    policy's RULE_MIG puts it (kernels: `mig_choice`)."""
    node = trial.node
    picked = _Picked(list(node.gpus))
    for profile in trial.ctx.instances:
        shape = node.shape_of(profile)
        assert shape is not None  # `hardware_verdict`
        need_me = profile.endswith("+me")
        options = instance_options(trial, picked.after, shape, need_me)
        if not options:
            return k.NO_MIG
        _, j, start, pid = min(options, key=lambda option: option[0])
        picked.after[j] = with_instance(node, picked.after[j], shape, start, pid, need_me)
        picked.chosen.append(j)
        picked.starts.append(start)
    return picked


def instance_options(trial: _Trial, gpus: list[Gpu], shape: int, need_me: bool) -> list[tuple[tuple, int, int, int]]:
    """Every (GPU, start) where one more instance of `shape` fits, as (key, GPU, start, placement id);
    the lowest key is the policy's choice (kernels: `best_instance`)."""
    node = trial.node
    rule = trial.ctx.rule(RULE_MIG)
    options: list[tuple[tuple, int, int, int]] = []
    for j, gpu in enumerate(gpus):
        if mig_fit(node, gpu, shape, need_me) == 0:
            continue
        if node.mode == k.MODE_STATIC:
            used = bin(gpu.sused).count("1")  # instances in use
            here = [(int(PLACEMENT_START[pid]), pid) for pid in static_options(gpu, shape, need_me)]
        else:
            used = gpu.compute  # compute slices in use
            here = [(start, -1) for start in dynamic_starts(gpu, shape)]
        for order, (start, pid) in enumerate(here):
            if rule in (PICK_LEAST_FRAG, PICK_FULLEST_LEAST_FRAG):
                # least fragmentation; then the fullest GPU; then the lowest GPU; on it the highest start
                # (PICK_FULLEST_LEAST_FRAG: the fullest GPU first)
                changed = list(gpus)
                changed[j] = with_instance(node, gpu, shape, start, pid, need_me)
                frag = trial.frag(changed)
                key: tuple = (frag, -used, j, -start) if rule == PICK_LEAST_FRAG else (-used, frag, j, -start)
            elif rule == PICK_FIRST:
                key = (j, order)  # the first free option
            else:  # PICK_BEST_FIT: the fullest GPU, lowest index and start
                key = (-used, j, order)
            options.append((key, j, start, pid))
    return options


# ----------------------------------------------------------------------------- the score
def weighted_parts(
    trial: _Trial, free_before: int, free_after: int, frag_after: float, topo: float
) -> dict[int, float]:
    """weight * part for every part (W_* column) the policy weighs and that applies to the node, in
    column order; the score is their sum (kernels: `node_score`, `weighted_part`)."""
    weights = trial.ctx.policy.params
    parts: dict[int, float] = {}
    for part in range(N_PARTS):
        mig_frag = part == W_FRAG and trial.ctx.request.kind == Kind.MIG
        weight = float(weights[W_MIG_FRAG] if mig_frag else weights[part])
        if weight != 0.0:
            value = weighted_part(part, weight, trial, free_before, free_after, frag_after, topo)
            if value is not None:
                parts[part] = value
    return parts


def weighted_part(
    part: int, weight: float, trial: _Trial, free_before: int, free_after: int, frag_after: float, topo: float
) -> float | None:
    """weight * part `part` of the node's score; None where the part does not apply."""
    node, ctx = trial.node, trial.ctx
    request = ctx.request
    if part == W_FRAG:  # expected fragmentation added, in GPUs, optionally rounded to FRAG_STEP GPUs
        growth = (frag_after - trial.frag_before) / UNIT
        step = float(ctx.policy.params[FRAG_STEP])
        if step > 0.0:
            growth = math.floor(growth / step + 0.5) * step
        return -weight * growth
    if part == W_PACK:
        return weight * (0.0 if node.count == 0 else 1.0 - free_after / (node.count * UNIT))
    if part == W_TOPO:
        return weight * topo if request.kind == Kind.WHOLE and request.gpus > 1 else None
    if part == W_MODEL:
        applies = request.kind != Kind.NONE and ctx.max_memory > 0
        return -(weight * node.memory_mib / ctx.max_memory) if applies else None
    if part == W_SPOT:
        return weight if node.spot and request.interruptible else None
    if part == W_SPOT_AVOID:
        return -weight if node.spot and not request.interruptible else None
    if part == W_COST:  # the price of the node the pod switches on
        applies = ctx.max_price > 0 and not math.isnan(node.price) and node.pods_free == node.pods_cap
        return -(weight * node.price / ctx.max_price) if applies else None
    if part == W_FGD:
        return weight * fgd_score(trial.frag_before, frag_after)
    return weight * baseline_part(part, node, request, free_before, free_after)


def baseline_part(part: int, node: Node, request: PodRequest, free_before: int, free_after: int) -> float:
    """The score of the ATC'23 baselines and kube-default (parts W_BESTFIT .. W_KUBE)."""
    demand_milli = (free_before - free_after) / MILLI_UNIT
    left_milli = free_before / MILLI_UNIT
    kind = request.kind
    if part == W_BESTFIT:
        raw = (
            0.5 * (node.cpu_free - request.cpu_milli) / MAX_SPEC_CPU
            + 0.5 * (left_milli - demand_milli) / MAX_SPEC_GPU
        )
        return float(math.floor((1.0 - raw) * 100.0))
    if part == W_DOT:
        dot = (node.cpu_free / MAX_SPEC_CPU) * (request.cpu_milli / MAX_SPEC_CPU)
        dot += (left_milli / MAX_SPEC_GPU) * (demand_milli / MAX_SPEC_GPU)
        return float(math.floor(100.0 * (1.0 - dot / 2.0)))
    if part == W_CLUSTER:
        if kind == Kind.NONE:
            return 0.0
        tag = 0 if kind == Kind.SHARE else request.gpus  # (MIG requests count as tag 0)
        base_score = (25 * (8000 - int(left_milli))) // 8000
        others = sum(1 for t, pods in enumerate(node.tags) if t != tag and pods > 0)
        if node.tags[tag] > 0:
            return float(base_score + (75 if others == 0 else 50))
        return float(base_score + (25 if others == 0 else 0))
    if part == W_GPU_PACKING:
        return 0.0 if kind == Kind.NONE else packing_score(node, request)
    assert part == W_KUBE, part
    cpu_part = (node.cpu_free - request.cpu_milli) * 100 // node.cpu_cap if node.cpu_cap > 0 else 0
    mem_part = (node.mem_free - request.memory_bytes) * 100 // node.mem_cap if node.mem_cap > 0 else 0
    return float((cpu_part + mem_part) // 2)


def packing_score(node: Node, request: PodRequest) -> float:
    """GpuPacking (ATC'23): shared GPUs first, then free GPUs on used nodes, then idle nodes.

    Reads the GPUs' free milli only (MIG instances are invisible to this baseline).
    """
    milli = [gpu.milli for gpu in node.gpus]
    n_free = sum(1 for m in milli if m == MILLI_PER_GPU)
    if n_free == node.count:
        return float(max(33 - n_free, n_free))
    need = 1 if request.kind == Kind.SHARE else request.gpus
    per_gpu = request.milli if request.kind == Kind.SHARE else MILLI_PER_GPU
    # the `need` tightest GPUs that can each take per_gpu, lowest index on ties
    fitting = sorted((m, j) for j, m in enumerate(milli) if m >= per_gpu)
    if len(fitting) < need:
        return 0.0
    taken = [m for m, _ in fitting[:need]]
    opened = sum(1 for m in taken if m == MILLI_PER_GPU)
    if opened > 0:
        return float(max(50 - opened, 33))
    total = sum(m * 100 // MILLI_PER_GPU for m in taken)
    return float(max(100 - total // 10, 50))


# ----------------------------------------------------------------------------- the decision
def reference_decide(
    inventory: Inventory,
    policy: PolicySpec,
    request: PodRequest,
    candidates: Sequence[str] | None = None,
    rank: np.ndarray | None = None,
    noise: np.ndarray | None = None,
    parts: dict[str, dict[str, float]] | None = None,
) -> Decision:
    """What `Engine(inventory, policy).decide(request, candidates, rank, noise)` answers, in plain Python.

    Raises RequestError for the same requests the engine rejects. Changes nothing. `parts` (when
    given) receives the terms of each feasible node's score (weight * part, by part name), by node name.
    """
    arrays = RequestArrays(request, inventory)  # validates MIG profiles, orders instances
    n = inventory.size
    in_candidates = set(candidates) if candidates is not None else None
    mask = np.array(
        [
            bool(inventory.node_active[row]) and (in_candidates is None or inventory.names[row] in in_candidates)
            for row in range(n)
        ],
        dtype=np.bool_,
    )
    rank = np.arange(n, dtype=np.int64) if rank is None else rank
    noise = np.zeros(n, dtype=np.float64) if noise is None else noise
    nodes = {row: read_node(inventory, row) for row in range(n) if mask[row]}
    ctx = _context(policy, arrays, list(nodes.values()))
    order_weight, order_span = _rank_term(policy, request, n)

    verdicts = np.full(n, k.NOT_CANDIDATE, dtype=np.int8)
    scores = np.full(n, -np.inf, dtype=np.float64)
    best: int | None = None
    best_outcome: Outcome | None = None
    for row, node in nodes.items():
        outcome = evaluate(node, ctx, float(noise[row]))
        verdicts[row] = outcome.verdict
        if outcome.verdict != k.OK:
            continue
        score = outcome.score
        terms = dict(outcome.parts)
        if order_weight > 0.0:
            order = order_weight * rank[row] / order_span  # consolidation, along the fixed order
            terms["order"] = -float(order)
            score -= order
        if parts is not None and terms:
            parts[str(inventory.names[row])] = {name: float(value) for name, value in terms.items()}
        scores[row] = score
        if best is None or score > scores[best] or (score == scores[best] and rank[row] < rank[best]):
            best, best_outcome = row, outcome

    placement = None
    if best is not None and best_outcome is not None:
        gpu = np.array(best_outcome.gpus, dtype=np.int32)
        start = np.array(best_outcome.starts, dtype=np.int32)
        placement = build_placement(inventory, best, len(best_outcome.gpus), arrays, gpu, start)
    return Decision(placement, mask, verdicts, scores, inventory.names, (inventory, arrays))


def _rank_term(policy: PolicySpec, request: PodRequest, n: int) -> tuple[float, int]:
    """(weight, span) of the rank term over `n` rows: MIG requests have their own weight and a span of
    at least MIG_ORDER_MIN_NODES rows; the others' is at least ORDER_MIN_NODES."""
    if request.kind == Kind.MIG:
        return float(policy.params[W_MIG_ORDER]), max(n, MIG_ORDER_MIN_NODES)
    return float(policy.params[W_ORDER]), max(n, ORDER_MIN_NODES)


def _context(policy: PolicySpec, arrays: RequestArrays, nodes: list[Node]) -> _Context:
    """The decision's cluster-wide inputs; the price and memory maxima are over the candidate GPU nodes."""
    prices = [node.price for node in nodes if node.count > 0 and not math.isnan(node.price)]
    memories = [node.memory_mib for node in nodes if node.count > 0]
    types, mix_weights = policy.mix.current()
    return _Context(
        request=arrays.request,
        instances=arrays.instances,
        policy=policy,
        types=list(types),
        mix_weights=mix_weights,
        max_price=max([0.0, *prices]),
        max_memory=max([0.0, *memories]),
    )
