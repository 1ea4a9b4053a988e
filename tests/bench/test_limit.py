"""The limit (bench.limit): the pattern-LP bound is never below what an exhaustive search places, the
offline packing never above it, and the knapsacks are exact; on small random instances."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import orjson
import pytest

from gpupack.bench.limit.instance import build_instance
from gpupack.bench.limit.knapsack import best_fill
from gpupack.bench.limit.node_lp import NodeLp
from gpupack.bench.limit.packing import lay_out
from gpupack.bench.limit.pattern_lp import solve_bound
from gpupack.bench.limit.solve import limit_of, unallocated_pct
from gpupack.scoring.facts import MigMode, NodeFacts
from gpupack.scoring.request import MILLI_PER_GPU, Kind, PodRequest

GIB = 1 << 30
SHARES = (250, 300, 400, 470, 500, 530, 650, 700, 810)


def node(name: str, product: str, gpus: int, cpu: int = 8000, memory_gib: int = 16) -> NodeFacts:
    return NodeFacts(name=name, cpu_milli=cpu, memory_bytes=memory_gib * GIB, pods=110, gpu_product=product,
                     gpu_count=gpus, mig_mode=MigMode.NONE)  # fmt: skip


def share(milli: int, cpu: int = 1000, memory_gib: int = 1, products: frozenset[str] | None = None) -> PodRequest:
    return PodRequest(cpu_milli=cpu, memory_bytes=memory_gib * GIB, kind=Kind.SHARE, milli=milli,
                      allowed_products=products)  # fmt: skip


def whole(gpus: int, cpu: int = 1000, memory_gib: int = 1, products: frozenset[str] | None = None) -> PodRequest:
    return PodRequest(cpu_milli=cpu, memory_bytes=memory_gib * GIB, kind=Kind.WHOLE, gpus=gpus,
                      allowed_products=products)  # fmt: skip


def exhaustive(requests: Sequence[PodRequest], nodes: Sequence[NodeFacts]) -> int:
    """The most GPU milli any placement of `requests` holds, by trying every one."""
    free = [[MILLI_PER_GPU] * n.gpu_count for n in nodes]
    cpu = [n.cpu_milli for n in nodes]
    memory = [n.memory_bytes for n in nodes]

    def best(i: int) -> int:
        if i == len(requests):
            return 0
        request, most = requests[i], best(i + 1)  # the pod left out
        for k, facts in enumerate(nodes):
            allowed = request.allowed_products is None or facts.gpu_product in request.allowed_products
            if not allowed or request.cpu_milli > cpu[k] or request.memory_bytes > memory[k]:
                continue
            cpu[k] -= request.cpu_milli
            memory[k] -= request.memory_bytes
            for gpus, take in _choices(request, free[k]):
                for g in gpus:
                    free[k][g] -= take
                most = max(most, take * len(gpus) + best(i + 1))
                for g in gpus:
                    free[k][g] += take
            cpu[k] += request.cpu_milli
            memory[k] += request.memory_bytes
        return most

    return best(0)


def _choices(request: PodRequest, free: list[int]) -> list[tuple[tuple[int, ...], int]]:
    """(GPUs, milli taken from each) for every way `request` fits the node's GPUs."""
    if request.kind == Kind.WHOLE:
        untouched = [g for g, milli in enumerate(free) if milli == MILLI_PER_GPU]
        return [(gpus, MILLI_PER_GPU) for gpus in itertools.combinations(untouched, request.gpus)]
    return [((g,), request.milli) for g, milli in enumerate(free) if milli >= request.milli]


def random_instance(seed: int) -> tuple[list[PodRequest], list[NodeFacts]]:
    rng = np.random.default_rng(seed)
    nodes = [
        node(f"n{k}", str(rng.choice(["A", "B"])), int(rng.integers(1, 3)), int(rng.choice([3000, 6000, 9000])),
             int(rng.choice([4, 8, 16])))
        for k in range(int(rng.integers(1, 4)))
    ]  # fmt: skip
    requests = []
    for _ in range(int(rng.integers(1, 7))):
        products = None if rng.random() < 0.7 else frozenset({"A"})
        cpu, memory = int(rng.choice([500, 1000, 2000, 4000])), int(rng.choice([1, 2, 6]))
        if rng.random() < 0.35:
            requests.append(whole(int(rng.integers(1, 3)), cpu, memory, products))
        else:
            requests.append(share(int(rng.choice(SHARES)), cpu, memory, products))
    return requests, nodes


@pytest.mark.parametrize("seed", range(120))
def test_bound_is_never_below_the_exhaustive_optimum_nor_the_packing_above_it(seed: int) -> None:
    requests, nodes = random_instance(seed)
    optimum = exhaustive(requests, nodes)
    instance = build_instance(requests, nodes)
    bound = solve_bound(instance)
    assert bound.bound_milli >= optimum - 1e-6, (bound.bound_milli, optimum)
    assert bound.lp_milli <= bound.bound_milli + 1e-6
    node_lp = NodeLp(instance, bound.gpu_patterns)
    node_lp.generate()
    packing = lay_out(requests, nodes, node_lp, node_lp.integer_choice(5.0))  # commits every placement
    assert packing.placed_milli <= optimum
    placed = sum(requests[i].gpus * MILLI_PER_GPU or requests[i].milli for i in packing.placements)
    assert packing.placed_milli == placed


def test_shares_that_cannot_add_up_leave_the_rest_of_the_gpu_unallocated() -> None:
    # two 600s never share a GPU: one GPU holds 600 at most, whatever the order or the scheduler
    limit = limit_of([share(600), share(600)], [node("n", "A", 1)], packing=True)
    assert limit.bound == pytest.approx(40.0) and limit.packing == pytest.approx(40.0)
    # 470 + 530 fill a GPU exactly; a greedy first 470 + 470 would strand 60
    pods = [share(470), share(470), share(530), share(530)]
    limit = limit_of(pods, [node("n", "A", 2)], packing=True)
    assert limit.bound == pytest.approx(0.0) and limit.packing == pytest.approx(0.0)


def test_cpu_and_models_bound_what_the_gpus_could_hold() -> None:
    # the node has the GPUs for both pods but the CPU for one; the other node's model suits neither. The
    # LP holds CPU in total per node type, so it may place 8000/5000 = 1.6 pods: a bound, not a placement
    pods = [whole(1, cpu=5000, products=frozenset({"A"})), whole(1, cpu=5000, products=frozenset({"A"}))]
    limit = limit_of(pods, [node("a", "A", 2, cpu=8000), node("b", "B", 2)], packing=True)
    assert limit.bound == pytest.approx(unallocated_pct(1.6 * MILLI_PER_GPU, 4))
    assert limit.packing == pytest.approx(unallocated_pct(MILLI_PER_GPU, 4))
    assert orjson.loads(orjson.dumps(limit.to_json()))["bound_unallocated"] == round(limit.bound, 4)  # plain floats
    without_cpu = limit_of([whole(1, products=frozenset({"A"}))] * 2, [node("a", "A", 2), node("b", "B", 2)], True)
    assert without_cpu.bound == pytest.approx(50.0) and without_cpu.packing == pytest.approx(50.0)


@pytest.mark.parametrize("seed", range(40))
def test_best_fill_is_the_exhaustive_best(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.integers(1, 6, size=int(rng.integers(1, 5)))]
    values = [float(v) for v in rng.normal(3, 3, size=len(sizes))]
    capacity = int(rng.integers(0, 12))
    value, counts = best_fill(sizes, values, capacity)
    ranges = [range(capacity // s + 1) for s in sizes]
    best = max(
        sum(c * v for c, v in zip(combo, values, strict=True))
        for combo in itertools.product(*ranges)
        if sum(c * s for c, s in zip(combo, sizes, strict=True)) <= capacity
    )
    assert value == pytest.approx(max(best, 0.0))
    assert sum(c * s for c, s in zip(counts, sizes, strict=True)) <= capacity
    assert sum(c * v for c, v in zip(counts, values, strict=True)) == pytest.approx(value)


def test_best_fill_refuses_items_without_a_size() -> None:
    with pytest.raises(ValueError, match="positive size"):
        best_fill([0], [1.0], 3)


def test_every_file_a_limit_job_is_keyed_on_exists_and_no_policy_module_is_among_them() -> None:
    from gpupack.bench import job_cache

    for entry in (*job_cache.CODE, *job_cache.LIMIT_CODE):
        assert (job_cache.PACKAGE / entry).exists(), entry
    assert not {"scoring", "scoring/policies.py", "scoring/kernels.py", "scoring/mix.py"} & set(job_cache.LIMIT_CODE)
