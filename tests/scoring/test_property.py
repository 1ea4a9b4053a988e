"""Property tests: the numba engine and the plain-Python reference agree, and the inventory stays sound.

Random clusters (dynamic-MIG H100/H200/A30, static-MIG A100/A30 with random valid layouts, non-MIG
L4/T4, an unknown product, CPU-only nodes; random NVLink matrices, NUMA, spot and prices) get random
pre-existing allocations, then a random request stream is decided under every policy. For each
request both implementations must give the same verdict on every node, the same score (exactly:
the reference evaluates the kernels' expressions in the same order and every fragmentation term is
an exact integer, so no tolerance is needed), and the same node and placement. Each decision is
committed and checked; releasing everything in random order must restore the arrays exactly.

Coverage is counted, not hoped for: every decision is tallied by the path it took (share, whole GPUs,
static MIG, dynamic MIG, CPU only, infeasible) and each policy's run must reach every path a minimum
number of times. MIG requests are drawn from the profiles the generated nodes hold (a static node's
layout, a dynamic node's model) and nodes are sized so that most requests fit somewhere.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import providers as hypothesis_providers
from hypothesis.internal.floats import float_to_int

from gpupack.scoring.engine import Decision, Engine
from gpupack.scoring.facts import GpuSlot, MigMode, NodeFacts, Placement
from gpupack.scoring.geometry import (
    FAMILIES,
    PLACEMENT_SHAPE,
    PLACEMENT_START,
    SHAPES,
    MigFamily,
    resolve_profile,
    slice_bits,
)
from gpupack.scoring.gpu_models import lookup_model
from gpupack.scoring.inventory import MAX_GPUS, Inventory
from gpupack.scoring.layout import PICK_LEAST_FRAG, RULE_MIG
from gpupack.scoring.mix import LearnedMix, default_prior, typical_mix
from gpupack.scoring.policies import POLICY_NAMES, GpupackArgs, GpupackWeights, PolicySpec, baseline, fgd, gpupack
from gpupack.scoring.reference import reference_decide
from gpupack.scoring.request import MILLI_PER_GPU, Kind, PodRequest
from gpupack.scoring.usage import UsageTotals

# (product, MIG modes it is generated with)
PRODUCTS: list[tuple[str, tuple[MigMode, ...]]] = [
    ("NVIDIA-H100-80GB-HBM3", (MigMode.DYNAMIC,)),
    ("NVIDIA-H200", (MigMode.DYNAMIC,)),
    ("NVIDIA-A100-SXM4-80GB", (MigMode.STATIC, MigMode.DYNAMIC)),
    ("NVIDIA-A100-SXM4-40GB", (MigMode.STATIC, MigMode.DYNAMIC)),
    ("NVIDIA-A30", (MigMode.STATIC, MigMode.DYNAMIC)),
    ("NVIDIA-L4", (MigMode.NONE,)),
    ("Tesla-T4", (MigMode.NONE,)),
    ("ACME-Accelerator-X1", (MigMode.NONE, MigMode.DYNAMIC)),  # unknown product: never MIG
    ("", (MigMode.NONE,)),  # CPU-only node
]
PRODUCT_NAMES = [p for p, _ in PRODUCTS if p]
MIG_PROFILES = [
    "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me",
    "1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb",
    "1g.6gb", "2g.12gb", "4g.24gb", "1g.6gb+me",
    "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "7g.141gb",
]  # fmt: skip
GIB = 1 << 30

# ---------------------------------------------------------------------------------------- clusters


@st.composite
def static_layout(draw: st.DrawFn, family: MigFamily) -> tuple[tuple[str, int], ...]:
    """A random valid static layout of one GPU: instances added while they fit, at most one +me."""
    names = sorted(family.profiles)
    names += [f"{name}+me" for name in names if name.startswith("1g.")]
    layout: list[tuple[str, int]] = []
    used = 0
    compute = 0
    for _ in range(draw(st.integers(2, 10))):
        profile = draw(st.sampled_from(names))
        shape = SHAPES[family.profiles[profile.removesuffix("+me")]]
        start = draw(st.sampled_from(shape.starts))
        bits = slice_bits(shape.size, start)
        has_me = any(p.endswith("+me") for p, _ in layout)
        if used & bits or compute + shape.compute > family.compute_total or (has_me and profile.endswith("+me")):
            continue
        used |= bits
        compute += shape.compute
        layout.append((profile, start))
    return tuple(layout)


@st.composite
def node_facts(draw: st.DrawFn, name: str) -> NodeFacts:
    """One random node."""
    product, modes = draw(st.sampled_from(PRODUCTS[:5] + PRODUCTS))  # MIG-capable ones twice as often
    count = draw(st.one_of(st.integers(1, 8), st.just(8))) if product else 0
    mode = draw(st.sampled_from(modes + modes[:1])) if count else MigMode.NONE  # static MIG 2 in 3
    layout: dict[int, tuple[tuple[str, int], ...]] = {}
    if mode == MigMode.STATIC:
        family = _family(product)
        for gpu in range(count):
            if draw(st.integers(0, 3)) or gpu == 0:
                layout[gpu] = draw(static_layout(family))
    nvlink = None
    numa = None
    if count and draw(st.booleans()):
        values = draw(st.lists(st.integers(0, 3), min_size=count * count, max_size=count * count))
        matrix = [[0] * count for _ in range(count)]
        for i in range(count):
            for j in range(i + 1, count):
                matrix[i][j] = matrix[j][i] = values[i * count + j]
        nvlink = tuple(tuple(row) for row in matrix)
        numa = tuple(draw(st.lists(st.integers(0, 1), min_size=count, max_size=count)))
    cost = draw(st.one_of(st.none(), st.sampled_from([4.0, 12.5, 32.77, 98.32])))
    return NodeFacts(
        name=name,
        cpu_milli=draw(st.sampled_from([16000, 32000, 64000])),
        memory_bytes=draw(st.sampled_from([128, 256, 1024])) * GIB,
        pods=draw(st.integers(8, 48)),
        gpu_product=product,
        gpu_count=count,
        mig_mode=mode,
        mig_layout=layout,
        nvlink=nvlink,
        numa=numa,
        spot=draw(st.booleans()),
        hourly_cost=cost,
    )


def _family(product: str) -> MigFamily:
    family = lookup_model(product).mig_family
    return family if family is not None else MigFamily("none", 8, 7, {}, "")


def _profile_name(family: MigFamily, shape: int) -> str:
    return next(name for name, sid in sorted(family.profiles.items()) if sid == shape)


def random_placement(rng: random.Random, inv: Inventory, row: int) -> Placement | None:
    """A random placement that fits on node `row` as the arrays say (None when nothing is free)."""
    name = inv.names[row]
    assert name is not None
    if inv.node_pods_free[row] < 1:
        return None
    cpu = rng.choice([0, 100, 500]) if inv.node_cpu_free[row] >= 500 else 0
    mem = GIB if inv.node_mem_free[row] >= GIB else 0
    family = inv.models[int(inv.node_model[row])].mig_family
    mode = int(inv.node_mig_mode[row])
    options: list[tuple[GpuSlot, ...]] = []
    base = row * MAX_GPUS
    free_whole: list[int] = []
    for j in range(int(inv.node_gpu_count[row])):
        g = base + j
        milli, whole = int(inv.gpu_milli_free[g]), bool(inv.gpu_whole[g])
        slices, compute, static = int(inv.gpu_slices[g]), int(inv.gpu_compute[g]), int(inv.gpu_static[g])
        plain = not whole and slices == 0 and static == 0
        if plain and milli == MILLI_PER_GPU:
            free_whole.append(j)
        if plain and milli > 0:
            options.append((GpuSlot(j, milli=rng.randint(1, min(milli, 999))),))
        if family is not None and mode == MigMode.STATIC and static:
            for pid in range(len(PLACEMENT_SHAPE)):
                if static & ~int(inv.gpu_static_used[g]) & (1 << pid):
                    profile = _profile_name(family, int(PLACEMENT_SHAPE[pid]))
                    profile += "+me" if int(inv.gpu_me[g]) & (1 << pid) else ""
                    options.append((GpuSlot(j, mig=profile, start=int(PLACEMENT_START[pid])),))
        if family is not None and mode == MigMode.DYNAMIC and not whole and milli == MILLI_PER_GPU:
            for profile, sid in sorted(family.profiles.items()):
                shape = SHAPES[sid]
                if compute + shape.compute > family.compute_total:
                    continue
                for start in shape.starts:
                    if slices & slice_bits(shape.size, start) == 0:
                        options.append((GpuSlot(j, mig=profile, start=start),))
    if free_whole:
        k = rng.randint(1, len(free_whole))
        options.append(tuple(GpuSlot(j) for j in sorted(rng.sample(free_whole, k))))
    if not options or rng.random() < 0.1:
        return Placement(name, (), cpu, mem)  # CPU-only pod
    return Placement(name, rng.choice(options), cpu, mem)


# ---------------------------------------------------------------------------------------- requests


FAMILY_PROFILES = [sorted(family.profiles) for family in FAMILIES.values()]


def profile_pool(facts: NodeFacts) -> list[str]:
    """The MIG profiles a node can host: its static layout's instances, or its model's profiles (dynamic)."""
    if facts.mig_mode == MigMode.STATIC:
        return sorted({profile for layout in facts.mig_layout.values() for profile, _ in layout})
    if facts.mig_mode == MigMode.DYNAMIC:
        names = sorted(_family(facts.gpu_product).profiles)
        return names + [f"{name}+me" for name in names if name.startswith("1g.")]
    return []


@st.composite
def mig_request(draw: st.DrawFn, pools: list[list[str]]) -> tuple[tuple[str, int], ...]:
    """Mostly profiles one node of the cluster holds (so they can fit), sometimes any mixture."""
    pool = MIG_PROFILES if not pools or draw(st.integers(0, 7)) == 0 else draw(st.sampled_from(pools))
    two = draw(st.integers(0, 2)) == 0
    profiles = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2 if two else 1, unique=True))
    return tuple((p, draw(st.sampled_from([1, 1, 1, 1, 2, 3]))) for p in profiles)


KINDS = [Kind.NONE, Kind.WHOLE, Kind.WHOLE, Kind.SHARE, Kind.SHARE, Kind.MIG, Kind.MIG]  # MIG has two paths


@st.composite
def pod_request(draw: st.DrawFn, pools: list[list[str]] | None = None, products: list[str] | None = None) -> PodRequest:
    """A random valid request of any kind; its product constraint mostly names products of the cluster."""
    kind = draw(st.sampled_from(KINDS))
    fields: dict[str, Any] = {"kind": kind}
    if kind == Kind.WHOLE:
        fields["gpus"] = draw(st.sampled_from([1, 1, 1, 2, 2, 3, 4, 8]))
    elif kind == Kind.SHARE:
        fields["milli"] = draw(st.one_of(st.sampled_from([100, 250, 500, 700]), st.integers(1, 999)))
    elif kind == Kind.MIG:
        fields["mig"] = draw(mig_request(pools or []))
    names = st.sampled_from(products) if products and draw(st.integers(0, 3)) else st.sampled_from(PRODUCT_NAMES)
    allowed = st.frozensets(names, min_size=1, max_size=3)
    return PodRequest(
        cpu_milli=draw(st.sampled_from([0, 500, 1000, 8000])),
        memory_bytes=draw(st.sampled_from([0, GIB, 8 * GIB, 32 * GIB])),
        allowed_products=draw(st.one_of(st.none(), st.none(), allowed)),
        interruptible=draw(st.booleans()),
        **fields,
    )


def make_policy(name: str, stream: list[PodRequest]) -> PolicySpec:
    """Every policy of scoring.policies, by name; fgd gets the stream's own mix as its oracle."""
    if name == "gpupack":
        return gpupack()
    if name == "fgd":
        return fgd(typical_mix(stream))
    if name == "gpupack-tuned":  # other weights, fragmentation rounded, spot forbidden
        weights = GpupackWeights(
            fragmentation=0.7, packing=0.3, topology=0.4, model_fit=0.2, spot=0.3, price=0.6, frag_step=0.05,
            mig_fragmentation=0.2,  # below fragmentation, where the default has it above
            mig_order=2.5,
        )
        spec = gpupack(GpupackArgs(weights=weights, forbid_spot_for_non_interruptible=True))
        spec.rules[RULE_MIG] = PICK_LEAST_FRAG  # the default's MIG pick before round 6, held too
        return spec
    if name == "gpupack-eager":  # the learned mix changes after every request
        spec = gpupack()
        spec.mix = LearnedMix(default_prior(), refresh_every=1)
        return spec
    if name == "gpupack-slack":  # #33's candidate knobs on: share slack, whole-GPU requests lighter in the mix
        spec = gpupack(GpupackArgs(mix_whole_weight=0.5, weights=GpupackWeights(share_slack=1.0, fragmentation=2.5)))
        spec.mix = LearnedMix(default_prior(), refresh_every=1, whole_weight=0.3)
        return spec
    if name == "kube-default+sets":
        return baseline("kube-default", topology_sets=True)
    return baseline(name)


ALL_POLICIES = [*POLICY_NAMES, "gpupack-tuned", "gpupack-eager", "gpupack-slack", "kube-default+sets"]

# ---------------------------------------------------------------------------------------- checks


def snapshot(inv: Inventory) -> dict[str, np.ndarray]:
    """Copies of every node_* / gpu_* / model_* array (node_version is a cache stamp, not state)."""
    return {
        name: value.copy()
        for name, value in vars(inv).items()
        if isinstance(value, np.ndarray) and name.startswith(("node_", "gpu_", "model_")) and name != "node_version"
    }


# change counters: every commit and release moves them on, by design
COUNTERS = {"node_version"}


def assert_same_arrays(
    before: dict[str, np.ndarray], after: dict[str, np.ndarray], ignore: set[str] | frozenset[str] = frozenset()
) -> None:
    assert before.keys() == after.keys()
    for name in before.keys() - ignore:
        assert np.array_equal(before[name], after[name], equal_nan=name == "node_price"), name


class Ledger:
    """Dynamic MIG instances committed per (node, GPU), to check they never overlap, and the usage
    read-outs kept beside the inventory, to check them after every change."""

    def __init__(self, usage: UsageTotals) -> None:
        self.instances: dict[tuple[str, int], list[tuple[int, int]]] = {}
        self.usage = usage

    def apply(self, inv: Inventory, placement: Placement, sign: int) -> None:
        row = inv.index[placement.node]
        family = inv.models[int(inv.node_model[row])].mig_family
        if int(inv.node_mig_mode[row]) != MigMode.DYNAMIC or family is None:
            return
        for slot in placement.slots:
            if slot.mig:
                entry = (resolve_profile(family, slot.mig)[0], slot.start)
                key = (placement.node, slot.index)
                if sign > 0:
                    self.instances.setdefault(key, []).append(entry)
                else:
                    self.instances[key].remove(entry)


def check_invariants(inv: Inventory, ledger: Ledger) -> None:
    """Capacities stay in range; MIG instances are disjoint and within compute; static use is real."""
    n = inv.size
    active = inv.node_active[:n]
    for arr in (inv.node_cpu_free, inv.node_mem_free, inv.node_pods_free):
        assert (arr[:n][active] >= 0).all()
    assert (inv.node_cpu_free[:n] <= inv.node_cpu_cap[:n]).all()
    assert (inv.node_mem_free[:n] <= inv.node_mem_cap[:n]).all()
    assert (inv.node_pods_free[:n] <= inv.node_pods_cap[:n]).all()
    for row in range(n):
        if not active[row]:
            continue
        rows = inv.gpu_rows(row)
        milli = inv.gpu_milli_free[rows]
        assert ((milli >= 0) & (milli <= MILLI_PER_GPU)).all()
        assert (milli[inv.gpu_whole[rows]] == 0).all()
        assert (inv.gpu_static_used[rows] & ~inv.gpu_static[rows] == 0).all()
        compute_total = int(inv.model_compute[int(inv.node_model[row])])
        name = inv.names[row]
        assert name is not None  # a live row
        for j in range(int(inv.node_gpu_count[row])):
            g = row * MAX_GPUS + j
            instances = ledger.instances.get((name, j), [])
            mask = 0
            compute = 0
            for shape, start in instances:
                bits = slice_bits(SHAPES[shape].size, start)
                assert mask & bits == 0, f"{name} GPU {j}: MIG instances overlap"
                mask |= bits
                compute += SHAPES[shape].compute
            assert mask == int(inv.gpu_slices[g])
            assert compute == int(inv.gpu_compute[g]) <= compute_total
            if instances:
                assert not inv.gpu_whole[g] and inv.gpu_milli_free[g] == MILLI_PER_GPU
    assert ledger.usage.free_mig_slices() == usage_one_by_one(inv)[1]
    assert ledger.usage.gpus_allocated() == pytest.approx(usage_one_by_one(inv)[0])


PLACEMENTS = range(len(PLACEMENT_SHAPE))


def usage_one_by_one(inv: Inventory) -> tuple[float, int]:
    """`UsageTotals`' GPUs allocated and free MIG slices, GPU by GPU in plain Python."""
    allocated, free_mig = 0.0, 0
    for row in inv.index.values():
        mode = MigMode(int(inv.node_mig_mode[row]))
        compute_total = int(inv.model_compute[int(inv.node_model[row])])
        for g in range(row * MAX_GPUS, row * MAX_GPUS + int(inv.node_gpu_count[row])):
            used_static = [SHAPES[int(PLACEMENT_SHAPE[p])] for p in PLACEMENTS if int(inv.gpu_static_used[g]) >> p & 1]
            idle = int(inv.gpu_static[g]) & ~int(inv.gpu_static_used[g])
            idle_static = [SHAPES[int(PLACEMENT_SHAPE[p])] for p in PLACEMENTS if idle >> p & 1]
            compute = int(inv.gpu_compute[g]) + sum(shape.compute for shape in used_static)
            share = 1.0 if inv.gpu_whole[g] else (MILLI_PER_GPU - int(inv.gpu_milli_free[g])) / MILLI_PER_GPU
            allocated += share + compute / compute_total
            if mode == MigMode.DYNAMIC and not inv.gpu_whole[g] and inv.gpu_milli_free[g] == MILLI_PER_GPU:
                free_mig += int(inv.model_slices[int(inv.node_model[row])]) - int(inv.gpu_slices[g]).bit_count()
            elif mode == MigMode.STATIC:
                free_mig += sum(shape.size for shape in idle_static)
    return allocated, free_mig


def assert_agree(engine: Engine, inv: Inventory, policy: PolicySpec, request: PodRequest, **kw: Any) -> Decision:
    """Engine and reference give identical verdicts, scores and placements; returns the engine's decision."""
    before = snapshot(inv)
    fast = engine.decide(request, **kw)
    slow = reference_decide(inv, policy, request, **kw)
    assert_same_arrays(before, snapshot(inv))  # deciding changes nothing
    assert np.array_equal(fast.rows, slow.rows)
    assert fast.verdicts.tolist() == slow.verdicts.tolist(), (request, fast.reasons(), slow.reasons())
    # exact: same expressions in the same order over exact integer fragmentation terms
    assert fast.scores.tolist() == slow.scores.tolist(), (request, fast.scores, slow.scores)
    assert fast.placement == slow.placement, request
    return fast


def check_placement_matches(request: PodRequest, placement: Placement) -> None:
    """A decided placement gives the request exactly what it asked for."""
    assert (placement.cpu_milli, placement.memory_bytes) == (request.cpu_milli, request.memory_bytes)
    if request.kind == Kind.WHOLE:
        assert len({s.index for s in placement.slots}) == len(placement.slots) == request.gpus
    elif request.kind == Kind.SHARE:
        assert [s.milli for s in placement.slots] == [request.milli]
    elif request.kind == Kind.MIG:
        asked = sorted(p for p, c in request.mig for _ in range(c))
        assert sorted(s.mig for s in placement.slots) == asked
    else:
        assert placement.slots == ()


# ---------------------------------------------------------------------------------------- the test


@st.composite
def scenario(draw: st.DrawFn) -> tuple[list[NodeFacts], list[PodRequest], int]:
    n_nodes = draw(st.integers(1, 5))
    nodes = [draw(node_facts(f"node-{i}")) for i in range(n_nodes)]
    # a static layout's profiles fit on fewer GPUs than a dynamic model's: drawn twice as often
    pools = [pool for f in nodes if (pool := profile_pool(f)) for _ in range(1 + (f.mig_mode == MigMode.STATIC))]
    products = sorted({f.gpu_product for f in nodes if f.gpu_product})
    stream = draw(st.lists(pod_request(pools, products), min_size=1, max_size=8))
    seed = draw(st.integers(0, 2**32 - 1))
    return nodes, stream, seed


def decision_path(inv: Inventory, request: PodRequest, decision: Decision) -> str:
    """Which path of the kernels a decision took (the tally of `test_engine_matches_reference`)."""
    if decision.placement is None:
        return "infeasible"
    if request.kind == Kind.MIG:
        mode = int(inv.node_mig_mode[inv.index[decision.placement.node]])
        return "static MIG" if mode == MigMode.STATIC else "dynamic MIG"
    return {Kind.SHARE: "share", Kind.WHOLE: "whole GPUs", Kind.NONE: "CPU only"}[request.kind]


def run_stream(
    policy: PolicySpec, nodes: list[NodeFacts], stream: list[PodRequest], seed: int, paths: Counter[str] | None = None
) -> None:
    """Decide the stream (each request twice and sometimes again once placed) with both implementations,
    committing and checking each placement, then release everything; `paths` tallies the decisions."""
    rng = random.Random(seed)
    inv = Inventory(capacity=2)  # small, so adding nodes exercises growth
    ledger = Ledger(UsageTotals(inv))  # reads usage as nodes are added, changed and removed
    for facts in nodes:
        inv.add_node(facts)
        ledger.usage.gpus_allocated()
    if len(nodes) > 1 and rng.random() < 0.3:  # an inactive row
        inv.remove_node(nodes[0].name)
    empty = snapshot(inv)

    def commit(placement: Placement) -> None:
        inv.commit(placement)  # must not raise for a fitting / decided placement
        ledger.apply(inv, placement, +1)
        check_invariants(inv, ledger)

    existing: list[Placement] = []
    for _ in range(rng.randint(0, 8)):
        row = inv.index[rng.choice(sorted(inv.index))]
        placement = random_placement(rng, inv, row)
        if placement is not None:
            commit(placement)
            existing.append(placement)
    prepared = snapshot(inv)

    engine = Engine(inv, policy)
    decided: list[Placement] = []
    # each request is decided twice in a row (the second time from the engine's memo) and, half of the
    # time, asked again once it is placed: the memo then holds every node but the one that changed
    for request in (r for r in stream for _ in range(rng.choice((1, 2)))):
        n = inv.size
        names = sorted(inv.index)
        candidates = None if rng.random() < 0.7 else rng.sample(names, rng.randint(rng.random() < 0.9, len(names)))
        rank = np.array(rng.sample(range(n), n), dtype=np.int64)
        noise = np.array([rng.random() for _ in range(n)], dtype=np.float64)
        decision = assert_agree(engine, inv, policy, request, candidates=candidates, rank=rank, noise=noise)
        if paths is not None:
            paths[decision_path(inv, request, decision)] += 1
        decision = assert_agree(engine, inv, policy, request, candidates=candidates, rank=rank, noise=noise)
        engine.observe(request)
        if decision.placement is not None:
            check_placement_matches(request, decision.placement)
            commit(decision.placement)
            decided.append(decision.placement)

    def release_all(placements: list[Placement]) -> None:
        for placement in rng.sample(placements, len(placements)):
            inv.release(placement)
            ledger.apply(inv, placement, -1)
            check_invariants(inv, ledger)

    release_all(decided)
    assert_same_arrays(prepared, snapshot(inv), ignore=COUNTERS)
    release_all(existing)
    assert_same_arrays(empty, snapshot(inv), ignore=COUNTERS)


# fewest decisions per path in one policy's 150 examples (derandomized, ~600-700 decisions per policy:
# share 112-122, whole GPUs 60-125, static MIG 5-7, dynamic MIG 18-30, CPU only 107-121, infeasible
# 30-50 %), so a generator change that starves a path fails here instead of passing quietly. The examples
# are the same in every run only without Hypothesis's pool of constants from loaded modules (the
# `no_local_constants` fixture): with it, the full suite, which imports every module, drew other ones
# (625 decisions, 4 static MIG for gpupack-tuned) than this file alone.
MIN_PATHS = {
    "share": 25,
    "whole GPUs": 25,
    "static MIG": 5,
    "dynamic MIG": 15,
    "CPU only": 30,
    "infeasible": 20,
}

# most requests fit somewhere; gpupack-tuned forbids spot nodes to the non-interruptible pods, about half
# of the generated nodes, and half of its requests (303 of 606) find no node
MOST_INFEASIBLE = {"gpupack-tuned": 0.6}


@pytest.fixture
def no_local_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hypothesis mixes constants found in the loaded local modules into what it draws (5 % of draws), so
    a derandomized run still drew other examples when the whole suite had imported more of gpupack: the
    per-path floors below then failed or held by luck. Without that pool the examples depend on the seed
    alone. A private hook: if a Hypothesis release moves it, this fails loudly rather than go random."""
    assert callable(hypothesis_providers._get_local_constants), "hypothesis moved _get_local_constants"
    sorted_set = hypothesis_providers.SortedSet
    empty = hypothesis_providers.Constants(
        integers=sorted_set(), floats=sorted_set(key=float_to_int), bytes=sorted_set(), strings=sorted_set()
    )
    monkeypatch.setattr(hypothesis_providers, "_get_local_constants", lambda: empty)


@pytest.mark.slow
@pytest.mark.parametrize("policy_name", ALL_POLICIES)
@pytest.mark.usefixtures("no_local_constants")
def test_engine_matches_reference(policy_name: str) -> None:
    paths: Counter[str] = Counter()

    # derandomized: the same 150 examples every run, so the per-path floors below hold or fail for a
    # change in the code or the generator, never for the luck of the draw (a random run once drew 51 %
    # infeasible requests for gpupack-tuned)
    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
    @given(case=scenario())
    def agree(case: tuple[list[NodeFacts], list[PodRequest], int]) -> None:
        nodes, stream, seed = case
        run_stream(make_policy(policy_name, stream), nodes, stream, seed, paths)

    agree()
    short = {path: paths[path] for path, least in MIN_PATHS.items() if paths[path] < least}
    assert not short, f"paths reached too rarely: {short} of {dict(paths)}"
    assert paths["infeasible"] < MOST_INFEASIBLE.get(policy_name, 0.5) * paths.total(), dict(paths)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=scenario(), data=st.data())
def test_learned_mix_after_refresh(case: tuple[list[NodeFacts], list[PodRequest], int], data: st.DataObject) -> None:
    """gpupack once its learned mix has refreshed from observed requests (not just the prior)."""
    nodes, stream, seed = case
    warmup = data.draw(st.lists(pod_request(), min_size=1, max_size=4))
    policy = gpupack()
    for _ in range(16):
        for request in warmup:
            policy.mix.observe(request)  # 64 observations trigger a refresh
    run_stream(policy, nodes, stream, seed)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_sixteen_gpu_node(data: st.DataObject) -> None:
    """The largest node (16 GPUs: every GPU-set bitmask the kernel enumerates) agrees too."""
    count = 16
    values = data.draw(st.lists(st.integers(0, 4), min_size=count * count, max_size=count * count))
    matrix = [[values[i * count + j] if i < j else values[j * count + i] for j in range(count)] for i in range(count)]
    for i in range(count):
        matrix[i][i] = 0
    facts = NodeFacts(
        "big",
        256000,
        1024 * GIB,
        gpu_product="NVIDIA-L40S",
        gpu_count=count,
        nvlink=tuple(tuple(row) for row in matrix),
        numa=tuple(data.draw(st.lists(st.integers(0, 3), min_size=count, max_size=count))),
    )
    gpus = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=6))
    stream = [PodRequest(cpu_milli=100, kind=Kind.WHOLE, gpus=g) for g in gpus]
    policy = data.draw(st.sampled_from(["gpupack", "kube-default+sets", "first-fit"]))
    run_stream(make_policy(policy, stream), [facts], stream, data.draw(st.integers(0, 2**32 - 1)))


def test_memo_follows_the_candidates_price_and_memory_maxima() -> None:
    """The same request against fewer candidates: the cost and model-fit terms are relative to the
    candidates' highest price and largest GPU memory, so scores read from the engine's memo must
    not outlive a change of those maxima (the stream above rarely repeats a request that way)."""
    nodes = [
        NodeFacts("h200", 64_000, 512 * GIB, gpu_product="NVIDIA-H200", gpu_count=8, hourly_cost=90.0),
        NodeFacts("h100", 64_000, 512 * GIB, gpu_product="NVIDIA-H100-80GB-HBM3", gpu_count=8, hourly_cost=60.0),
        NodeFacts("l4", 64_000, 512 * GIB, gpu_product="NVIDIA-L4", gpu_count=8, hourly_cost=10.0),
    ]
    inv = Inventory()
    for facts in nodes:
        inv.add_node(facts)
    policy = gpupack()
    engine = Engine(inv, policy)
    request = PodRequest(1000, GIB, Kind.WHOLE, gpus=1)
    for candidates in (None, ["h100", "l4"], ["l4"], ["h100", "l4"], None, ["h200", "l4"]):
        first = assert_agree(engine, inv, policy, request, candidates=candidates)
        again = assert_agree(engine, inv, policy, request, candidates=candidates)
        assert again.placement == first.placement and again.scores.tolist() == first.scores.tolist()
