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
def mig_fit(shape, mode, ct, milli, whole, slices, compute, me, static, sused, need_me):
    """How many instances of `shape` still fit on one GPU (0 when none)."""
    if mode == MODE_STATIC:
        if static == 0:
            return 0
        return popcount(static & ~sused & SHAPE_PLACEMENTS[shape])
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


@njit(cache=True, inline="always")
def node_type_sums(
    model, mode, ct, base, count, milli_a, whole_a, slices_a, compute_a, me_a, static_a, sused_a,
    mix_w, mix_i, mix_shape, loc, S, H, cached,
):
    """Load the node's GPUs into `loc`; unless `cached`, per task type the sum of unusable units (S)
    and the count of hosting GPUs (H). Returns the node's free units."""
    if not cached:
        for t in range(len(mix_w)):
            S[t] = 0
            H[t] = 0
    free = 0
    for j in range(count):
        i = base + j
        loc[L_MILLI, j] = milli_a[i]
        loc[L_WHOLE, j] = whole_a[i]
        loc[L_SLICES, j] = slices_a[i]
        loc[L_COMPUTE, j] = compute_a[i]
        loc[L_ME, j] = me_a[i]
        loc[L_SUSED, j] = sused_a[i]
        free += gpu_free_units(mode, ct, milli_a[i], whole_a[i], slices_a[i], compute_a[i], static_a[i], sused_a[i])
        if cached:
            continue
        for t in range(len(mix_w)):
            gf, host = gpu_terms(
                mix_i[t, 0], mix_i[t, 4], mix_shape[t, model], mode, ct,
                milli_a[i], whole_a[i], slices_a[i], compute_a[i], me_a[i], static_a[i], sused_a[i],
            )
            S[t] += gf
            H[t] += host
    return free


@njit(cache=True, inline="always")
def add_gpu_terms(sign, j, model, mode, ct, static, mix_w, mix_i, mix_shape, loc, S, H):
    """Add (sign=1) or remove (sign=-1) local GPU j's contribution to S and H; returns its free units."""
    for t in range(len(mix_w)):
        gf, host = gpu_terms(
            mix_i[t, 0], mix_i[t, 4], mix_shape[t, model], mode, ct,
            loc[L_MILLI, j], loc[L_WHOLE, j], loc[L_SLICES, j], loc[L_COMPUTE, j], loc[L_ME, j], static, loc[L_SUSED, j],
        )
        S[t] += sign * gf
        H[t] += sign * host
    return sign * gpu_free_units(mode, ct, loc[L_MILLI, j], loc[L_WHOLE, j], loc[L_SLICES, j], loc[L_COMPUTE, j], static, loc[L_SUSED, j])


@njit(cache=True, inline="always")
def node_frag(model, cpu_free, mem_free, free, mix_w, mix_i, mix_allowed, S, H):
    """Expected fragmentation of a node (FGD, ATC'23): weighted units no task type could use."""
    total = 0.0
    for t in range(len(mix_w)):
        if mix_w[t] == 0.0:
            continue
        frag = free
        if mix_i[t, 0] != KIND_NONE and mix_allowed[t, model] and cpu_free >= mix_i[t, 1] and mem_free >= mix_i[t, 2]:
            need = mix_i[t, 3] if mix_i[t, 0] == KIND_WHOLE else 1
            if H[t] >= need:
                frag = S[t]
        total += mix_w[t] * frag
    return total


@njit(cache=True, inline="always")
def frag_after_change(
    j, model, mode, ct, static, milli, whole, slices, compute, me, sused,
    cpu_free, mem_free, free_before, mix_w, mix_i, mix_shape, mix_allowed, loc, S, H,
):
    """node_frag after local GPU j takes the given state, without touching S, H or loc.

    The fit test is node_frag's, written out again: moving it into an inlined helper made the
    kernel 45 % slower (measured with numba 0.68), and this loop is the hot path.
    """
    old_free = gpu_free_units(mode, ct, loc[L_MILLI, j], loc[L_WHOLE, j], loc[L_SLICES, j], loc[L_COMPUTE, j],
                              static, loc[L_SUSED, j])
    free = free_before - old_free + gpu_free_units(mode, ct, milli, whole, slices, compute, static, sused)
    total = 0.0
    for t in range(len(mix_w)):
        if mix_w[t] == 0.0:
            continue
        frag = free
        if mix_i[t, 0] != KIND_NONE and mix_allowed[t, model] and cpu_free >= mix_i[t, 1] and mem_free >= mix_i[t, 2]:
            gf_old, host_old = gpu_terms(
                mix_i[t, 0], mix_i[t, 4], mix_shape[t, model], mode, ct,
                loc[L_MILLI, j], loc[L_WHOLE, j], loc[L_SLICES, j], loc[L_COMPUTE, j], loc[L_ME, j], static,
                loc[L_SUSED, j],
            )
            gf_new, host_new = gpu_terms(
                mix_i[t, 0], mix_i[t, 4], mix_shape[t, model], mode, ct,
                milli, whole, slices, compute, me, static, sused,
            )
            need = mix_i[t, 3] if mix_i[t, 0] == KIND_WHOLE else 1
            if H[t] - host_old + host_new >= need:
                frag = S[t] - gf_old + gf_new
        total += mix_w[t] * frag
    return total


@njit(cache=True)
def sigmoid_score(frag_before, frag_after):
    """FGD's node score: trunc(100 * sigmoid(-(frag growth in GPUs)))."""
    x = (frag_before - frag_after) / UNIT
    return float(math.floor(100.0 / (1.0 + math.exp(-x))))


@njit(cache=True, inline="always")
def pair_score(link_a, numa_a, base, a, b):
    """go-gpuallocator's pair affinity: 100 per NVLink, plus 20 same NUMA node, 10 across."""
    s = 100 * link_a[(base + a) * MAX_GPUS + b]
    if numa_a[base + a] == numa_a[base + b]:
        s += 20
    else:
        s += 10
    return s


@njit(cache=True, inline="always")
def best_gpu_set(link_a, numa_a, base, count, free_mask, k, out):
    """Best-connected k-subset of `free_mask`; ties: fewest links cut to the GPUs left free, then lowest.

    Writes the chosen local indices to `out` and returns the set's affinity score.
    """
    best_mask = -1
    best_score = -1
    best_cut = 0
    if k == 1:
        for j in range(count):
            if free_mask & (1 << j):
                cut = 0
                for o in range(count):
                    if o != j and free_mask & (1 << o):
                        cut += pair_score(link_a, numa_a, base, j, o)
                if best_mask < 0 or cut < best_cut:
                    best_mask = 1 << j
                    best_cut = cut
                    best_score = 0
    else:
        # Gosper's hack: every k-subset of the node's GPUs in increasing order
        sub = (1 << k) - 1
        limit = 1 << count
        while sub < limit:
            if sub & ~free_mask == 0:
                score = 0
                cut = 0
                for a in range(count):
                    if sub & (1 << a):
                        for b in range(count):
                            if b != a:
                                if sub & (1 << b):
                                    if b > a:
                                        score += pair_score(link_a, numa_a, base, a, b)
                                elif free_mask & (1 << b):
                                    cut += pair_score(link_a, numa_a, base, a, b)
                if score > best_score or (score == best_score and cut < best_cut):
                    best_mask = sub
                    best_score = score
                    best_cut = cut
            c = sub & -sub
            r = sub + c
            sub = (((r ^ sub) >> 2) // c) | r
    n = 0
    for j in range(count):
        if best_mask & (1 << j):
            out[n] = j
            n += 1
    return best_score


@njit(cache=True)
def node_used_fraction(count, free):
    if count == 0:
        return 0.0
    return 1.0 - free / (count * UNIT)


@njit(cache=True, inline="always")
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


@njit(cache=True, inline="always")
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


@njit(cache=True)
def schedule(
    inv, gpus, models, req, req_shapes, req_me, allowed, candidate, mix, policy, params, rank, noise,
    cache, out_score, out_verdict, best_gpu, best_start, best_shape,
):
    """Score every candidate node; returns (best node or -1, slots) with its placement in best_*.

    Ties on score go to the lowest `rank`. `cache` = (stamp[N], S[N, T], H[N, T], frag[N],
    weights_stamp[N], weights_version) keeps each node's per-type sums for as long as its version
    (`inv`'s last array) is unchanged, and its fragmentation while the mix weights are unchanged too. The tuples are unpacked once here: the per-node code
    takes plain arrays, so no reference counting happens per node.
    """
    (active, cpu_free_a, mem_free_a, pods_free_a, model_a, mode_a, count_a, spot_a, price_a,
     cpu_cap_a, mem_cap_a, pods_cap_a, tags_a, version_a) = inv
    cache_stamp, cache_S, cache_H, cache_frag, cache_weights, weights_version = cache
    milli_a, whole_a, slices_a, compute_a, me_a, static_a, sused_a, numa_a, link_a = gpus
    model_memory, model_compute = models
    mix_w, mix_i, mix_shape, mix_allowed = mix
    n_nodes = active.shape[0]
    n_types = mix_w.shape[0]
    S = np.zeros(n_types, dtype=np.int64)
    H = np.zeros(n_types, dtype=np.int64)
    loc = np.zeros((6, MAX_GPUS), dtype=np.int64)
    width = best_gpu.shape[0]
    cur_gpu = np.zeros(width, dtype=np.int32)
    cur_start = np.zeros(width, dtype=np.int32)
    cur_shape = np.zeros(width, dtype=np.int32)
    tmp_set = np.zeros(MAX_GPUS, dtype=np.int32)
    max_price = 0.0
    max_memory = 0.0
    for n in range(n_nodes):
        if candidate[n] and active[n] and count_a[n] > 0:
            if not math.isnan(price_a[n]) and price_a[n] > max_price:
                max_price = price_a[n]
            if model_memory[model_a[n]] > max_memory:
                max_memory = model_memory[model_a[n]]
    best = -1
    best_slots = 0
    best_score = 0.0
    for n in range(n_nodes):
        if not (candidate[n] and active[n]):
            out_verdict[n] = NOT_CANDIDATE
            out_score[n] = -np.inf
            continue
        verdict = OK
        kind = req[0]
        cpu = req[1]
        mem = req[2]
        k_gpus = req[3]
        milli_req = req[4]
        interruptible = req[5]
        n_inst = req[6]
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
        uses_frag = policy == P_GPUPACK or policy == P_FGD
        # S and H only change when the node does: reuse them while its version is unchanged
        cached = cache_stamp[n] == version_a[n]
        free_before = node_type_sums(
            model, mode, ct, base, count, milli_a, whole_a, slices_a, compute_a, me_a, static_a, sused_a,
            mix_w, mix_i, mix_shape, loc, S, H, cached,
        )
        if cached:
            for t in range(n_types):
                S[t] = cache_S[n, t]
                H[t] = cache_H[n, t]
        else:
            for t in range(n_types):
                cache_S[n, t] = S[t]
                cache_H[n, t] = H[t]
            cache_stamp[n] = version_a[n]
        frag_before = 0.0
        if uses_frag:
            # the node's fragmentation also depends on the mix weights: cached per weights version
            if cached and cache_weights[n] == weights_version:
                frag_before = cache_frag[n]
            else:
                frag_before = node_frag(model, cpu_free_a[n], mem_free_a[n], free_before, mix_w, mix_i, mix_allowed, S, H)
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
                if static_a[base + j] == 0 and not loc[L_WHOLE, j] and loc[L_SLICES, j] == 0 and loc[L_COMPUTE, j] == 0:
                    if loc[L_MILLI, j] >= milli_req:
                        hosts += 1
            if hosts == 0:
                out_verdict[n] = NO_GPU
                out_score[n] = -np.inf
                continue
            pick = int(noise[n] * hosts) if policy == P_RANDOM else 0
            seen = 0
            for j in range(count):
                if not (static_a[base + j] == 0 and not loc[L_WHOLE, j] and loc[L_SLICES, j] == 0 and loc[L_COMPUTE, j] == 0):
                    continue
                left = loc[L_MILLI, j]
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
                    if (static_a[base + o] == 0 and not loc[L_WHOLE, o] and loc[L_SLICES, o] == 0 and loc[L_COMPUTE, o] == 0
                            and loc[L_MILLI, o] == left):
                        duplicate = True
                        break
                if duplicate:
                    continue
                f_after = frag_after_change(
                    j, model, mode, ct, static_a[base + j], left - milli_req, 0, 0, 0, loc[L_ME, j], loc[L_SUSED, j],
                    cpu_after, mem_after, free_before, mix_w, mix_i, mix_shape, mix_allowed, loc, S, H,
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
                    free_after = free_before - milli_req * MILLI_UNIT
            cur_gpu[0] = best_j
            cur_start[0] = -1
            cur_shape[0] = -1
            slots = 1
            free_after = free_before - milli_req * MILLI_UNIT
            if policy == P_FGD:
                gpu_score = best_key
            elif not uses_frag:
                frag_after = frag_before

        elif kind == KIND_WHOLE:
            free_mask = 0
            nfree = 0
            for j in range(count):
                if static_a[base + j] == 0 and not loc[L_WHOLE, j] and loc[L_SLICES, j] == 0 and loc[L_COMPUTE, j] == 0 and loc[L_MILLI, j] == 1000:
                    free_mask |= 1 << j
                    nfree += 1
            if nfree < k_gpus:
                out_verdict[n] = NO_GPU
                out_score[n] = -np.inf
                continue
            use_topology = (policy == P_GPUPACK or params[TOPO_SETS] > 0.0) and (nfree > k_gpus or k_gpus > 1)
            if use_topology and k_gpus == 1:
                # one GPU: every free GPU scores the same, so only the chosen node's pick is refined
                # (after the node loop)
                use_topology = False
            if use_topology:
                score_set = best_gpu_set(link_a, numa_a, base, count, free_mask, k_gpus, cur_gpu)
                if k_gpus > 1:
                    # absolute: share of GPU pairs joined by NVLink; relative: affinity against the
                    # best set this node could ever offer
                    ideal = best_gpu_set(link_a, numa_a, base, count, (1 << count) - 1, k_gpus, tmp_set)
                    linked = 0
                    for a in range(k_gpus):
                        for b in range(a + 1, k_gpus):
                            if link_a[(base + cur_gpu[a]) * MAX_GPUS + cur_gpu[b]] > 0:
                                linked += 1
                    pairs = k_gpus * (k_gpus - 1) // 2
                    topo = 0.75 * linked / pairs + 0.25 * (score_set / ideal if ideal > 0 else 1.0)
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
                j = cur_gpu[0]
                frag_after = frag_after_change(
                    j, model, mode, ct, static_a[base + j], 0, 1, 0, 0, loc[L_ME, j], loc[L_SUSED, j],
                    cpu_after, mem_after, free_before, mix_w, mix_i, mix_shape, mix_allowed, loc, S, H,
                )
                if policy == P_FGD:
                    gpu_score = sigmoid_score(frag_before, frag_after)
            elif uses_frag:
                f_change = 0
                for m in range(k_gpus):
                    j = cur_gpu[m]
                    f_change += add_gpu_terms(-1, j, model, mode, ct, static_a[base + j], mix_w, mix_i, mix_shape, loc, S, H)
                    loc[L_WHOLE, j] = True
                    loc[L_MILLI, j] = 0
                    f_change += add_gpu_terms(1, j, model, mode, ct, static_a[base + j], mix_w, mix_i, mix_shape, loc, S, H)
                frag_after = node_frag(model, cpu_after, mem_after, free_before + f_change, mix_w, mix_i, mix_allowed, S, H)
                if policy == P_FGD:
                    gpu_score = sigmoid_score(frag_before, frag_after)

        elif kind == KIND_MIG:
            if mode == MODE_NONE or count == 0:
                out_verdict[n] = NO_MIG
                out_score[n] = -np.inf
                continue
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
                        starts = static & ~loc[L_SUSED, j] & SHAPE_PLACEMENTS[s]
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
                            else:
                                new_slices = loc[L_SLICES, j] | (((1 << size) - 1) << st)
                                new_compute = loc[L_COMPUTE, j] + c
                                new_sused = loc[L_SUSED, j]
                            f_after = frag_after_change(
                                j, model, mode, ct, static, loc[L_MILLI, j], loc[L_WHOLE, j], new_slices, new_compute,
                                loc[L_ME, j] | need_me, new_sused,
                                cpu_after, mem_after, running_free, mix_w, mix_i, mix_shape, mix_allowed, loc, S, H,
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
                running_free += add_gpu_terms(-1, best_j, model, mode, ct, static, mix_w, mix_i, mix_shape, loc, S, H)
                if mode == MODE_STATIC:
                    loc[L_SUSED, best_j] |= 1 << best_pid
                else:
                    loc[L_SLICES, best_j] |= ((1 << size) - 1) << best_st
                    loc[L_COMPUTE, best_j] += c
                    if need_me:
                        loc[L_ME, best_j] = 1
                running_free += add_gpu_terms(1, best_j, model, mode, ct, static, mix_w, mix_i, mix_shape, loc, S, H)
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
                frag_after = node_frag(model, cpu_after, mem_after, free_after, mix_w, mix_i, mix_allowed, S, H)
                gpu_score = sigmoid_score(frag_before, frag_after)

        else:  # CPU and memory only
            if uses_frag:
                frag_after = node_frag(model, cpu_after, mem_after, free_before, mix_w, mix_i, mix_allowed, S, H)
                gpu_score = sigmoid_score(frag_before, frag_after)

        score = node_score(
            n, cpu_free_a, mem_free_a, model_a, spot_a, price_a, cpu_cap_a, mem_cap_a, tags_a, milli_a,
            pods_free_a, pods_cap_a, model_memory, req, policy, params, max_price, max_memory, count, free_before,
            free_after, frag_before, frag_after, topo, gpu_score,
        )
        if policy == P_GPUPACK and params[W_ORDER] > 0.0:
            # consolidation: among near-equal nodes, keep filling the ones earliest in a fixed order
            score -= params[W_ORDER] * rank[n] / n_nodes
        out_verdict[n] = OK
        out_score[n] = score
        if best < 0 or score > best_score or (score == best_score and rank[n] < rank[best]):
            best = n
            best_score = score
            best_slots = slots
            for q in range(slots):
                best_gpu[q] = cur_gpu[q]
                best_start[q] = cur_start[q]
                best_shape[q] = cur_shape[q]
    if best >= 0 and req[0] == KIND_WHOLE and req[3] == 1 and (policy == P_GPUPACK or params[TOPO_SETS] > 0.0):
        base = best * MAX_GPUS
        free_mask = 0
        for j in range(count_a[best]):
            i = base + j
            if static_a[i] == 0 and not whole_a[i] and slices_a[i] == 0 and compute_a[i] == 0 and milli_a[i] == 1000:
                free_mask |= 1 << j
        best_gpu_set(link_a, numa_a, base, count_a[best], free_mask, 1, best_gpu)
    return best, best_slots
