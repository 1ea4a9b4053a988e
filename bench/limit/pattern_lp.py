"""The pattern LP: how much GPU milli any placement of an instance can hold, bounded from above.

Columns are patterns. A node pattern says which whole-GPU pods one node of a type holds (within its GPUs);
the GPUs it leaves free go to a pool of that node type. A GPU pattern says which shares one GPU of a node
type holds (their milli add up to at most 1000). Rows: nodes per type; pods per shape; per node type, the
free GPUs the node patterns leave, which the GPU patterns may use, and the type's CPU and memory in total.
Shares and whole GPUs never mix on a GPU (a whole-GPU pod needs a GPU nothing else uses), so any placement
of the pods gives a non-negative integer point of this LP; the LP optimum over all patterns is therefore an
upper bound on the milli any placement holds. (CPU and memory count per node type, not per node: a
relaxation, which keeps the bound valid and its solve fast; docs/limit.md.)

Column generation finds that optimum without listing the patterns: given the row prices (duals), the best
node pattern of a type is a knapsack over its GPUs and the best GPU pattern one over milli, both solved
exactly by dynamic programming (`knapsack`); the loop stops when none has a positive reduced cost. The
bound returned is the Lagrangian one (the dual objective plus each type's largest positive reduced cost
times how often such a pattern could be used), so it stays valid when the solver's tolerances leave a
small positive reduced cost.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gpupack.bench.limit.instance import Instance, NodeType, ShareShape, WholeShape, accepts
from gpupack.bench.limit.knapsack import best_fill
from gpupack.bench.limit.restricted import RestrictedLp
from gpupack.scoring.request import MILLI_PER_GPU

MAX_ROUNDS = 500
REDUCED_COST_TOLERANCE = 1e-6
GIB = 1 << 30  # memory rows in GiB, so that no row's numbers dwarf the others'


@dataclass(frozen=True)
class NodePattern:
    """One node of `node_type` holding `wholes[i]` pods of the instance's i-th whole shape."""

    node_type: NodeType
    wholes: tuple[int, ...]


@dataclass(frozen=True)
class GpuPattern:
    """One GPU of a `node_type` node holding `shares[i]` pods of the instance's i-th share shape."""

    node_type: NodeType
    shares: tuple[int, ...]


Pattern = NodePattern | GpuPattern


@dataclass
class LimitBound:
    """The bound, the LP's own optimum, and the GPU patterns generated on the way (the offline packing
    builds its nodes from them)."""

    bound_milli: float
    lp_milli: float
    gpu_patterns: list[GpuPattern] = field(default_factory=list)
    rounds: int = 0
    columns: int = 0
    seconds: float = 0.0


class _Rows:
    """Where each row of the LP is: one block per kind, in this order."""

    def __init__(self, instance: Instance) -> None:
        self.types = list(instance.node_types)
        self.wholes = list(instance.wholes)
        self.shares = list(instance.shares)
        t, w, s = len(self.types), len(self.wholes), len(self.shares)
        self.whole_at, self.share_at, self.supply_at = t, t + w, t + w + s
        self.cpu_at, self.memory_at, self.size = 2 * t + w + s, 3 * t + w + s, 4 * t + w + s
        counts = list(instance.node_types.values())
        self.rhs = np.array(
            [*counts, *instance.wholes.values(), *instance.shares.values(), *[0] * t]
            + [n * k.cpu_milli for k, n in zip(self.types, counts, strict=True)]
            + [n * k.memory_bytes / GIB for k, n in zip(self.types, counts, strict=True)],
            dtype=float,
        )

    def type_rows(self, node_type: NodeType) -> tuple[int, int, int, int]:
        """The type's count, free-GPU, CPU and memory rows."""
        k = self.types.index(node_type)
        return k, self.supply_at + k, self.cpu_at + k, self.memory_at + k


def _requests(shapes: Sequence[WholeShape | ShareShape], counts: tuple[int, ...]) -> tuple[int, float]:
    """CPU milli and memory GiB of `counts[i]` pods of each shape."""
    cpu = sum(n * s.cpu_milli for n, s in zip(counts, shapes, strict=True))
    return cpu, sum(n * s.memory_bytes for n, s in zip(counts, shapes, strict=True)) / GIB


class _Master:
    """The restricted master LP: the rows of the instance and the patterns generated so far."""

    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        self.rows = _Rows(instance)
        self.lp: RestrictedLp[Pattern] = RestrictedLp("pattern LP", self.rows.rhs)
        empty = (0,) * len(self.rows.wholes)
        self.add([NodePattern(t, empty) for t in self.rows.types])

    def add(self, patterns: list[Pattern]) -> None:
        """Take `patterns` into the restricted LP."""
        for pattern in patterns:
            self.lp.take(pattern, self.column(pattern), self.value(pattern))

    def value(self, pattern: Pattern) -> int:
        """The milli one use of `pattern` places."""
        if isinstance(pattern, NodePattern):
            return sum(n * s.milli for n, s in zip(pattern.wholes, self.rows.wholes, strict=True))
        return sum(n * s.milli for n, s in zip(pattern.shares, self.rows.shares, strict=True))

    def column(self, pattern: Pattern) -> np.ndarray:
        """The pattern's coefficients in every row."""
        rows, column = self.rows, np.zeros(self.rows.size)
        count_row, supply_row, cpu_row, memory_row = rows.type_rows(pattern.node_type)
        if isinstance(pattern, NodePattern):
            column[count_row] = 1
            column[rows.whole_at : rows.share_at] = pattern.wholes
            used = sum(n * s.gpus for n, s in zip(pattern.wholes, rows.wholes, strict=True))
            column[supply_row] = -(pattern.node_type.gpus - used)
            column[cpu_row], column[memory_row] = _requests(rows.wholes, pattern.wholes)
        else:
            column[rows.share_at : rows.supply_at] = pattern.shares
            column[supply_row] = 1
            column[cpu_row], column[memory_row] = _requests(rows.shares, pattern.shares)
        return column


def _node_pricing(rows: _Rows, prices: np.ndarray, node_type: NodeType) -> tuple[float, NodePattern]:
    """The node pattern of `node_type` with the largest reduced cost, and that cost."""
    count_row, supply_row, cpu_row, memory_row = rows.type_rows(node_type)
    supply = prices[supply_row]
    eligible = [
        i for i, s in enumerate(rows.wholes) if s.gpus <= node_type.gpus and accepts(s.products, node_type.product)
    ]
    values = [
        rows.wholes[i].milli - prices[rows.whole_at + i] - rows.wholes[i].gpus * supply
        - rows.wholes[i].cpu_milli * prices[cpu_row] - rows.wholes[i].memory_bytes / GIB * prices[memory_row]
        for i in eligible
    ]  # fmt: skip
    best, counts = best_fill([rows.wholes[i].gpus for i in eligible], values, node_type.gpus)
    wholes = [0] * len(rows.wholes)
    for i, count in zip(eligible, counts, strict=True):
        wholes[i] = count
    return node_type.gpus * supply - prices[count_row] + best, NodePattern(node_type, tuple(wholes))


def _gpu_pricing(rows: _Rows, prices: np.ndarray, node_type: NodeType) -> tuple[float, GpuPattern]:
    """The GPU pattern of `node_type` with the largest reduced cost, and that cost."""
    _, supply_row, cpu_row, memory_row = rows.type_rows(node_type)
    eligible = [i for i, s in enumerate(rows.shares) if accepts(s.products, node_type.product)]
    unit = math.gcd(MILLI_PER_GPU, *(rows.shares[i].milli for i in eligible))
    values = [
        s.milli - prices[rows.share_at + i] - s.cpu_milli * prices[cpu_row] - s.memory_bytes / GIB * prices[memory_row]
        for i, s in ((i, rows.shares[i]) for i in eligible)
    ]
    best, counts = best_fill([rows.shares[i].milli // unit for i in eligible], values, MILLI_PER_GPU // unit)
    shares = [0] * len(rows.shares)
    for i, count in zip(eligible, counts, strict=True):
        shares[i] = count
    return best - prices[supply_row], GpuPattern(node_type, tuple(shares))


def _price_all(master: _Master, prices: np.ndarray) -> tuple[list[Pattern], float]:
    """Patterns with a positive reduced cost, and the Lagrangian slack: per type, the best positive reduced
    cost of a node pattern times its nodes and of a GPU pattern times its GPUs."""
    found: list[Pattern] = []
    slack = 0.0
    for node_type, count in master.instance.node_types.items():
        for (reduced, pattern), uses in (
            (_node_pricing(master.rows, prices, node_type), count),
            (_gpu_pricing(master.rows, prices, node_type), count * node_type.gpus),
        ):
            if reduced > 0:
                slack += reduced * uses
            if reduced > REDUCED_COST_TOLERANCE and pattern not in master.lp.known:
                found.append(pattern)
    return found, slack


def solve_bound(instance: Instance) -> LimitBound:
    """Column generation to the LP optimum, and the Lagrangian bound of the last prices."""
    started = time.perf_counter()
    master = _Master(instance)
    bound, lp_value, rounds = math.inf, 0.0, 0
    while rounds < MAX_ROUNDS:
        rounds += 1
        lp_value, prices = master.lp.solve()
        new, slack = _price_all(master, prices)
        bound = min(bound, float(prices @ master.rows.rhs) + slack)
        if not new:
            break
        master.add(new)
    gpu_patterns = [p for p in master.lp.patterns if isinstance(p, GpuPattern)]
    return LimitBound(bound, lp_value, gpu_patterns, rounds, len(master.lp.patterns), time.perf_counter() - started)
