"""numba kernels: feasibility, best placement and score of one request on every candidate node.

Inputs are the inventory's flat arrays (see `scoring.inventory`), packed into tuples by
`scoring.engine`; nothing here knows Python objects. `scoring.reference` implements the same
semantics in plain Python, and the property tests hold the two to identical answers.

Capacity unit: one GPU = 7000 units, so a milli-share is 7 units and a MIG compute slice is
1000 units on 7-slice GPUs (1750 on the 4-slice A30): every quantity stays an exact integer.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from scoring.geometry import (
    FREE_STARTS,
    MAX_FIT,
    PLACEMENT_SHAPE,
    PLACEMENT_START,
    SHAPE_COMPUTE,
    SHAPE_SIZE,
)

UNIT = 7000
MILLI_UNIT = 7
MAX_GPUS = 16

KIND_NONE, KIND_WHOLE, KIND_SHARE, KIND_MIG = 0, 1, 2, 3
MODE_NONE, MODE_STATIC, MODE_DYNAMIC = 0, 1, 2

P_GPUPACK, P_RANDOM, P_DOT, P_CLUSTER, P_PACKING, P_BESTFIT, P_FGD, P_KUBE, P_FIRSTFIT = range(9)

# params vector indices (one layout for every policy; unused entries are ignored)
W_FRAG, W_PACK, W_TOPO, W_MODEL, W_SPOT, W_COST, SPOT_FORBID, TOPO_SETS, FRAG_STEP, W_ORDER, W_SPOT_AVOID = range(11)
N_PARAMS = 11

# verdict codes per node (0 = feasible)
OK, NOT_CANDIDATE, NO_CPU, NO_MEMORY, NO_POD_SLOT, MODEL_NOT_ALLOWED, NO_GPU, NO_MIG, SPOT_FORBIDDEN = range(9)

# shape id -> placement-id mask of that shape, for static layouts
SHAPE_PLACEMENTS = np.zeros(len(SHAPE_SIZE), dtype=np.int64)
for _pid in range(len(PLACEMENT_SHAPE)):
    SHAPE_PLACEMENTS[PLACEMENT_SHAPE[_pid]] |= 1 << _pid
# rows of the per-node scratch copy of GPU state
L_MILLI, L_WHOLE, L_SLICES, L_COMPUTE, L_ME, L_SUSED = range(6)
# Every function below `schedule` calls takes arrays but never allocates, so it is compiled without
# numba's reference counting (`_nrt=False`, the switch numba's own maintainers use for this, numba
# issue #2350): with it, each call paid an atomic incref and decref per array argument, 85 % of the
# kernel's time at 5,000 nodes.
helper = njit(cache=True, _nrt=False)

MAX_SPEC_CPU = 128000.0  # normalisers of the ATC'23 baselines: 128 cores, 8 GPUs
MAX_SPEC_GPU = 8000.0


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
def gpu_free_units(mode, ct, milli, whole, slices, compute, static, sused):
    """Free capacity of one GPU in units."""
    if static != 0:
        free = 0
        bits = static & ~sused
        pid = 0
        while bits:
            if bits & 1:
                free += SHAPE_COMPUTE[PLACEMENT_SHAPE[pid]]
            bits >>= 1
            pid += 1
        return free * slice_unit(ct)
    if whole:
        return 0
    if slices != 0 or compute != 0:
        return (ct - compute) * slice_unit(ct)
    return milli * MILLI_UNIT


@njit(cache=True)
def static_options(shape, me, static, sused, need_me):
    """Static MIG: placement-id mask of the free instances of `shape` a request may take; `me` is
    the mask of the layout's +me instances, which only a +me request takes (and it only those)."""
    kind_mask = me if need_me else ~me
    return static & ~sused & SHAPE_PLACEMENTS[shape] & kind_mask


@njit(cache=True)
def mig_fit(shape, mode, ct, milli, whole, slices, compute, me, static, sused, need_me):
    """How many instances of `shape` still fit on one GPU (0 when none)."""
    if mode == MODE_STATIC:
        return popcount(static_options(shape, me, static, sused, need_me))
    if mode != MODE_DYNAMIC or whole or milli != 1000 or static != 0:
        return 0
    if need_me and me:
        return 0
    c = SHAPE_COMPUTE[shape]
    by_compute = (ct - compute) // c
    by_memory = MAX_FIT[shape, slices]
    fit = by_memory if by_memory < by_compute else by_compute
    if need_me and fit > 1:
        fit = 1
    return fit


@njit(cache=True)
def gpu_terms(kind, milli_t, shape_t, mode, ct, milli, whole, slices, compute, me, static, sused):
    """(units unusable by the task type, 1 if this GPU can host one unit of the type)."""
    free = gpu_free_units(mode, ct, milli, whole, slices, compute, static, sused)
    plain = static == 0 and not whole and slices == 0 and compute == 0
    if kind == KIND_SHARE:
        if plain and milli >= milli_t:
            return 0, 1
        return free, 0
    if kind == KIND_WHOLE:
        if plain and milli == 1000:
            return 0, 1
        return free, 0
    if kind == KIND_MIG:
        if shape_t < 0:
            return free, 0
        fit = mig_fit(shape_t, mode, ct, milli, whole, slices, compute, me, static, sused, False)
        if fit == 0:
            return free, 0
        return free - fit * SHAPE_COMPUTE[shape_t] * slice_unit(ct), 1
    return 0, 0


@helper
def node_summary(
    model, mode, ct, base, count, milli_a, whole_a, slices_a, compute_a, me_a, static_a, sused_a,
    mix_w, mix_i, mix_shape, S, H, r, gpu_S, gpu_H,
):
    """Per task type the sum of units the type cannot use (into S) and the count of GPUs that can host
    one unit of it (into H). Returns (free units, mask of untouched plain GPUs, mask of plain GPUs);
    plain = no MIG instance and not taken whole, so shares and whole GPUs may use it.

    A GPU in the same state as an earlier GPU of the node (all free, all taken: the common case)
    reuses that GPU's terms, kept in the scratch rows gpu_S[j] and gpu_H[j].
    """
    n_types = len(mix_w)
    for t in range(n_types):
        S[r, t] = 0
        H[r, t] = 0
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
        sused = sused_a[i]
        free += gpu_free_units(mode, ct, milli, whole, slices, compute, static, sused)
        if static == 0 and not whole and slices == 0 and compute == 0:
            plain_mask |= 1 << j
            if milli == 1000:
                free_mask |= 1 << j
        same = -1
        for o in range(j if n_types > 0 else 0):
            e = base + o
            if (milli_a[e] == milli and whole_a[e] == whole and slices_a[e] == slices and compute_a[e] == compute
                    and me_a[e] == me and static_a[e] == static and sused_a[e] == sused):
                same = o
                break
        for t in range(n_types):
            if same >= 0:
                gf = gpu_S[same, t]
                host = gpu_H[same, t]
            else:
                gf, host = gpu_terms(
                    mix_i[t, 0], mix_i[t, 4], mix_shape[t, model], mode, ct,
                    milli, whole, slices, compute, me, static, sused,
                )
            gpu_S[j, t] = gf
            gpu_H[j, t] = host
            S[r, t] += gf
            H[r, t] += host
    return free, free_mask, plain_mask


@helper
def load_local(base, count, milli_a, whole_a, slices_a, compute_a, me_a, sused_a, loc, cache_S, cache_H, n, S, H):
    """Copy node n's GPU state into the scratch `loc` and its sums into S[0] and H[0]: the MIG and
    multi-GPU paths change the copies while they try placements."""
    for t in range(S.shape[1]):
        S[0, t] = cache_S[n, t]
        H[0, t] = cache_H[n, t]
    for j in range(count):
        i = base + j
        loc[L_MILLI, j] = milli_a[i]
        loc[L_WHOLE, j] = whole_a[i]
        loc[L_SLICES, j] = slices_a[i]
        loc[L_COMPUTE, j] = compute_a[i]
        loc[L_ME, j] = me_a[i]
        loc[L_SUSED, j] = sused_a[i]


@helper
def add_gpu_terms(sign, j, model, mode, ct, static, mix_w, mix_i, mix_shape, loc, S, H, r):
    """Add (sign=1) or remove (sign=-1) local GPU j's contribution to S and H; returns its free units."""
    for t in range(len(mix_w)):
        gf, host = gpu_terms(
            mix_i[t, 0], mix_i[t, 4], mix_shape[t, model], mode, ct,
            loc[L_MILLI, j], loc[L_WHOLE, j], loc[L_SLICES, j], loc[L_COMPUTE, j], loc[L_ME, j], static, loc[L_SUSED, j],
        )
        S[r, t] += sign * gf
        H[r, t] += sign * host
    return sign * gpu_free_units(mode, ct, loc[L_MILLI, j], loc[L_WHOLE, j], loc[L_SLICES, j], loc[L_COMPUTE, j], static, loc[L_SUSED, j])


@helper
def type_may_fit(t, model, cpu_free, mem_free, mix_i, mix_allowed):
    """Whether task type t could run on the node at all (GPU model, CPU, memory), and how many
    GPUs able to host it the node then needs (0 when it cannot run)."""
    kind = mix_i[t, 0]
    if kind != KIND_NONE and mix_allowed[t, model] and cpu_free >= mix_i[t, 1] and mem_free >= mix_i[t, 2]:
        return mix_i[t, 3] if kind == KIND_WHOLE else 1
    return 0


@helper
def node_frag(model, cpu_free, mem_free, free, mix_w, mix_i, mix_allowed, S, H, r):
    """Expected fragmentation of a node (FGD, ATC'23): weighted units no task type could use."""
    total = 0.0
    for t in range(len(mix_w)):
        if mix_w[t] == 0.0:
            continue
        frag = free
        need = type_may_fit(t, model, cpu_free, mem_free, mix_i, mix_allowed)
        if need > 0 and H[r, t] >= need:
            frag = S[r, t]
        total += mix_w[t] * frag
    return total


@njit(cache=True, _nrt=False, inline="always")
def frag_after_change(
    model, mode, ct, static,
    o_milli, o_whole, o_slices, o_compute, o_me, o_sused,
    milli, whole, slices, compute, me, sused,
    cpu_free, mem_free, free_before, mix_w, mix_i, mix_shape, mix_allowed, S, H, r,
):
    """node_frag after one GPU goes from the o_* state to the given one, without touching S or H."""
    old_free = gpu_free_units(mode, ct, o_milli, o_whole, o_slices, o_compute, static, o_sused)
    free = free_before - old_free + gpu_free_units(mode, ct, milli, whole, slices, compute, static, sused)
    total = 0.0
    for t in range(len(mix_w)):
        if mix_w[t] == 0.0:
            continue
        frag = free
        need = type_may_fit(t, model, cpu_free, mem_free, mix_i, mix_allowed)
        if need > 0:
            gf_old, host_old = gpu_terms(
                mix_i[t, 0], mix_i[t, 4], mix_shape[t, model], mode, ct,
                o_milli, o_whole, o_slices, o_compute, o_me, static, o_sused,
            )
            gf_new, host_new = gpu_terms(
                mix_i[t, 0], mix_i[t, 4], mix_shape[t, model], mode, ct,
                milli, whole, slices, compute, me, static, sused,
            )
            if H[r, t] - host_old + host_new >= need:
                frag = S[r, t] - gf_old + gf_new
        total += mix_w[t] * frag
    return total


@njit(cache=True)
def sigmoid_score(frag_before, frag_after):
    """FGD's node score: trunc(100 * sigmoid(-(frag growth in GPUs)))."""
    x = (frag_before - frag_after) / UNIT
    return float(math.floor(100.0 / (1.0 + math.exp(-x))))


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
    """Best-connected k-subset of `free_mask`; ties: fewest links cut to the GPUs left free, then lowest.

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
            for a in range(nfree):
                if sub & (1 << a):
                    for b in range(nfree):
                        if b != a:
                            if sub & (1 << b):
                                if b > a:
                                    score += pairs[a * MAX_GPUS + b]
                            else:
                                cut += pairs[a * MAX_GPUS + b]
            if score > best_score or (score == best_score and cut < best_cut):
                best = sub
                best_score = score
                best_cut = cut
            c = sub & -sub
            r = sub + c
            sub = (((r ^ sub) >> 2) // c) | r
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


@helper
def node_score(
    n, cpu_free_a, mem_free_a, model_a, spot_a, price_a, cpu_cap_a, mem_cap_a, tags_a, milli_a,
    pods_free_a, pods_cap_a, model_memory, req, policy, params, max_price, max_memory, count, free_before,
    free_after, frag_before, frag_after, topo, gpu_score,
):
    """The policy's score of a feasible node (higher is better)."""
    kind = req[0]
    cpu = req[1]
    mem = req[2]
    k_gpus = req[3]
    demand_milli = (free_before - free_after) / MILLI_UNIT  # GPU milli this pod takes here
    left_milli = free_before / MILLI_UNIT
    if policy == P_GPUPACK:
        # mix weights sum to 1: growth is the expected fragmentation added, in GPUs; rounding it to
        # FRAG_STEP lets near-equal nodes be told apart by the packing term
        growth = (frag_after - frag_before) / UNIT
        if params[FRAG_STEP] > 0.0:
            growth = math.floor(growth / params[FRAG_STEP] + 0.5) * params[FRAG_STEP]
        score = -params[W_FRAG] * growth
        score += params[W_PACK] * node_used_fraction(count, free_after)
        if kind == KIND_WHOLE and k_gpus > 1:
            score += params[W_TOPO] * topo
        if kind != KIND_NONE and max_memory > 0:
            score -= params[W_MODEL] * model_memory[model_a[n]] / max_memory
        if spot_a[n]:
            score += params[W_SPOT] if req[5] else -params[W_SPOT_AVOID]
        if max_price > 0 and not math.isnan(price_a[n]) and pods_free_a[n] == pods_cap_a[n]:
            # the marginal cost of a pod is the price of the node it switches on
            score -= params[W_COST] * price_a[n] / max_price
        return score
    if policy == P_FGD:
        return gpu_score
    if policy == P_BESTFIT:
        raw = 0.5 * (cpu_free_a[n] - cpu) / MAX_SPEC_CPU + 0.5 * (left_milli - demand_milli) / MAX_SPEC_GPU
        return float(math.floor((1.0 - raw) * 100.0))
    if policy == P_DOT:
        dot = (cpu_free_a[n] / MAX_SPEC_CPU) * (cpu / MAX_SPEC_CPU)
        dot += (left_milli / MAX_SPEC_GPU) * (demand_milli / MAX_SPEC_GPU)
        return float(math.floor(100.0 * (1.0 - dot / 2.0)))
    if policy == P_CLUSTER:
        if kind == KIND_NONE:
            return 0.0
        tag = 0 if kind == KIND_SHARE else k_gpus
        base_score = (25 * (8000 - int(left_milli))) // 8000
        tags = tags_a[n * (MAX_GPUS + 1) : (n + 1) * (MAX_GPUS + 1)]
        others = 0
        for t in range(MAX_GPUS + 1):
            if t != tag and tags[t] > 0:
                others += 1
        if tags[tag] > 0:
            return float(base_score + (75 if others == 0 else 50))
        return float(base_score + (25 if others == 0 else 0))
    if policy == P_PACKING:
        if kind == KIND_NONE:
            return 0.0
        return packing_score(n, milli_a, count, kind, k_gpus, req[4])
    if policy == P_KUBE:
        cpu_part = (cpu_free_a[n] - cpu) * 100 // cpu_cap_a[n] if cpu_cap_a[n] > 0 else 0
        mem_part = (mem_free_a[n] - mem) * 100 // mem_cap_a[n] if mem_cap_a[n] > 0 else 0
        return float((cpu_part + mem_part) // 2)
    return 0.0  # random, first-fit: the tie-break order decides


@helper
def packing_score(n, milli_a, count, kind, k_gpus, milli_req):
    """GpuPacking (ATC'23 baseline): shared GPUs first, then free GPUs on used nodes, then idle nodes."""
    base = n * MAX_GPUS
    nfree = 0
    for j in range(count):
        if milli_a[base + j] == 1000:
            nfree += 1
    if nfree == count:
        return float(max(33 - nfree, nfree))
    need = 1 if kind == KIND_SHARE else k_gpus
    per_gpu = milli_req if kind == KIND_SHARE else 1000
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
        if milli_a[base + pick] == 1000:
            opened += 1
        total += milli_a[base + pick] * 100 // 1000
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
    """Working arrays for `schedule` (for `types` task types and requests of up to `width` slots),
    made once by the caller: the kernel allocates nothing, so it runs without reference counting."""
    return (
        np.zeros((1, types), dtype=np.int64),  # S and H of a node being changed
        np.zeros((1, types), dtype=np.int64),
        np.zeros((6, MAX_GPUS), dtype=np.int64),  # loc: GPU state of a node being changed
        np.zeros(width, dtype=np.int32),  # the current node's placement: GPU, MIG start, shape
        np.zeros(width, dtype=np.int32),
        np.zeros(width, dtype=np.int32),
        np.zeros(MAX_GPUS, dtype=np.int32),  # best_gpu_set's output for the ideal set
        np.zeros(MAX_GPUS, dtype=np.int64),  # best_gpu_set's scratch
        np.zeros(MAX_GPUS * MAX_GPUS, dtype=np.int64),
        np.zeros((MAX_GPUS, types), dtype=np.int64),  # node_summary: per-GPU terms
        np.zeros((MAX_GPUS, types), dtype=np.int64),
    )


@njit(cache=True, nogil=True, _nrt=False)
def schedule(
    inv, gpus, models, req, req_shapes, req_me, allowed, candidate, mix, policy, params, rank, noise,
    cache, memo, scratch, out_score, out_verdict, best_gpu, best_start, best_shape,
):
    """Score every candidate node; returns (best node or -1, slots) with its placement in best_*.

    Ties on score go to the lowest `rank`. The GIL is released while it runs; `scratch` comes from
    `make_scratch`.

    `memo` = (stamp[N], epoch[N], verdict[N], score[N], current[1], maxima[2]) keeps each node's
    verdict and score (before the rank term) for as long as its version is unchanged and the
    epoch is `current[0]`: the caller starts a new epoch when the request, the policy or the mix
    weights change, and this kernel does when the candidates' price or memory maxima do (the cost and
    model-fit terms are relative to them). A node read from the memo is not scored again; when it
    wins, it alone is scored once more after the loop, for its placement. kube-scheduler sends the
    same candidates pod after pod and a decision changes one node, so nearly every node is read
    from the memo. The random policy (its GPU choice draws on `noise`) bypasses it.

    `cache` = (stamp[N], S[N, T], H[N, T], frag[N], weights_stamp[N], free[N], free_mask[N],
    plain_mask[N], set[N, MAX_GPUS + 1], topo[N, MAX_GPUS + 1], weights_version) keeps each node's
    per-type sums, free units, GPU masks and best k-GPU set with its rating for as long as its version
    (`inv`'s last array) is unchanged, and its fragmentation while the mix weights are unchanged too:
    an unchanged node is scored without reading its GPUs one by one. The tuples are unpacked once here.
    """
    (active, cpu_free_a, mem_free_a, pods_free_a, model_a, mode_a, count_a, spot_a, price_a,
     cpu_cap_a, mem_cap_a, pods_cap_a, tags_a, version_a) = inv
    (cache_stamp, cache_S, cache_H, cache_frag, cache_weights, cache_free, cache_free_mask, cache_plain_mask,
     cache_set, cache_topo, weights_version) = cache
    milli_a, whole_a, slices_a, compute_a, me_a, static_a, sused_a, numa_a, link_a = gpus
    model_memory, model_compute = models
    mix_w, mix_i, mix_shape, mix_allowed = mix
    max_price, max_memory = candidate_maxima(active, model_a, count_a, price_a, model_memory, candidate)
    memo_stamp, memo_epoch, memo_verdict, memo_score, memo_current, memo_maxima = memo
    if memo_maxima[0] != max_price or memo_maxima[1] != max_memory:
        memo_current[0] += 1
        memo_maxima[0] = max_price
        memo_maxima[1] = max_memory
    epoch = memo_current[0]
    use_memo = policy != P_RANDOM
    order_weight = params[W_ORDER] if policy == P_GPUPACK and params[W_ORDER] > 0.0 else 0.0
    n_nodes = active.shape[0]
    S, H, loc, cur_gpu, cur_start, cur_shape, tmp_set, free_idx, pair_scratch, gpu_S, gpu_H = scratch
    kind = req[0]
    cpu = req[1]
    mem = req[2]
    k_gpus = req[3]
    milli_req = req[4]
    interruptible = req[5]
    n_inst = req[6]
    uses_frag = policy == P_GPUPACK or policy == P_FGD
    best = -1
    best_slots = 0
    best_score = 0.0
    redo = -1  # the best node so far was read from the memo: its placement is still to be found
    scored = -1  # the node scored last: its verdict and score go to the memo once the next one starts
    scored_raw = -np.inf
    for step in range(n_nodes + 1):
        if scored >= 0:
            memo_stamp[scored] = version_a[scored]
            memo_epoch[scored] = epoch
            memo_verdict[scored] = out_verdict[scored]
            memo_score[scored] = scored_raw
            scored = -1
        if step < n_nodes:
            n = step
        elif redo >= 0:
            n = redo  # scored again, now only for its placement
        else:
            break
        if not (candidate[n] and active[n]):
            out_verdict[n] = NOT_CANDIDATE
            out_score[n] = -np.inf
            continue
        if use_memo and step < n_nodes and memo_stamp[n] == version_a[n] and memo_epoch[n] == epoch:
            out_verdict[n] = memo_verdict[n]
            if memo_verdict[n] != OK:
                out_score[n] = -np.inf
                continue
            score = memo_score[n] - order_weight * rank[n] / n_nodes
            out_score[n] = score
            if best < 0 or score > best_score or (score == best_score and rank[n] < rank[best]):
                best = n
                best_score = score
                redo = n
            continue
        if step < n_nodes:
            scored = n
            scored_raw = -np.inf
        verdict = OK
        model = model_a[n]
        if cpu_free_a[n] < cpu:
            out_verdict[n] = NO_CPU
            out_score[n] = -np.inf
            continue
        if mem_free_a[n] < mem:
            out_verdict[n] = NO_MEMORY
            out_score[n] = -np.inf
            continue
        if pods_free_a[n] < 1:
            out_verdict[n] = NO_POD_SLOT
            out_score[n] = -np.inf
            continue
        if kind != KIND_NONE and not allowed[model]:
            out_verdict[n] = MODEL_NOT_ALLOWED
            out_score[n] = -np.inf
            continue
        if spot_a[n] and not interruptible and params[SPOT_FORBID] > 0.0 and policy == P_GPUPACK:
            out_verdict[n] = SPOT_FORBIDDEN
            out_score[n] = -np.inf
            continue
        mode = mode_a[n]
        count = count_a[n]
        base = n * MAX_GPUS
        ct = model_compute[model]
        # the node's sums live in cache_S[n] and cache_H[n]; paths that try several changes copy them
        # into S[0] and H[0] first (load_local)
        fresh = cache_stamp[n] != version_a[n]
        if fresh:
            free_before, free_mask, plain_mask = node_summary(
                model, mode, ct, base, count, milli_a, whole_a, slices_a, compute_a, me_a, static_a, sused_a,
                mix_w, mix_i, mix_shape, cache_S, cache_H, n, gpu_S, gpu_H,
            )
            cache_free[n] = free_before
            cache_free_mask[n] = free_mask
            cache_plain_mask[n] = plain_mask
            for size in range(MAX_GPUS + 1):
                cache_topo[n, size] = -1.0
            cache_stamp[n] = version_a[n]
        else:
            free_before = cache_free[n]
            free_mask = cache_free_mask[n]
            plain_mask = cache_plain_mask[n]
        frag_before = 0.0
        if uses_frag:
            # the node's fragmentation also depends on the mix weights: cached per weights version
            if not fresh and cache_weights[n] == weights_version:
                frag_before = cache_frag[n]
            else:
                frag_before = node_frag(
                    model, cpu_free_a[n], mem_free_a[n], free_before, mix_w, mix_i, mix_allowed, cache_S, cache_H, n
                )
                cache_frag[n] = frag_before
                cache_weights[n] = weights_version
        cpu_after = cpu_free_a[n] - cpu
        mem_after = mem_free_a[n] - mem
        slots = 0
        free_after = free_before
        frag_after = frag_before
        topo = 1.0
        gpu_score = 0.0  # FGD: score of the best GPU choice

        if kind == KIND_SHARE:
            best_j = -1
            best_key = 0.0
            best_left = 0
            hosts = 0
            for j in range(count):
                if (plain_mask >> j) & 1 and milli_a[base + j] >= milli_req:
                    hosts += 1
            if hosts == 0:
                out_verdict[n] = NO_GPU
                out_score[n] = -np.inf
                continue
            pick = int(noise[n] * hosts) if policy == P_RANDOM else 0
            seen = 0
            for j in range(count):
                if not (plain_mask >> j) & 1:
                    continue
                left = milli_a[base + j]
                if left < milli_req:
                    continue
                if policy == P_RANDOM:
                    if seen == pick:
                        best_j = j
                    seen += 1
                    continue
                if policy == P_FIRSTFIT or policy == P_KUBE:
                    if best_j < 0:
                        best_j = j
                    continue
                if not uses_frag:
                    if best_j < 0 or left < best_left:
                        best_j = j
                        best_left = left
                    continue
                # fragmentation-aware: evaluate this GPU choice, once per distinct free amount (the same
                # amount gives the same fragmentation, and ties keep the lowest index anyway)
                duplicate = False
                for o in range(j):
                    if (plain_mask >> o) & 1 and milli_a[base + o] == left:
                        duplicate = True
                        break
                if duplicate:
                    continue
                me = me_a[base + j]
                sused = sused_a[base + j]
                f_after = frag_after_change(
                    model, mode, ct, 0, left, False, 0, 0, me, sused, left - milli_req, False, 0, 0, me, sused,
                    cpu_after, mem_after, free_before, mix_w, mix_i, mix_shape, mix_allowed, cache_S, cache_H, n,
                )
                if policy == P_FGD:
                    key = sigmoid_score(frag_before, f_after)
                    better = best_j < 0 or key > best_key
                else:
                    key = -f_after
                    better = best_j < 0 or key > best_key or (key == best_key and left < best_left)
                if better:
                    best_j = j
                    best_key = key
                    best_left = left
                    frag_after = f_after
            cur_gpu[0] = best_j
            cur_start[0] = -1
            cur_shape[0] = -1
            slots = 1
            free_after = free_before - milli_req * MILLI_UNIT
            if policy == P_FGD:
                gpu_score = best_key

        elif kind == KIND_WHOLE:
            nfree = popcount(free_mask)
            if nfree < k_gpus:
                out_verdict[n] = NO_GPU
                out_score[n] = -np.inf
                continue
            # one GPU: every free GPU scores the same, so only the chosen node's pick is refined by
            # topology (finish_choice)
            use_topology = (policy == P_GPUPACK or params[TOPO_SETS] > 0.0) and k_gpus > 1
            if use_topology:
                if cache_topo[n, k_gpus] >= 0.0:
                    # the best set depends on the node's free GPUs only: kept while the node is unchanged
                    m = 0
                    for j in range(count):
                        if cache_set[n, k_gpus] & (1 << j):
                            cur_gpu[m] = j
                            m += 1
                    topo = cache_topo[n, k_gpus]
                else:
                    topo = set_topology(link_a, numa_a, base, count, free_mask, k_gpus, cur_gpu, tmp_set, free_idx,
                                        pair_scratch)
                    chosen = 0
                    for m in range(k_gpus):
                        chosen |= 1 << cur_gpu[m]
                    cache_set[n, k_gpus] = chosen
                    cache_topo[n, k_gpus] = topo
            else:
                m = 0
                for j in range(count):
                    if free_mask & (1 << j) and m < k_gpus:
                        cur_gpu[m] = j
                        m += 1
            for m in range(k_gpus):
                cur_start[m] = -1
                cur_shape[m] = -1
            slots = k_gpus
            free_after = free_before - k_gpus * UNIT
            if uses_frag and k_gpus == 1:
                i = base + cur_gpu[0]
                me = me_a[i]
                sused = sused_a[i]
                frag_after = frag_after_change(
                    model, mode, ct, 0, 1000, False, 0, 0, me, sused, 0, True, 0, 0, me, sused,
                    cpu_after, mem_after, free_before, mix_w, mix_i, mix_shape, mix_allowed, cache_S, cache_H, n,
                )
                if policy == P_FGD:
                    gpu_score = sigmoid_score(frag_before, frag_after)
            elif uses_frag:
                load_local(base, count, milli_a, whole_a, slices_a, compute_a, me_a, sused_a, loc, cache_S, cache_H, n, S, H)
                f_change = 0
                for m in range(k_gpus):
                    j = cur_gpu[m]
                    f_change += add_gpu_terms(-1, j, model, mode, ct, static_a[base + j], mix_w, mix_i, mix_shape, loc, S, H, 0)
                    loc[L_WHOLE, j] = True
                    loc[L_MILLI, j] = 0
                    f_change += add_gpu_terms(1, j, model, mode, ct, static_a[base + j], mix_w, mix_i, mix_shape, loc, S, H, 0)
                frag_after = node_frag(model, cpu_after, mem_after, free_before + f_change, mix_w, mix_i, mix_allowed, S, H, 0)
                if policy == P_FGD:
                    gpu_score = sigmoid_score(frag_before, frag_after)

        elif kind == KIND_MIG:
            if mode == MODE_NONE or count == 0:
                out_verdict[n] = NO_MIG
                out_score[n] = -np.inf
                continue
            load_local(base, count, milli_a, whole_a, slices_a, compute_a, me_a, sused_a, loc, cache_S, cache_H, n, S, H)
            running_free = free_before
            for q in range(n_inst):
                s = req_shapes[q, model]
                if s < 0:
                    verdict = NO_MIG
                    break
                c = SHAPE_COMPUTE[s]
                size = SHAPE_SIZE[s]
                need_me = req_me[q]
                best_j = -1
                best_st = -1
                best_pid = -1
                best_key = 0.0
                best_used = 0
                for j in range(count):
                    static = static_a[base + j]
                    if mig_fit(s, mode, ct, loc[L_MILLI, j], loc[L_WHOLE, j], loc[L_SLICES, j], loc[L_COMPUTE, j], loc[L_ME, j], static, loc[L_SUSED, j],
                               need_me) == 0:
                        continue
                    if mode == MODE_STATIC:
                        used_units = popcount(loc[L_SUSED, j])
                        starts = static_options(s, loc[L_ME, j], static, loc[L_SUSED, j], need_me)
                    else:
                        used_units = loc[L_COMPUTE, j]
                        starts = FREE_STARTS[s, loc[L_SLICES, j]]
                    n_options = len(PLACEMENT_SHAPE) if mode == MODE_STATIC else 8
                    for option in range(n_options):
                        if not (starts >> option) & 1:
                            continue
                        # static: options are placement ids; dynamic: start slices
                        pid = option
                        st = PLACEMENT_START[option] if mode == MODE_STATIC else option
                        if policy == P_GPUPACK:
                            if mode == MODE_STATIC:
                                new_slices = loc[L_SLICES, j]
                                new_compute = loc[L_COMPUTE, j]
                                new_sused = loc[L_SUSED, j] | (1 << pid)
                                new_me = loc[L_ME, j]
                            else:
                                new_slices = loc[L_SLICES, j] | (((1 << size) - 1) << st)
                                new_compute = loc[L_COMPUTE, j] + c
                                new_sused = loc[L_SUSED, j]
                                new_me = loc[L_ME, j] | need_me
                            f_after = frag_after_change(
                                model, mode, ct, static,
                                loc[L_MILLI, j], loc[L_WHOLE, j], loc[L_SLICES, j], loc[L_COMPUTE, j], loc[L_ME, j],
                                loc[L_SUSED, j],
                                loc[L_MILLI, j], loc[L_WHOLE, j], new_slices, new_compute, new_me,
                                new_sused,
                                cpu_after, mem_after, running_free, mix_w, mix_i, mix_shape, mix_allowed, S, H, 0,
                            )
                            key = -f_after
                            better = (
                                best_j < 0 or key > best_key
                                or (key == best_key and used_units > best_used)
                                or (key == best_key and used_units == best_used and j == best_j and st > best_st)
                            )
                        elif policy == P_FIRSTFIT or policy == P_KUBE:
                            better = best_j < 0
                        else:  # best fit: the fullest GPU that fits, lowest start
                            better = best_j < 0 or used_units > best_used
                        if better:
                            best_j = j
                            best_st = st
                            best_pid = pid
                            best_key = key if policy == P_GPUPACK else 0.0
                            best_used = used_units
                if best_j < 0:
                    verdict = NO_MIG
                    break
                # take the chosen instance in the local picture
                static = static_a[base + best_j]
                running_free += add_gpu_terms(-1, best_j, model, mode, ct, static, mix_w, mix_i, mix_shape, loc, S, H, 0)
                if mode == MODE_STATIC:
                    loc[L_SUSED, best_j] |= 1 << best_pid
                else:
                    loc[L_SLICES, best_j] |= ((1 << size) - 1) << best_st
                    loc[L_COMPUTE, best_j] += c
                    if need_me:
                        loc[L_ME, best_j] = 1
                running_free += add_gpu_terms(1, best_j, model, mode, ct, static, mix_w, mix_i, mix_shape, loc, S, H, 0)
                cur_gpu[q] = best_j
                cur_start[q] = best_st
                cur_shape[q] = s
            if verdict != OK:
                out_verdict[n] = verdict
                out_score[n] = -np.inf
                continue
            slots = n_inst
            free_after = running_free
            if uses_frag:
                frag_after = node_frag(model, cpu_after, mem_after, free_after, mix_w, mix_i, mix_allowed, S, H, 0)
                gpu_score = sigmoid_score(frag_before, frag_after)

        else:  # CPU and memory only
            if uses_frag:
                frag_after = node_frag(model, cpu_after, mem_after, free_before, mix_w, mix_i, mix_allowed, cache_S, cache_H, n)
                gpu_score = sigmoid_score(frag_before, frag_after)

        score = node_score(
            n, cpu_free_a, mem_free_a, model_a, spot_a, price_a, cpu_cap_a, mem_cap_a, tags_a, milli_a,
            pods_free_a, pods_cap_a, model_memory, req, policy, params, max_price, max_memory, count, free_before,
            free_after, frag_before, frag_after, topo, gpu_score,
        )
        scored_raw = score
        # consolidation (gpupack): among near-equal nodes, keep filling the ones earliest in a fixed order
        score -= order_weight * rank[n] / n_nodes
        out_verdict[n] = OK
        out_score[n] = score
        if step == n_nodes or best < 0 or score > best_score or (score == best_score and rank[n] < rank[best]):
            best = n
            best_score = score
            best_slots = slots
            redo = -1
            for q in range(slots):
                best_gpu[q] = cur_gpu[q]
                best_start[q] = cur_start[q]
                best_shape[q] = cur_shape[q]
    if best >= 0:  # scored in this call, so its cached free mask is current
        finish_choice(best, req, policy, params, numa_a, link_a, count_a[best], cache_free_mask[best], best_gpu,
                      free_idx, pair_scratch)
    return best, best_slots


@helper
def finish_choice(best, req, policy, params, numa_a, link_a, count, free_mask, best_gpu, free_idx, pair_scratch):
    """Complete the winner's placement: a single whole GPU goes where taking it cuts the fewest links
    among the node's free GPUs `free_mask` (every free GPU scored the same, so only the winner is refined)."""
    if req[0] != KIND_WHOLE or req[3] != 1 or not (policy == P_GPUPACK or params[TOPO_SETS] > 0.0):
        return
    best_gpu_set(link_a, numa_a, best * MAX_GPUS, count, free_mask, 1, best_gpu, free_idx, pair_scratch)
