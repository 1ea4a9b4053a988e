"""numba kernels: feasibility, best placement and score of one request on every candidate node.

Three layers, as in stumpy. Small `@helper` functions for one GPU or one step take arrays and scalars
and allocate nothing. One function per path of a node's evaluation reads like its branch of
`scoring.reference.evaluate`: `early_verdict`, `node_state`, `share_choice`, `whole_choice`,
`mig_choice`, `cpu_only_frag`, joined by `evaluate_node`; they run once per node and take the input
tuples whole, so they are compiled into the driver (`@per_node`, numba's `inline="always"`) rather
than called. The driver `schedule` loops over the nodes with the memo (`memo_holds`, `memo_store`).

Inputs are plain tuples of the inventory's flat arrays in the column order of `scoring.layout`,
packed by `scoring.engine`; nothing here knows Python objects. `scoring.reference` implements the same
semantics in plain Python, and the property tests hold the two to identical answers.

Names used throughout: `n` a node row; `base` = n * MAX_GPUS, its first GPU row; `count` its GPUs;
`j` a GPU of the node (0 .. count - 1); `model` its GPU model id; `mode` its MIG mode;
`compute_total` the compute slices of one of its GPUs; `unusable` / `hosts` per task type the units
the type cannot use and the GPUs that can host one unit of it (the inputs of FGD's fragmentation),
`row` the row of those arrays that holds the node; `local` a scratch copy of the node's GPU state
(rows `LOCAL_*`); `static_used` the static MIG instances in use; `free_before` / `frag_before` the
node's free units and fragmentation as it is, `*_after` with the request placed; `policy` the
policy's row of the policy table, `rules` (RULE_*) and `weights` (W_*).

Policies: no kernel reads a policy id. A policy is its row of `scoring.policies.POLICY_TABLE`: rules
that say how it picks among a node's GPUs (`share_choice`, `best_instance` and `pick_whole_gpus` switch
on a PICK_* rule, each rule written once) and weights over the score parts (`node_score`: one sum,
each part defined once in `weighted_part`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from gpupack.scoring.geometry import (
    FREE_STARTS,
    MAX_FIT,
    PLACEMENT_SHAPE,
    PLACEMENT_START,
    SHAPE_COMPUTE,
    SHAPE_SIZE,
)
from gpupack.scoring.layout import (
    CACHE_FRAG,
    CACHE_FREE,
    CACHE_FREE_MASK,
    CACHE_HOSTS,
    CACHE_PLAIN_MASK,
    CACHE_PRISTINE,
    CACHE_SET,
    CACHE_STAMP,
    CACHE_TOPO,
    CACHE_UNUSABLE,
    CACHE_WEIGHTS_STAMP,
    CACHE_WEIGHTS_VERSION,
    FRAG_STEP,
    GPU_COMPUTE,
    GPU_LINK,
    GPU_ME,
    GPU_MILLI,
    GPU_NUMA,
    GPU_SLICES,
    GPU_STATIC,
    GPU_STATIC_USED,
    GPU_WHOLE,
    KIND_MIG,
    KIND_NONE,
    KIND_SHARE,
    KIND_WHOLE,
    LOCAL_COMPUTE,
    LOCAL_ME,
    LOCAL_MILLI,
    LOCAL_ROWS,
    LOCAL_SLICES,
    LOCAL_STATIC_USED,
    LOCAL_WHOLE,
    MAX_GPUS,
    MAX_SPEC_CPU,
    MAX_SPEC_GPU,
    MEMO_CLASS_EPOCH,
    MEMO_CLASS_SCORE,
    MEMO_CLASS_VERDICT,
    MEMO_CURRENT,
    MEMO_EPOCH,
    MEMO_MAXIMA,
    MEMO_SCORE,
    MEMO_STAMP,
    MEMO_VERDICT,
    MIG_ORDER_MIN_NODES,
    MILLI_UNIT,
    MIX_ALLOWED,
    MIX_SHAPE,
    MIX_TASK,
    MIX_WEIGHT,
    MODE_DYNAMIC,
    MODE_NONE,
    MODE_STATIC,
    MODEL_COMPUTE,
    MODEL_MEMORY,
    MODEL_NOT_ALLOWED,
    N_PARTS,
    NO_CPU,
    NO_GPU,
    NO_MEMORY,
    NO_MIG,
    NO_POD_SLOT,
    NO_PROFILE,
    NODE_ACTIVE,
    NODE_CLASS,
    NODE_CPU_CAP,
    NODE_CPU_FREE,
    NODE_GPU_COUNT,
    NODE_MEM_CAP,
    NODE_MEM_FREE,
    NODE_MIG_MODE,
    NODE_MODEL,
    NODE_PODS_CAP,
    NODE_PODS_FREE,
    NODE_PRICE,
    NODE_SPOT,
    NODE_TAGS,
    NODE_VERSION,
    NOT_CANDIDATE,
    NOT_MIG,
    OK,
    ORDER_MIN_NODES,
    OUT_GPU,
    OUT_SCORE,
    OUT_SHAPE,
    OUT_START,
    OUT_VERDICT,
    PICK_BEST_FIT,
    PICK_FGD,
    PICK_FIRST,
    PICK_FULLEST_LEAST_FRAG,
    PICK_LEAST_FRAG,
    PICK_RANDOM,
    POLICY_RULES,
    POLICY_WEIGHTS,
    REQ_CPU,
    REQ_GPUS,
    REQ_INSTANCES,
    REQ_INTERRUPTIBLE,
    REQ_KIND,
    REQ_MEMORY,
    REQ_MILLI,
    REQUEST_ALLOWED,
    REQUEST_ME,
    REQUEST_SCALARS,
    REQUEST_SHAPES,
    RULE_FRAG,
    RULE_MIG,
    RULE_SETS,
    RULE_SHARE,
    RULE_SPOT_FORBID,
    SCRATCH_FREE_IDX,
    SCRATCH_GPU,
    SCRATCH_GPU_HOSTS,
    SCRATCH_GPU_UNUSABLE,
    SCRATCH_HOSTS,
    SCRATCH_IDEAL_SET,
    SCRATCH_LOCAL,
    SCRATCH_PAIRS,
    SCRATCH_SHAPE,
    SCRATCH_START,
    SCRATCH_UNUSABLE,
    SPOT_FORBIDDEN,
    TASK_CPU,
    TASK_GPUS,
    TASK_KIND,
    TASK_MEMORY,
    TASK_MILLI,
    TOO_FEW_GPUS,
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
from gpupack.scoring.request import MILLI_PER_GPU

# shape id -> placement-id mask of that shape, for static layouts
SHAPE_PLACEMENTS = np.zeros(len(SHAPE_SIZE), dtype=np.int64)
for _pid in range(len(PLACEMENT_SHAPE)):
    SHAPE_PLACEMENTS[PLACEMENT_SHAPE[_pid]] |= 1 << _pid
# Every function below `schedule` calls takes arrays but never allocates, so it is compiled without
# numba's reference counting (`_nrt=False`, the switch numba's own maintainers use for this, numba
# issue #2350): with it, each call paid an atomic incref and decref per array argument, 85 % of the
# kernel's time at 5,000 nodes.
helper = njit(cache=True, _nrt=False)  # type: ignore[call-overload]  # _nrt: numba's stubs leave out its underscore options
# The steps of one node's evaluation: compiled into their caller, as if written there.
per_node = njit(cache=True, _nrt=False, inline="always")  # type: ignore[call-overload]  # _nrt: numba's stubs leave out its underscore options



# ----------------------------------------------------------------------------- one GPU
@njit(cache=True, inline="always")
def slice_unit(compute_total):
    return UNIT // compute_total


@njit(cache=True)
def popcount(x):
    count = 0
    while x:
        x &= x - 1
        count += 1
    return count


@njit(cache=True)
def gpu_free_units(mode, compute_total, milli, whole, slices, compute, static, static_used):
    """Free capacity of one GPU in units."""
    if static != 0:
        free = 0
        bits = static & ~static_used
        pid = 0
        while bits:
            if bits & 1:
                free += SHAPE_COMPUTE[PLACEMENT_SHAPE[pid]]
            bits >>= 1
            pid += 1
        return free * slice_unit(compute_total)
    if whole:
        return 0
    if slices != 0 or compute != 0:
        return (compute_total - compute) * slice_unit(compute_total)
    return milli * MILLI_UNIT


@njit(cache=True)
def static_options(shape, me, static, static_used, need_me):
    """Static MIG: placement-id mask of the free instances of `shape` a request may take; `me` is
    the mask of the layout's +me instances, which only a +me request takes (and it only those)."""
    kind_mask = me if need_me else ~me
    return static & ~static_used & SHAPE_PLACEMENTS[shape] & kind_mask


@njit(cache=True)
def mig_fit(shape, mode, compute_total, milli, whole, slices, compute, me, static, static_used, need_me):
    """How many instances of `shape` still fit on one GPU (0 when none)."""
    if mode == MODE_STATIC:
        return popcount(static_options(shape, me, static, static_used, need_me))
    if mode != MODE_DYNAMIC or whole or milli != MILLI_PER_GPU or static != 0:
        return 0
    if need_me and me:
        return 0
    by_compute = (compute_total - compute) // SHAPE_COMPUTE[shape]
    by_memory = MAX_FIT[shape, slices]
    fit = by_memory if by_memory < by_compute else by_compute
    if need_me and fit > 1:
        fit = 1
    return fit


@njit(cache=True)
def gpu_terms(kind, task_milli, task_shape, mode, compute_total, milli, whole, slices, compute, me, static, static_used):
    """(units unusable by the task type, 1 if this GPU can host one unit of the type)."""
    free = gpu_free_units(mode, compute_total, milli, whole, slices, compute, static, static_used)
    plain = static == 0 and not whole and slices == 0 and compute == 0
    if kind == KIND_SHARE:
        if plain and milli >= task_milli:
            return 0, 1
        return free, 0
    if kind == KIND_WHOLE:
        if plain and milli == MILLI_PER_GPU:
            return 0, 1
        return free, 0
    if kind == KIND_MIG:
        if task_shape < 0:
            return free, 0
        fit = mig_fit(task_shape, mode, compute_total, milli, whole, slices, compute, me, static, static_used, False)
        if fit == 0:
            return free, 0
        return free - fit * SHAPE_COMPUTE[task_shape] * slice_unit(compute_total), 1
    return 0, 0


# ----------------------------------------------------------------------------- fragmentation sums
@helper
def node_summary(
    model, mode, compute_total, base, count, milli_a, whole_a, slices_a, compute_a, me_a, static_a, static_used_a,
    mix_w, mix_task, mix_shape, unusable, hosts, row, gpu_unusable, gpu_hosts,
):
    """Per task type the sum of units the type cannot use (into unusable[row]) and the count of GPUs
    that can host one unit of it (into hosts[row]). Returns (free units, mask of untouched plain GPUs,
    mask of plain GPUs); plain = no MIG instance and not taken whole, so shares and whole GPUs may use it.

    A GPU in the same state as an earlier GPU of the node (all free, all taken: the common case)
    reuses that GPU's terms, kept in the scratch rows gpu_unusable[j] and gpu_hosts[j].
    """
    n_types = len(mix_w)
    for t in range(n_types):
        unusable[row, t] = 0
        hosts[row, t] = 0
    free = 0
    free_mask = 0
    plain_mask = 0
    for j in range(count):
        i = base + j
        milli = milli_a[i]
        whole = whole_a[i]
        slices = slices_a[i]
        compute = compute_a[i]
        me = me_a[i]
        static = static_a[i]
        static_used = static_used_a[i]
        free += gpu_free_units(mode, compute_total, milli, whole, slices, compute, static, static_used)
        if static == 0 and not whole and slices == 0 and compute == 0:
            plain_mask |= 1 << j
            if milli == MILLI_PER_GPU:
                free_mask |= 1 << j
        same = -1
        for o in range(j if n_types > 0 else 0):
            e = base + o
            if (milli_a[e] == milli and whole_a[e] == whole and slices_a[e] == slices and compute_a[e] == compute
                    and me_a[e] == me and static_a[e] == static and static_used_a[e] == static_used):
                same = o
                break
        for t in range(n_types):
            if same >= 0:
                gpu_unusable_units = gpu_unusable[same, t]
                host = gpu_hosts[same, t]
            else:
                gpu_unusable_units, host = gpu_terms(
                    mix_task[t, TASK_KIND], mix_task[t, TASK_MILLI], mix_shape[t, model], mode, compute_total,
                    milli, whole, slices, compute, me, static, static_used,
                )
            gpu_unusable[j, t] = gpu_unusable_units
            gpu_hosts[j, t] = host
            unusable[row, t] += gpu_unusable_units
            hosts[row, t] += host
    return free, free_mask, plain_mask


@helper
def load_local(
    base, count, milli_a, whole_a, slices_a, compute_a, me_a, static_used_a, local, cache_unusable, cache_hosts, n,
    unusable, hosts,
):
    """Copy node n's GPU state into the scratch `local` and its sums into unusable[0] and hosts[0]: the
    MIG and multi-GPU paths change the copies while they try placements."""
    for t in range(unusable.shape[1]):
        unusable[0, t] = cache_unusable[n, t]
        hosts[0, t] = cache_hosts[n, t]
    for j in range(count):
        i = base + j
        local[LOCAL_MILLI, j] = milli_a[i]
        local[LOCAL_WHOLE, j] = whole_a[i]
        local[LOCAL_SLICES, j] = slices_a[i]
        local[LOCAL_COMPUTE, j] = compute_a[i]
        local[LOCAL_ME, j] = me_a[i]
        local[LOCAL_STATIC_USED, j] = static_used_a[i]


@helper
def add_gpu_terms(sign, j, model, mode, compute_total, static, mix_w, mix_task, mix_shape, local, unusable, hosts, row):
    """Add (sign=1) or remove (sign=-1) local GPU j's contribution to the sums; returns its free units."""
    milli = local[LOCAL_MILLI, j]
    whole = local[LOCAL_WHOLE, j]
    slices = local[LOCAL_SLICES, j]
    compute = local[LOCAL_COMPUTE, j]
    static_used = local[LOCAL_STATIC_USED, j]
    for t in range(len(mix_w)):
        gpu_unusable_units, host = gpu_terms(
            mix_task[t, TASK_KIND], mix_task[t, TASK_MILLI], mix_shape[t, model], mode, compute_total,
            milli, whole, slices, compute, local[LOCAL_ME, j], static, static_used,
        )
        unusable[row, t] += sign * gpu_unusable_units
        hosts[row, t] += sign * host
    return sign * gpu_free_units(mode, compute_total, milli, whole, slices, compute, static, static_used)


@helper
def type_may_fit(t, model, cpu_free, mem_free, mix_task, mix_allowed):
    """Whether task type t could run on the node at all (GPU model, CPU, memory), and how many
    GPUs able to host it the node then needs (0 when it cannot run)."""
    kind = mix_task[t, TASK_KIND]
    if (kind != KIND_NONE and mix_allowed[t, model] and cpu_free >= mix_task[t, TASK_CPU]
            and mem_free >= mix_task[t, TASK_MEMORY]):
        return mix_task[t, TASK_GPUS] if kind == KIND_WHOLE else 1
    return 0


@helper
def node_frag(model, cpu_free, mem_free, free, mix_w, mix_task, mix_allowed, unusable, hosts, row):
    """Expected fragmentation of a node (FGD, ATC'23): weighted units no task type could use."""
    total = 0.0
    for t in range(len(mix_w)):
        if mix_w[t] == 0.0:
            continue
        frag = free
        need = type_may_fit(t, model, cpu_free, mem_free, mix_task, mix_allowed)
        if need > 0 and hosts[row, t] >= need:
            frag = unusable[row, t]
        total += mix_w[t] * frag
    return total


@njit(cache=True, _nrt=False, inline="always")  # type: ignore[call-overload]  # _nrt: numba's stubs leave out its underscore options
def frag_after_change(
    model, mode, compute_total, static,
    o_milli, o_whole, o_slices, o_compute, o_me, o_static_used,
    milli, whole, slices, compute, me, static_used,
    cpu_free, mem_free, free_before, mix_w, mix_task, mix_shape, mix_allowed, unusable, hosts, row,
):
    """node_frag after one GPU goes from the o_* state to the given one, without touching the sums."""
    old_free = gpu_free_units(mode, compute_total, o_milli, o_whole, o_slices, o_compute, static, o_static_used)
    free = free_before - old_free + gpu_free_units(mode, compute_total, milli, whole, slices, compute, static, static_used)
    total = 0.0
    for t in range(len(mix_w)):
        if mix_w[t] == 0.0:
            continue
        frag = free
        need = type_may_fit(t, model, cpu_free, mem_free, mix_task, mix_allowed)
        if need > 0:
            unusable_old, host_old = gpu_terms(
                mix_task[t, TASK_KIND], mix_task[t, TASK_MILLI], mix_shape[t, model], mode, compute_total,
                o_milli, o_whole, o_slices, o_compute, o_me, static, o_static_used,
            )
            unusable_new, host_new = gpu_terms(
                mix_task[t, TASK_KIND], mix_task[t, TASK_MILLI], mix_shape[t, model], mode, compute_total,
                milli, whole, slices, compute, me, static, static_used,
            )
            if hosts[row, t] - host_old + host_new >= need:
                frag = unusable[row, t] - unusable_old + unusable_new
        total += mix_w[t] * frag
    return total


@njit(cache=True)
def sigmoid_score(frag_before, frag_after):
    """FGD's node score: trunc(100 * sigmoid(-(frag growth in GPUs)))."""
    x = (frag_before - frag_after) / UNIT
    return float(math.floor(100.0 / (1.0 + math.exp(-x))))


# ----------------------------------------------------------------------------- GPU sets and scores
@helper
def pair_score(link_a, numa_a, base, a, b):
    """go-gpuallocator's pair affinity: 100 per NVLink, plus 20 same NUMA node, 10 across."""
    s = 100 * link_a[(base + a) * MAX_GPUS + b]
    if numa_a[base + a] == numa_a[base + b]:
        s += 20
    else:
        s += 10
    return s


@helper
def best_gpu_set(link_a, numa_a, base, count, free_mask, k, out, free_idx, pairs):
    """Best-connected k-subset of `free_mask`: the highest affinity; on ties, a set whose every pair is
    NVLinked (#15), then the fewest links cut to the GPUs left free, then the lowest.

    Writes the chosen local indices to `out` and returns the set's affinity score; `free_idx`
    (MAX_GPUS) and `pairs` (MAX_GPUS * MAX_GPUS) are scratch.
    """
    nfree = 0
    for j in range(count):
        if free_mask & (1 << j):
            free_idx[nfree] = j
            nfree += 1
    for a in range(nfree):
        for b in range(nfree):
            if a != b:
                pairs[a * MAX_GPUS + b] = pair_score(link_a, numa_a, base, free_idx[a], free_idx[b])
    best = -1
    best_score = -1
    best_cut = 0
    best_linked = False
    if k == 1:
        for a in range(nfree):
            cut = 0
            for b in range(nfree):
                if b != a:
                    cut += pairs[a * MAX_GPUS + b]
            if best < 0 or cut < best_cut:
                best = 1 << a
                best_cut = cut
                best_score = 0
    else:
        # Gosper's hack: every k-subset of the free GPUs in increasing order (bit i = free_idx[i],
        # so the order is that of the node's own GPU masks)
        sub = (1 << k) - 1
        limit = 1 << nfree
        while sub < limit:
            score = 0
            cut = 0
            linked = True  # every pair of the set NVLinked
            for a in range(nfree):
                if sub & (1 << a):
                    for b in range(nfree):
                        if b != a:
                            if sub & (1 << b):
                                if b > a:
                                    score += pairs[a * MAX_GPUS + b]
                                    if link_a[(base + free_idx[a]) * MAX_GPUS + free_idx[b]] == 0:
                                        linked = False
                            else:
                                cut += pairs[a * MAX_GPUS + b]
            if score > best_score or (
                score == best_score and ((linked and not best_linked) or (linked == best_linked and cut < best_cut))
            ):
                best = sub
                best_score = score
                best_cut = cut
                best_linked = linked
            lowest = sub & -sub
            ripple = sub + lowest
            sub = (((ripple ^ sub) >> 2) // lowest) | ripple
    n = 0
    for a in range(nfree):
        if best & (1 << a):
            out[n] = free_idx[a]
            n += 1
    return best_score


@helper
def set_topology(link_a, numa_a, base, count, free_mask, k, out, tmp_set, free_idx, pair_scratch):
    """Choose the best-connected k free GPUs (into `out`) and rate them 0..1: three quarters the share
    of their GPU pairs joined by NVLink, one quarter their affinity against the best set of k this
    node could offer with every GPU free."""
    score_set = best_gpu_set(link_a, numa_a, base, count, free_mask, k, out, free_idx, pair_scratch)
    ideal = best_gpu_set(link_a, numa_a, base, count, (1 << count) - 1, k, tmp_set, free_idx, pair_scratch)
    linked = 0
    for a in range(k):
        for b in range(a + 1, k):
            if link_a[(base + out[a]) * MAX_GPUS + out[b]] > 0:
                linked += 1
    pairs = k * (k - 1) // 2
    return 0.75 * linked / pairs + 0.25 * (score_set / ideal if ideal > 0 else 1.0)


@helper
def node_used_fraction(count, free):
    if count == 0:
        return 0.0
    return 1.0 - free / (count * UNIT)


# ----------------------------------------------------------------------------- the score
# A policy's score of a feasible node is one formula: the sum of weight * part over the parts its row of
# weights (`scoring.policies.POLICY_TABLE`) gives a weight, in the column order of `scoring.layout` (W_*).
# gpupack weighs its seven parts; each baseline weighs its own one part by 1; random and first-fit weigh
# none (score 0: the tie-break order decides). `weighted_part` defines every part, once.
@per_node
def node_score(n, nodes, gpus, models, ask, weights, max_price, max_memory, count, free_before, free_after,
               frag_before, frag_after, topo):
    """The policy's score of feasible node n (higher is better): Σ weights[part] * part, in column order."""
    score = 0.0
    for part in range(N_PARTS):
        weight = part_weight(part, weights, ask[REQ_KIND])
        if weight != 0.0:
            score += weighted_part(part, weight, n, nodes, gpus, models, ask, weights[FRAG_STEP], max_price,
                                   max_memory, count, free_before, free_after, frag_before, frag_after, topo)
    return score


@helper
def part_weight(part, weights, kind):
    """The weight of part `part` for a request of `kind`: W_FRAG has its own weight for MIG requests."""
    if part == W_FRAG and kind == KIND_MIG:
        return weights[W_MIG_FRAG]
    return weights[part]


@per_node
def weighted_part(part, weight, n, nodes, gpus, models, ask, frag_step, max_price, max_memory, count, free_before,
                  free_after, frag_before, frag_after, topo):
    """weight * part `part` (a W_* column) of node n's score; 0.0 where the part does not apply. Each
    expression is written as the reference writes it, so the two agree bit for bit."""
    kind = ask[REQ_KIND]
    if part == W_FRAG:
        return -weight * frag_growth(frag_before, frag_after, frag_step)
    if part == W_PACK:
        return weight * node_used_fraction(count, free_after)
    if part == W_TOPO:
        return weight * topo if kind == KIND_WHOLE and ask[REQ_GPUS] > 1 else 0.0
    if part == W_MODEL:
        if kind == KIND_NONE or max_memory <= 0:
            return 0.0
        return -(weight * models[MODEL_MEMORY][nodes[NODE_MODEL][n]] / max_memory)
    if part == W_SPOT:
        return weight if nodes[NODE_SPOT][n] and ask[REQ_INTERRUPTIBLE] else 0.0
    if part == W_SPOT_AVOID:
        return -weight if nodes[NODE_SPOT][n] and not ask[REQ_INTERRUPTIBLE] else 0.0
    if part == W_COST:  # the marginal cost of a pod is the price of the node it switches on
        price = nodes[NODE_PRICE][n]
        if max_price > 0 and not math.isnan(price) and nodes[NODE_PODS_FREE][n] == nodes[NODE_PODS_CAP][n]:
            return -(weight * price / max_price)
        return 0.0
    if part == W_FGD:
        return weight * sigmoid_score(frag_before, frag_after)
    demand_milli = (free_before - free_after) / MILLI_UNIT  # GPU milli this pod takes here
    left_milli = free_before / MILLI_UNIT
    if part == W_BESTFIT:
        return weight * bestfit_score(nodes[NODE_CPU_FREE][n], ask[REQ_CPU], left_milli, demand_milli)
    if part == W_DOT:
        return weight * dot_score(nodes[NODE_CPU_FREE][n], ask[REQ_CPU], left_milli, demand_milli)
    if part == W_CLUSTER:
        return weight * cluster_score(n, nodes[NODE_TAGS], kind, ask[REQ_GPUS], left_milli)
    if part == W_GPU_PACKING:
        if kind == KIND_NONE:
            return 0.0
        return weight * packing_score(n, gpus[GPU_MILLI], count, kind, ask[REQ_GPUS], ask[REQ_MILLI])
    if part == W_KUBE:
        return weight * kube_score(nodes[NODE_CPU_FREE][n], nodes[NODE_MEM_FREE][n], nodes[NODE_CPU_CAP][n],
                                   nodes[NODE_MEM_CAP][n], ask[REQ_CPU], ask[REQ_MEMORY])
    return 0.0


@helper
def frag_growth(frag_before, frag_after, step):
    """gpupack: the expected fragmentation a placement adds, in GPUs (the mix weights sum to 1); rounded to
    `step` GPUs when step > 0, so that near-equal nodes are told apart by the packing term."""
    growth = (frag_after - frag_before) / UNIT
    if step > 0.0:
        growth = math.floor(growth / step + 0.5) * step
    return growth


@helper
def bestfit_score(cpu_free, cpu, left_milli, demand_milli):
    """Best fit (ATC'23 baseline): the least CPU and GPU left over, 0..100."""
    raw = 0.5 * (cpu_free - cpu) / MAX_SPEC_CPU + 0.5 * (left_milli - demand_milli) / MAX_SPEC_GPU
    return float(math.floor((1.0 - raw) * 100.0))


@helper
def dot_score(cpu_free, cpu, left_milli, demand_milli):
    """Dot product (ATC'23 baseline): the free and requested CPU and GPU least aligned, 0..100."""
    dot = (cpu_free / MAX_SPEC_CPU) * (cpu / MAX_SPEC_CPU)
    dot += (left_milli / MAX_SPEC_GPU) * (demand_milli / MAX_SPEC_GPU)
    return float(math.floor(100.0 * (1.0 - dot / 2.0)))


@helper
def cluster_score(n, tags_a, kind, k_gpus, left_milli):
    """GpuClustering (ATC'23 baseline): nodes already running pods of the same GPU count (tag) first."""
    if kind == KIND_NONE:
        return 0.0
    tag = 0 if kind == KIND_SHARE else k_gpus  # (MIG requests count as tag 0)
    base_score = (25 * (8000 - int(left_milli))) // 8000
    first = n * (MAX_GPUS + 1)
    others = 0
    for t in range(MAX_GPUS + 1):
        if t != tag and tags_a[first + t] > 0:
            others += 1
    if tags_a[first + tag] > 0:
        return float(base_score + (75 if others == 0 else 50))
    return float(base_score + (25 if others == 0 else 0))


@helper
def kube_score(cpu_free, mem_free, cpu_cap, mem_cap, cpu, mem):
    """kube-scheduler's least-allocated CPU and memory, 0..100."""
    cpu_part = (cpu_free - cpu) * 100 // cpu_cap if cpu_cap > 0 else 0
    mem_part = (mem_free - mem) * 100 // mem_cap if mem_cap > 0 else 0
    return float((cpu_part + mem_part) // 2)


@helper
def packing_score(n, milli_a, count, kind, k_gpus, milli_req):
    """GpuPacking (ATC'23 baseline): shared GPUs first, then free GPUs on used nodes, then idle nodes."""
    base = n * MAX_GPUS
    nfree = 0
    for j in range(count):
        if milli_a[base + j] == MILLI_PER_GPU:
            nfree += 1
    if nfree == count:
        return float(max(33 - nfree, nfree))
    need = 1 if kind == KIND_SHARE else k_gpus
    per_gpu = milli_req if kind == KIND_SHARE else MILLI_PER_GPU
    taken = 0
    opened = 0
    total = 0
    used = 0
    while taken < need:
        pick = -1
        for j in range(count):
            if not (used & (1 << j)) and milli_a[base + j] >= per_gpu:
                if pick < 0 or milli_a[base + j] < milli_a[base + pick]:
                    pick = j
        if pick < 0:
            return 0.0
        used |= 1 << pick
        taken += 1
        if milli_a[base + pick] == MILLI_PER_GPU:
            opened += 1
        total += milli_a[base + pick] * 100 // MILLI_PER_GPU
    if opened > 0:
        return float(max(50 - opened, 33))
    return float(max(100 - total // 10, 50))


@helper
def candidate_maxima(active, model_a, count_a, price_a, model_memory, candidate):
    """(highest hourly price, largest GPU memory) over the candidate GPU nodes: the cost and
    model-fit terms are relative to them."""
    max_price = 0.0
    max_memory = 0.0
    for n in range(active.shape[0]):
        if candidate[n] and active[n] and count_a[n] > 0:
            if not math.isnan(price_a[n]) and price_a[n] > max_price:
                max_price = price_a[n]
            if model_memory[model_a[n]] > max_memory:
                max_memory = model_memory[model_a[n]]
    return max_price, max_memory


def make_scratch(types: int, width: int) -> tuple[np.ndarray, ...]:
    """Working arrays for `schedule` (for `types` task types and requests of up to `width` slots), in the
    order of `scoring.layout.SCRATCH_*`, made once by the caller: the kernel allocates nothing, so it
    runs without reference counting."""
    return (
        np.zeros((1, types), dtype=np.int64),  # unusable and hosts of a node being changed
        np.zeros((1, types), dtype=np.int64),
        np.zeros((LOCAL_ROWS, MAX_GPUS), dtype=np.int64),  # local: GPU state of a node being changed
        np.zeros(width, dtype=np.int32),  # the current node's placement: GPU, MIG start, shape
        np.zeros(width, dtype=np.int32),
        np.zeros(width, dtype=np.int32),
        np.zeros(MAX_GPUS, dtype=np.int32),  # best_gpu_set's output for the ideal set
        np.zeros(MAX_GPUS, dtype=np.int64),  # best_gpu_set's scratch
        np.zeros(MAX_GPUS * MAX_GPUS, dtype=np.int64),
        np.zeros((MAX_GPUS, types), dtype=np.int64),  # node_summary: per-GPU terms
        np.zeros((MAX_GPUS, types), dtype=np.int64),
    )


# ----------------------------------------------------------------------------- one node
@per_node
def request_values(request):
    """The request's scalars as values, in REQ_* order (`ask`): read once per call, not once per node."""
    scalars = request[REQUEST_SCALARS]
    return (
        scalars[REQ_KIND], scalars[REQ_CPU], scalars[REQ_MEMORY], scalars[REQ_GPUS], scalars[REQ_MILLI],
        scalars[REQ_INTERRUPTIBLE], scalars[REQ_INSTANCES],
    )


@per_node
def node_geometry(n, nodes, models):
    """(model, mode, compute_total, base, count) of node n (`geometry`): read once per node."""
    model = nodes[NODE_MODEL][n]
    return model, nodes[NODE_MIG_MODE][n], models[MODEL_COMPUTE][model], n * MAX_GPUS, nodes[NODE_GPU_COUNT][n]


@per_node
def hardware_verdict(n, nodes, request, ask):
    """What node n lacks for the request whatever runs on it (OK when nothing): no GPU or too few for
    the request, no MIG, or no such MIG profile on its model (reference: `hardware_verdict`)."""
    kind = ask[REQ_KIND]
    count = nodes[NODE_GPU_COUNT][n]
    if (kind == KIND_WHOLE and ask[REQ_GPUS] > count) or (kind == KIND_SHARE and count == 0):
        return TOO_FEW_GPUS
    if kind == KIND_MIG:
        if nodes[NODE_MIG_MODE][n] == MODE_NONE or count == 0:
            return NOT_MIG
        shapes = request[REQUEST_SHAPES]
        model = nodes[NODE_MODEL][n]
        for q in range(ask[REQ_INSTANCES]):
            if shapes[q, model] < 0:
                return NO_PROFILE
    return OK


@per_node
def early_verdict(n, nodes, request, ask, rules):
    """The first check node n fails before its GPUs are read (OK when none); reference: `early_verdict`.
    What the node lacks whatever runs on it comes first: no preemption can change that verdict."""
    verdict = hardware_verdict(n, nodes, request, ask)
    if verdict != OK:
        return verdict
    if nodes[NODE_CPU_FREE][n] < ask[REQ_CPU]:
        return NO_CPU
    if nodes[NODE_MEM_FREE][n] < ask[REQ_MEMORY]:
        return NO_MEMORY
    if nodes[NODE_PODS_FREE][n] < 1:
        return NO_POD_SLOT
    if ask[REQ_KIND] != KIND_NONE and not request[REQUEST_ALLOWED][nodes[NODE_MODEL][n]]:
        return MODEL_NOT_ALLOWED
    if nodes[NODE_SPOT][n] and not ask[REQ_INTERRUPTIBLE] and rules[RULE_SPOT_FORBID]:
        return SPOT_FORBIDDEN
    return OK


@per_node
def node_state(n, geometry, nodes, gpus, mix, cache, scratch, uses_frag):
    """(free units, mask of untouched plain GPUs, mask of plain GPUs, fragmentation) of node n as it is.

    The node's sums (cache[CACHE_UNUSABLE][n], cache[CACHE_HOSTS][n]), free units and masks are read
    again only when its version changed; its fragmentation also when the mix weights did.
    """
    model, mode, compute_total, base, count = geometry
    cache_unusable = cache[CACHE_UNUSABLE]
    cache_hosts = cache[CACHE_HOSTS]
    fresh = cache[CACHE_STAMP][n] != nodes[NODE_VERSION][n]
    if fresh:
        free, free_mask, plain_mask = node_summary(
            model, mode, compute_total, base, count, gpus[GPU_MILLI], gpus[GPU_WHOLE], gpus[GPU_SLICES],
            gpus[GPU_COMPUTE], gpus[GPU_ME], gpus[GPU_STATIC], gpus[GPU_STATIC_USED],
            mix[MIX_WEIGHT], mix[MIX_TASK], mix[MIX_SHAPE], cache_unusable, cache_hosts, n,
            scratch[SCRATCH_GPU_UNUSABLE], scratch[SCRATCH_GPU_HOSTS],
        )
        cache[CACHE_FREE][n] = free
        cache[CACHE_FREE_MASK][n] = free_mask
        cache[CACHE_PLAIN_MASK][n] = plain_mask
        cache_topo = cache[CACHE_TOPO]
        for size in range(MAX_GPUS + 1):
            cache_topo[n, size] = -1.0
        cache[CACHE_PRISTINE][n] = is_pristine(n, geometry, nodes, gpus)
        cache[CACHE_STAMP][n] = nodes[NODE_VERSION][n]
    else:
        free = cache[CACHE_FREE][n]
        free_mask = cache[CACHE_FREE_MASK][n]
        plain_mask = cache[CACHE_PLAIN_MASK][n]
    frag = 0.0
    if uses_frag:
        weights_version = cache[CACHE_WEIGHTS_VERSION]
        if not fresh and cache[CACHE_WEIGHTS_STAMP][n] == weights_version:
            frag = cache[CACHE_FRAG][n]
        else:
            frag = node_frag(
                model, nodes[NODE_CPU_FREE][n], nodes[NODE_MEM_FREE][n], free, mix[MIX_WEIGHT], mix[MIX_TASK],
                mix[MIX_ALLOWED], cache_unusable, cache_hosts, n,
            )
            cache[CACHE_FRAG][n] = frag
            cache[CACHE_WEIGHTS_STAMP][n] = weights_version
    return free, free_mask, plain_mask, frag


@per_node
def is_pristine(n, geometry, nodes, gpus):
    """Whether nothing runs on node n: all its capacity free, every GPU untouched (a static MIG layout's
    +me marks are hardware, not use). Such nodes of one class (NODE_CLASS) are alike in every way a
    kernel reads."""
    model, mode, compute_total, base, count = geometry
    if (nodes[NODE_CPU_FREE][n] != nodes[NODE_CPU_CAP][n] or nodes[NODE_MEM_FREE][n] != nodes[NODE_MEM_CAP][n]
            or nodes[NODE_PODS_FREE][n] != nodes[NODE_PODS_CAP][n]):
        return False
    tags = nodes[NODE_TAGS]
    for t in range(n * (MAX_GPUS + 1), (n + 1) * (MAX_GPUS + 1)):
        if tags[t] != 0:
            return False
    for i in range(base, base + count):
        if (gpus[GPU_MILLI][i] != MILLI_PER_GPU or gpus[GPU_WHOLE][i] or gpus[GPU_SLICES][i] != 0
                or gpus[GPU_COMPUTE][i] != 0 or gpus[GPU_STATIC_USED][i] != 0
                or (mode != MODE_STATIC and gpus[GPU_ME][i] != 0)):
            return False
    return True


@per_node
def share_frag_after(n, geometry, gpus, mix, cache, j, milli_req, free_before, cpu_after, mem_after):
    """Fragmentation of node n after a share of `milli_req` on its plain GPU j."""
    model, mode, compute_total, base, count = geometry
    left = gpus[GPU_MILLI][base + j]
    me = gpus[GPU_ME][base + j]
    static_used = gpus[GPU_STATIC_USED][base + j]
    return frag_after_change(
        model, mode, compute_total, 0, left, False, 0, 0, me, static_used, left - milli_req, False, 0, 0, me,
        static_used, cpu_after, mem_after, free_before, mix[MIX_WEIGHT], mix[MIX_TASK], mix[MIX_SHAPE],
        mix[MIX_ALLOWED], cache[CACHE_UNUSABLE], cache[CACHE_HOSTS], n,
    )


@helper
def share_slack(left, milli_req, slack_weight, mix_w, mix_task):
    """What a share of `milli_req` on a plain GPU with `left` milli free adds to the fragmentation after it
    (units; reference: `share_slack`): `slack_weight` times the milli the GPU keeps beyond the largest
    share type of the mix that still fits there, i.e. what even the best-matching next share would strand."""
    if slack_weight == 0.0:
        return 0.0
    rest = left - milli_req
    fit = 0
    for t in range(len(mix_w)):
        size = mix_task[t, TASK_MILLI]
        if mix_w[t] > 0.0 and mix_task[t, TASK_KIND] == KIND_SHARE and fit < size <= rest:
            fit = size
    return slack_weight * ((rest - fit) * MILLI_UNIT)


@per_node
def share_choice(
    n, geometry, gpus, mix, cache, scratch, pick_rule, milli_req, noise, plain_mask, free_before, frag_before,
    cpu_after, mem_after, weights,
):
    """A share (reference: `share_pick`): the plain GPU with `milli_req` free that the policy's `pick_rule`
    (PICK_*) prefers, into scratch slot 0; returns (verdict, free units after, fragmentation after, with
    `share_slack` under PICK_LEAST_FRAG)."""
    model, mode, compute_total, base, count = geometry
    milli_a = gpus[GPU_MILLI]
    hosts = 0
    for j in range(count):
        if (plain_mask >> j) & 1 and milli_a[base + j] >= milli_req:
            hosts += 1
    if hosts == 0:
        return NO_GPU, free_before, frag_before
    pick = int(noise[n] * hosts) if pick_rule == PICK_RANDOM else 0
    seen = 0
    best_j = -1
    best_key = 0.0
    best_left = 0
    frag_after = frag_before
    for j in range(count):
        left = milli_a[base + j]
        if not (plain_mask >> j) & 1 or left < milli_req:
            continue
        if pick_rule == PICK_RANDOM:
            if seen == pick:
                best_j = j
            seen += 1
        elif pick_rule == PICK_FIRST:
            if best_j < 0:
                best_j = j
        elif pick_rule == PICK_BEST_FIT:  # the tightest GPU, lowest index on ties
            if best_j < 0 or left < best_left:
                best_j = j
                best_left = left
        else:
            # fragmentation-aware: evaluate this GPU choice, once per distinct free amount (the same
            # amount gives the same fragmentation, and ties keep the lowest index anyway)
            duplicate = False
            for o in range(j):
                if (plain_mask >> o) & 1 and milli_a[base + o] == left:
                    duplicate = True
                    break
            if duplicate:
                continue
            f_after = share_frag_after(n, geometry, gpus, mix, cache, j, milli_req, free_before, cpu_after, mem_after)
            if pick_rule == PICK_FGD:  # the highest FGD score
                key = sigmoid_score(frag_before, f_after)
                better = best_j < 0 or key > best_key
            else:  # least fragmentation, then the tightest GPU
                f_after += share_slack(left, milli_req, weights[W_SHARE_SLACK], mix[MIX_WEIGHT], mix[MIX_TASK])
                key = -f_after
                better = best_j < 0 or key > best_key or (key == best_key and left < best_left)
            if better:
                best_j = j
                best_key = key
                best_left = left
                frag_after = f_after
    scratch[SCRATCH_GPU][0] = best_j
    scratch[SCRATCH_START][0] = -1
    scratch[SCRATCH_SHAPE][0] = -1
    return OK, free_before - milli_req * MILLI_UNIT, frag_after


@per_node
def pick_whole_gpus(n, geometry, gpus, cache, scratch, by_topology, k_gpus, free_mask):
    """`k_gpus` free GPUs of node n into the scratch slots; returns their topology rating (1.0 unless rated).

    Topology-aware policies (`by_topology`: RULE_SETS) take the best-connected set of two or more, cached per node and size while
    the node is unchanged (it depends on the free GPUs only); others, and one GPU, the lowest free ones
    (a single GPU is placed by `finish_choice` once the node is chosen: every free GPU scores the same).
    """
    model, mode, compute_total, base, count = geometry
    chosen_gpus = scratch[SCRATCH_GPU]
    topo = 1.0
    if by_topology and k_gpus > 1:
        cache_set = cache[CACHE_SET]
        cache_topo = cache[CACHE_TOPO]
        if cache_topo[n, k_gpus] >= 0.0:
            m = 0
            for j in range(count):
                if cache_set[n, k_gpus] & (1 << j):
                    chosen_gpus[m] = j
                    m += 1
            topo = cache_topo[n, k_gpus]
        else:
            topo = set_topology(
                gpus[GPU_LINK], gpus[GPU_NUMA], base, count, free_mask, k_gpus, chosen_gpus,
                scratch[SCRATCH_IDEAL_SET], scratch[SCRATCH_FREE_IDX], scratch[SCRATCH_PAIRS],
            )
            chosen = 0
            for m in range(k_gpus):
                chosen |= 1 << chosen_gpus[m]
            cache_set[n, k_gpus] = chosen
            cache_topo[n, k_gpus] = topo
    else:
        m = 0
        for j in range(count):
            if free_mask & (1 << j) and m < k_gpus:
                chosen_gpus[m] = j
                m += 1
    for m in range(k_gpus):
        scratch[SCRATCH_START][m] = -1
        scratch[SCRATCH_SHAPE][m] = -1
    return topo


@per_node
def whole_frag_after(n, geometry, gpus, mix, cache, scratch, k_gpus, free_before, cpu_after, mem_after):
    """Fragmentation of node n once the `k_gpus` GPUs in the scratch slots are taken whole."""
    model, mode, compute_total, base, count = geometry
    chosen_gpus = scratch[SCRATCH_GPU]
    if k_gpus == 1:
        i = base + chosen_gpus[0]
        me = gpus[GPU_ME][i]
        static_used = gpus[GPU_STATIC_USED][i]
        return frag_after_change(
            model, mode, compute_total, 0, MILLI_PER_GPU, False, 0, 0, me, static_used, 0, True, 0, 0, me, static_used,
            cpu_after, mem_after, free_before, mix[MIX_WEIGHT], mix[MIX_TASK], mix[MIX_SHAPE], mix[MIX_ALLOWED],
            cache[CACHE_UNUSABLE], cache[CACHE_HOSTS], n,
        )
    local = scratch[SCRATCH_LOCAL]
    unusable = scratch[SCRATCH_UNUSABLE]
    hosts = scratch[SCRATCH_HOSTS]
    load_local(
        base, count, gpus[GPU_MILLI], gpus[GPU_WHOLE], gpus[GPU_SLICES], gpus[GPU_COMPUTE], gpus[GPU_ME],
        gpus[GPU_STATIC_USED], local, cache[CACHE_UNUSABLE], cache[CACHE_HOSTS], n, unusable, hosts,
    )
    free_change = 0
    for m in range(k_gpus):
        j = chosen_gpus[m]
        static = gpus[GPU_STATIC][base + j]
        free_change += add_gpu_terms(
            -1, j, model, mode, compute_total, static, mix[MIX_WEIGHT], mix[MIX_TASK], mix[MIX_SHAPE], local,
            unusable, hosts, 0,
        )
        local[LOCAL_WHOLE, j] = True
        local[LOCAL_MILLI, j] = 0
        free_change += add_gpu_terms(
            1, j, model, mode, compute_total, static, mix[MIX_WEIGHT], mix[MIX_TASK], mix[MIX_SHAPE], local,
            unusable, hosts, 0,
        )
    return node_frag(
        model, cpu_after, mem_after, free_before + free_change, mix[MIX_WEIGHT], mix[MIX_TASK], mix[MIX_ALLOWED],
        unusable, hosts, 0,
    )


@per_node
def whole_choice(
    n, geometry, gpus, mix, cache, scratch, rules, k_gpus, free_mask, free_before, frag_before, cpu_after,
    mem_after,
):
    """Whole GPUs (reference: `whole_pick`): `k_gpus` untouched GPUs into the scratch slots; returns
    (verdict, free units after, fragmentation after, topology rating)."""
    if popcount(free_mask) < k_gpus:
        return NO_GPU, free_before, frag_before, 1.0
    topo = pick_whole_gpus(n, geometry, gpus, cache, scratch, rules[RULE_SETS], k_gpus, free_mask)
    frag_after = frag_before
    if rules[RULE_FRAG]:
        frag_after = whole_frag_after(n, geometry, gpus, mix, cache, scratch, k_gpus, free_before, cpu_after,
                                      mem_after)
    return OK, free_before - k_gpus * UNIT, frag_after, topo


@per_node
def instance_frag_after(
    geometry, gpus, mix, scratch, j, shape, start, pid, need_me, running_free, cpu_after, mem_after,
):
    """gpupack's MIG key: fragmentation of node n (its changed copy in scratch) after one more instance of
    `shape` on GPU j (static: placement `pid`; dynamic: at slice `start`)."""
    model, mode, compute_total, base, count = geometry
    local = scratch[SCRATCH_LOCAL]
    if mode == MODE_STATIC:
        new_slices = local[LOCAL_SLICES, j]
        new_compute = local[LOCAL_COMPUTE, j]
        new_static_used = local[LOCAL_STATIC_USED, j] | (1 << pid)
        new_me = local[LOCAL_ME, j]
    else:
        new_slices = local[LOCAL_SLICES, j] | (((1 << SHAPE_SIZE[shape]) - 1) << start)
        new_compute = local[LOCAL_COMPUTE, j] + SHAPE_COMPUTE[shape]
        new_static_used = local[LOCAL_STATIC_USED, j]
        new_me = local[LOCAL_ME, j] | need_me
    return frag_after_change(
        model, mode, compute_total, gpus[GPU_STATIC][base + j],
        local[LOCAL_MILLI, j], local[LOCAL_WHOLE, j], local[LOCAL_SLICES, j], local[LOCAL_COMPUTE, j],
        local[LOCAL_ME, j], local[LOCAL_STATIC_USED, j],
        local[LOCAL_MILLI, j], local[LOCAL_WHOLE, j], new_slices, new_compute, new_me, new_static_used,
        cpu_after, mem_after, running_free, mix[MIX_WEIGHT], mix[MIX_TASK], mix[MIX_SHAPE], mix[MIX_ALLOWED],
        scratch[SCRATCH_UNUSABLE], scratch[SCRATCH_HOSTS], 0,
    )


@per_node
def best_instance(geometry, gpus, mix, scratch, pick_rule, shape, need_me, running_free, cpu_after, mem_after):
    """Where one more MIG instance of `shape` goes on node n's changed copy: (GPU, start, placement id),
    GPU -1 when none fits. By `pick_rule`: PICK_LEAST_FRAG least fragmentation, then the fullest GPU,
    then the lowest GPU and on it the highest start; PICK_FULLEST_LEAST_FRAG the fullest GPU, then least
    fragmentation, then as PICK_LEAST_FRAG; PICK_FIRST the first option; PICK_BEST_FIT the fullest GPU,
    lowest GPU and start on ties."""
    model, mode, compute_total, base, count = geometry
    local = scratch[SCRATCH_LOCAL]
    best_j = -1
    best_start = -1
    best_pid = -1
    best_key = 0.0
    best_used = 0
    for j in range(count):
        static = gpus[GPU_STATIC][base + j]
        if mig_fit(shape, mode, compute_total, local[LOCAL_MILLI, j], local[LOCAL_WHOLE, j], local[LOCAL_SLICES, j],
                   local[LOCAL_COMPUTE, j], local[LOCAL_ME, j], static, local[LOCAL_STATIC_USED, j], need_me) == 0:
            continue
        if mode == MODE_STATIC:
            used_units = popcount(local[LOCAL_STATIC_USED, j])
            options = static_options(shape, local[LOCAL_ME, j], static, local[LOCAL_STATIC_USED, j], need_me)
        else:
            used_units = local[LOCAL_COMPUTE, j]
            options = FREE_STARTS[shape, local[LOCAL_SLICES, j]]
        n_options = len(PLACEMENT_SHAPE) if mode == MODE_STATIC else 8
        for option in range(n_options):
            if not (options >> option) & 1:
                continue
            # static: options are placement ids; dynamic: start slices
            pid = option
            start = PLACEMENT_START[option] if mode == MODE_STATIC else option
            key = 0.0
            if pick_rule == PICK_LEAST_FRAG or pick_rule == PICK_FULLEST_LEAST_FRAG:
                key = -instance_frag_after(geometry, gpus, mix, scratch, j, shape, start, pid, need_me, running_free,
                                           cpu_after, mem_after)
                # less fragmentation and a fuller GPU, in the rule's order; then the highest start
                first_better, first_same = key > best_key, key == best_key
                then_better, then_same = used_units > best_used, used_units == best_used
                if pick_rule == PICK_FULLEST_LEAST_FRAG:
                    first_better, first_same, then_better, then_same = then_better, then_same, first_better, first_same
                better = best_j < 0 or first_better or (
                    first_same and (then_better or (then_same and j == best_j and start > best_start))
                )
            elif pick_rule == PICK_FIRST:
                better = best_j < 0
            else:  # best fit: the fullest GPU that fits, lowest start
                better = best_j < 0 or used_units > best_used
            if better:
                best_j = j
                best_start = start
                best_pid = pid
                best_key = key
                best_used = used_units
    return best_j, best_start, best_pid


@per_node
def take_instance(geometry, gpus, mix, scratch, j, shape, start, pid, need_me):
    """Take one MIG instance on GPU j of node n's changed copy, its sums updated; returns the change in free units."""
    model, mode, compute_total, base, count = geometry
    local = scratch[SCRATCH_LOCAL]
    unusable = scratch[SCRATCH_UNUSABLE]
    hosts = scratch[SCRATCH_HOSTS]
    static = gpus[GPU_STATIC][base + j]
    change = add_gpu_terms(
        -1, j, model, mode, compute_total, static, mix[MIX_WEIGHT], mix[MIX_TASK], mix[MIX_SHAPE], local, unusable,
        hosts, 0,
    )
    if mode == MODE_STATIC:
        local[LOCAL_STATIC_USED, j] |= 1 << pid
    else:
        local[LOCAL_SLICES, j] |= ((1 << SHAPE_SIZE[shape]) - 1) << start
        local[LOCAL_COMPUTE, j] += SHAPE_COMPUTE[shape]
        if need_me:
            local[LOCAL_ME, j] = 1
    change += add_gpu_terms(
        1, j, model, mode, compute_total, static, mix[MIX_WEIGHT], mix[MIX_TASK], mix[MIX_SHAPE], local, unusable,
        hosts, 0,
    )
    return change


@per_node
def mig_choice(n, geometry, gpus, request, ask, mix, cache, scratch, rules, free_before, frag_before, cpu_after,
               mem_after):
    """MIG instances (reference: `mig_pick`), largest first, each where `best_instance` puts it on a copy
    of the node that the earlier ones changed, into the scratch slots; returns (verdict, free units
    after, fragmentation after)."""
    model, mode, compute_total, base, count = geometry
    unusable = scratch[SCRATCH_UNUSABLE]
    hosts = scratch[SCRATCH_HOSTS]
    load_local(
        base, count, gpus[GPU_MILLI], gpus[GPU_WHOLE], gpus[GPU_SLICES], gpus[GPU_COMPUTE], gpus[GPU_ME],
        gpus[GPU_STATIC_USED], scratch[SCRATCH_LOCAL], cache[CACHE_UNUSABLE], cache[CACHE_HOSTS], n, unusable, hosts,
    )
    running_free = free_before
    for q in range(ask[REQ_INSTANCES]):
        shape = request[REQUEST_SHAPES][q, model]  # the model has it (`hardware_verdict`)
        need_me = request[REQUEST_ME][q]
        j, start, pid = best_instance(geometry, gpus, mix, scratch, rules[RULE_MIG], shape, need_me, running_free,
                                      cpu_after, mem_after)
        if j < 0:
            return NO_MIG, free_before, frag_before
        running_free += take_instance(geometry, gpus, mix, scratch, j, shape, start, pid, need_me)
        scratch[SCRATCH_GPU][q] = j
        scratch[SCRATCH_START][q] = start
        scratch[SCRATCH_SHAPE][q] = shape
    if rules[RULE_FRAG]:
        frag_after = node_frag(
            model, cpu_after, mem_after, running_free, mix[MIX_WEIGHT], mix[MIX_TASK], mix[MIX_ALLOWED], unusable,
            hosts, 0,
        )
        return OK, running_free, frag_after
    return OK, running_free, frag_before


@per_node
def cpu_only_frag(n, geometry, mix, cache, cpu_after, mem_after, free_before):
    """CPU and memory only (reference: `evaluate`, Kind.NONE): fragmentation of node n after."""
    return node_frag(
        geometry[0], cpu_after, mem_after, free_before, mix[MIX_WEIGHT], mix[MIX_TASK], mix[MIX_ALLOWED],
        cache[CACHE_UNUSABLE], cache[CACHE_HOSTS], n,
    )


@per_node
def evaluate_node(n, nodes, gpus, models, request, ask, mix, policy, noise, max_price, max_memory, cache, scratch):
    """Verdict of node n, its score before the rank term (-inf when infeasible) and its placement's slot
    count; the placement itself goes to the scratch slots. Reference: `scoring.reference.evaluate`."""
    rules = policy[POLICY_RULES]
    verdict = early_verdict(n, nodes, request, ask, rules)
    if verdict != OK:
        return verdict, -np.inf, 0
    geometry = node_geometry(n, nodes, models)
    uses_frag = rules[RULE_FRAG] != 0
    free_before, free_mask, plain_mask, frag_before = node_state(n, geometry, nodes, gpus, mix, cache, scratch,
                                                                 uses_frag)
    kind = ask[REQ_KIND]
    cpu_after = nodes[NODE_CPU_FREE][n] - ask[REQ_CPU]
    mem_after = nodes[NODE_MEM_FREE][n] - ask[REQ_MEMORY]
    slots = 0
    free_after = free_before
    frag_after = frag_before
    topo = 1.0
    if kind == KIND_SHARE:
        slots = 1
        verdict, free_after, frag_after = share_choice(
            n, geometry, gpus, mix, cache, scratch, rules[RULE_SHARE], ask[REQ_MILLI], noise, plain_mask,
            free_before, frag_before, cpu_after, mem_after, policy[POLICY_WEIGHTS],
        )
    elif kind == KIND_WHOLE:
        slots = ask[REQ_GPUS]
        verdict, free_after, frag_after, topo = whole_choice(
            n, geometry, gpus, mix, cache, scratch, rules, slots, free_mask, free_before, frag_before, cpu_after,
            mem_after,
        )
    elif kind == KIND_MIG:
        slots = ask[REQ_INSTANCES]
        verdict, free_after, frag_after = mig_choice(
            n, geometry, gpus, request, ask, mix, cache, scratch, rules, free_before, frag_before, cpu_after,
            mem_after,
        )
    elif uses_frag:
        frag_after = cpu_only_frag(n, geometry, mix, cache, cpu_after, mem_after, free_before)
    if verdict != OK:
        return verdict, -np.inf, 0
    score = node_score(
        n, nodes, gpus, models, ask, policy[POLICY_WEIGHTS], max_price, max_memory, geometry[4], free_before,
        free_after, frag_before, frag_after, topo,
    )
    return OK, score, slots


# ----------------------------------------------------------------------------- the memo
# The memo keeps each node's verdict and score for as long as its version is unchanged and its epoch
# is current: the caller starts a new epoch when the request, the policy or the mix weights change,
# and `memo_epoch` does when the candidates' price or memory maxima do. A node read from the memo is
# not scored again; when it wins, it alone is scored once more after the loop, for its placement.
# kube-scheduler sends the same candidates pod after pod and a decision changes one node, so nearly
# every node is read from the memo. A policy whose GPU choice draws on `noise` (PICK_RANDOM) bypasses it.
# A simulator's request changes from pod to pod, and with it the epoch; but a pristine node (nothing
# runs on it) scores as every pristine node of its class does, so one of them is scored per class and
# epoch (the class memo) and the others read it: early in a run that is most of the cluster.
@per_node
def memo_epoch(memo, max_price, max_memory):
    """The memo's current epoch; a new one when the candidates' price or memory maxima changed (the
    cost and model-fit terms are relative to them)."""
    maxima = memo[MEMO_MAXIMA]
    current = memo[MEMO_CURRENT]
    if maxima[0] != max_price or maxima[1] != max_memory:
        current[0] += 1
        maxima[0] = max_price
        maxima[1] = max_memory
    return current[0]


@per_node
def memo_holds(memo, n, version, epoch):
    """Whether the memo's verdict and score of node n are current (same node version, same epoch)."""
    return memo[MEMO_STAMP][n] == version and memo[MEMO_EPOCH][n] == epoch


@per_node
def memo_store(memo, n, version, epoch, verdict, score):
    """Keep node n's verdict and score (before the rank term) for this version and epoch."""
    memo[MEMO_STAMP][n] = version
    memo[MEMO_EPOCH][n] = epoch
    memo[MEMO_VERDICT][n] = verdict
    memo[MEMO_SCORE][n] = score


@per_node
def class_memo_holds(memo, cache, n, version, cls, epoch):
    """Whether node n is pristine as of its version and a pristine node of its class was scored this epoch."""
    return cache[CACHE_STAMP][n] == version and cache[CACHE_PRISTINE][n] and memo[MEMO_CLASS_EPOCH][cls] == epoch


@per_node
def class_memo_store(memo, cache, n, version, cls, epoch, verdict, score):
    """Keep node n's verdict and score for its whole class when n is pristine (its cache is current)."""
    if cache[CACHE_STAMP][n] == version and cache[CACHE_PRISTINE][n]:
        memo[MEMO_CLASS_EPOCH][cls] = epoch
        memo[MEMO_CLASS_VERDICT][cls] = verdict
        memo[MEMO_CLASS_SCORE][cls] = score


@helper
def rank_term(weights, kind, n_nodes):
    """(weight, span) of the rank term, weight * rank / span (`layout.ORDER_MIN_NODES` says why two)."""
    if kind == KIND_MIG:
        return max(weights[W_MIG_ORDER], 0.0), max(n_nodes, MIG_ORDER_MIN_NODES)
    return max(weights[W_ORDER], 0.0), max(n_nodes, ORDER_MIN_NODES)


@per_node
def beats(score, n, best, best_score, rank):
    """Whether node n's score wins over the best so far (none when best < 0); ties go to the lowest rank."""
    return best < 0 or score > best_score or (score == best_score and rank[n] < rank[best])


@per_node
def keep_placement(scratch, out, slots):
    """Copy the current node's placement (scratch slots) to the chosen one's (out)."""
    for q in range(slots):
        out[OUT_GPU][q] = scratch[SCRATCH_GPU][q]
        out[OUT_START][q] = scratch[SCRATCH_START][q]
        out[OUT_SHAPE][q] = scratch[SCRATCH_SHAPE][q]


# ----------------------------------------------------------------------------- the driver
@njit(cache=True, nogil=True, _nrt=False)  # type: ignore[call-overload]  # _nrt: numba's stubs leave out its underscore options
def schedule(nodes, gpus, models, request, candidate, mix, policy, rank, noise, cache, memo, scratch, out):
    """Score every candidate node; returns (best node or -1, slots) with its placement in `out`.

    Arguments (tuples in the column order of `scoring.layout`, which documents each array):
    nodes, gpus, models: the inventory's arrays (NODE_*, GPU_*, MODEL_*); request: the request's scalars,
    MIG shapes, +me flags and allowed models (REQUEST_*); candidate: bool per node, the rows the caller
    allows; mix: the policy's task types (MIX_*); policy: its row of the policy table, (rules, weights)
    (POLICY_*, RULE_*, W_*); rank: per node, ties on score go to the lowest; noise: per node in [0, 1),
    the draw of PICK_RANDOM; cache: per-node sums kept while a node's version is unchanged (CACHE_*);
    memo: per-node verdicts and scores (MEMO_*, see "the memo" above); scratch: from `make_scratch`;
    out: per node score and verdict, the chosen node's GPU, MIG start and shape per slot (OUT_*). The
    GIL is released while it runs.
    """
    active = nodes[NODE_ACTIVE]
    version = nodes[NODE_VERSION]
    node_class = nodes[NODE_CLASS]
    scores = out[OUT_SCORE]
    verdicts = out[OUT_VERDICT]
    max_price, max_memory = candidate_maxima(
        active, nodes[NODE_MODEL], nodes[NODE_GPU_COUNT], nodes[NODE_PRICE], models[MODEL_MEMORY], candidate
    )
    epoch = memo_epoch(memo, max_price, max_memory)
    ask = request_values(request)
    use_memo = policy[POLICY_RULES][RULE_SHARE] != PICK_RANDOM
    n_nodes = active.shape[0]
    order_weight, order_span = rank_term(policy[POLICY_WEIGHTS], ask[REQ_KIND], n_nodes)
    best = -1
    best_slots = 0
    best_score = 0.0
    redo = -1  # the best node so far was read from the memo: its placement is still to be found
    for step in range(n_nodes + 1):
        if step < n_nodes:
            n = step
        elif redo >= 0:
            n = redo  # scored again, now only for its placement
        else:
            break
        if not (candidate[n] and active[n]):
            verdicts[n] = NOT_CANDIDATE
            scores[n] = -np.inf
            continue
        cls = node_class[n]
        if (use_memo and step < n_nodes and not memo_holds(memo, n, version[n], epoch)
                and class_memo_holds(memo, cache, n, version[n], cls, epoch)):
            memo_store(memo, n, version[n], epoch, memo[MEMO_CLASS_VERDICT][cls], memo[MEMO_CLASS_SCORE][cls])
        if use_memo and step < n_nodes and memo_holds(memo, n, version[n], epoch):
            verdicts[n] = memo[MEMO_VERDICT][n]
            if memo[MEMO_VERDICT][n] != OK:
                scores[n] = -np.inf
                continue
            score = memo[MEMO_SCORE][n] - order_weight * rank[n] / order_span
            scores[n] = score
            if beats(score, n, best, best_score, rank):
                best = n
                best_score = score
                redo = n
            continue
        verdict, raw, slots = evaluate_node(
            n, nodes, gpus, models, request, ask, mix, policy, noise, max_price, max_memory, cache, scratch
        )
        if step < n_nodes:
            memo_store(memo, n, version[n], epoch, verdict, raw)
            class_memo_store(memo, cache, n, version[n], cls, epoch, verdict, raw)
        verdicts[n] = verdict
        if verdict != OK:
            scores[n] = -np.inf
            continue
        score = raw - order_weight * rank[n] / order_span  # consolidation (W_ORDER): keep filling early nodes
        scores[n] = score
        if step == n_nodes or beats(score, n, best, best_score, rank):
            best = n
            best_score = score
            redo = -1
            best_slots = slots
            keep_placement(scratch, out, slots)
    if best >= 0:  # scored in this call, so its cached free mask is current
        finish_choice(
            best, request[REQUEST_SCALARS], policy[POLICY_RULES][RULE_SETS], gpus[GPU_NUMA], gpus[GPU_LINK],
            nodes[NODE_GPU_COUNT][best], cache[CACHE_FREE_MASK][best], out[OUT_GPU], scratch[SCRATCH_FREE_IDX],
            scratch[SCRATCH_PAIRS],
        )
    return best, best_slots


@helper
def finish_choice(best, scalars, by_topology, numa_a, link_a, count, free_mask, best_gpu, free_idx, pair_scratch):
    """Complete the winner's placement: a single whole GPU goes where taking it cuts the fewest links
    among the node's free GPUs `free_mask` (every free GPU scored the same, so only the winner is refined)."""
    if scalars[REQ_KIND] != KIND_WHOLE or scalars[REQ_GPUS] != 1 or not by_topology:
        return
    best_gpu_set(link_a, numa_a, best * MAX_GPUS, count, free_mask, 1, best_gpu, free_idx, pair_scratch)
