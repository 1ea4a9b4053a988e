"""Whole-node patterns for the offline packing: each node's whole-GPU pods and GPU patterns at once.

The bound's LP (`pattern_lp`) holds the CPU and memory of shares only per node type, so its solution may
ask a node for more CPU than it has. Here a column is one node's full content: whole-GPU shapes and GPU
patterns (taken from those the bound's LP generated), within the node's GPUs, CPU and memory; the best
column of a type for given prices is a small integer program, and an integer program over the generated
columns picks what each node holds. Every node so chosen fits by construction; this gives an achievable
packing, not a bound (the GPU patterns are not generated anew here).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from gpupack.bench.limit.instance import Instance, NodeType, accepts
from gpupack.bench.limit.pattern_lp import GIB, REDUCED_COST_TOLERANCE, GpuPattern
from gpupack.bench.limit.restricted import RestrictedLp

MAX_ROUNDS = 300
PRICING_SECONDS = 5.0


@dataclass(frozen=True)
class FullPattern:
    """One node of `node_type`: `wholes[i]` pods of the i-th whole shape and `gpus[j]` GPUs laid out as
    the j-th GPU pattern of the type's pool."""

    node_type: NodeType
    wholes: tuple[int, ...]
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class _Item:
    """Something a node can hold: a whole-GPU shape or a GPU pattern; its sizes and its demand rows."""

    gpus: int
    cpu_milli: int
    memory_gib: float
    milli: int
    rows: tuple[tuple[int, int], ...]  # (demand row, pods of that shape)


class NodeLp:
    """The full-node master problem of one instance, over pools of GPU patterns per node type."""

    def __init__(self, instance: Instance, gpu_patterns: list[GpuPattern]) -> None:
        self.instance = instance
        self.types = list(instance.node_types)
        self.wholes, self.shares = list(instance.wholes), list(instance.shares)
        self.pools = {t: [p for p in gpu_patterns if self._fits_type(p, t)] for t in self.types}
        self.items = {t: self._items(t) for t in self.types}
        rhs = [*instance.node_types.values(), *instance.wholes.values(), *instance.shares.values()]
        self.lp: RestrictedLp[FullPattern] = RestrictedLp("node LP", np.array(rhs, dtype=float))
        for t in self.types:
            self.add(FullPattern(t, (0,) * len(self.wholes), (0,) * len(self.pools[t])))

    def _fits_type(self, pattern: GpuPattern, node_type: NodeType) -> bool:
        return pattern.node_type.product == node_type.product and all(
            accepts(s.products, node_type.product) for s, n in zip(self.shares, pattern.shares, strict=True) if n
        )

    def _items(self, node_type: NodeType) -> list[_Item]:
        """Whole shapes the type accepts, then its pool of GPU patterns."""
        first_share = len(self.types) + len(self.wholes)
        items = [
            _Item(s.gpus, s.cpu_milli, s.memory_bytes / GIB, s.milli, ((len(self.types) + i, 1),))
            for i, s in enumerate(self.wholes)
        ]
        for pattern in self.pools[node_type]:
            used = [(i, n) for i, n in enumerate(pattern.shares) if n]
            items.append(
                _Item(
                    1,
                    sum(self.shares[i].cpu_milli * n for i, n in used),
                    sum(self.shares[i].memory_bytes * n for i, n in used) / GIB,
                    sum(self.shares[i].milli * n for i, n in used),
                    tuple((first_share + i, n) for i, n in used),
                )
            )
        return items

    def add(self, pattern: FullPattern) -> None:
        """Take `pattern` into the restricted problem."""
        column = np.zeros(len(self.lp.rhs))
        column[self.types.index(pattern.node_type)] = 1
        value = 0
        for item, count in zip(self.items[pattern.node_type], pattern.wholes + pattern.gpus, strict=True):
            for row, pods in item.rows:
                column[row] += pods * count
            value += item.milli * count
        self.lp.take(pattern, column, value)

    def price(self, prices: np.ndarray, node_type: NodeType) -> tuple[float, FullPattern]:
        """The column of `node_type` with the largest reduced cost (HiGHS within PRICING_SECONDS)."""
        items = self.items[node_type]
        blocked = [
            k < len(self.wholes) and not accepts(self.wholes[k].products, node_type.product) for k in range(len(items))
        ]
        values = np.array([
            0.0 if no else item.milli - sum(prices[row] * pods for row, pods in item.rows)
            for item, no in zip(items, blocked, strict=True)
        ])  # fmt: skip
        empty = self.lp.patterns[self.types.index(node_type)]
        if not (values > REDUCED_COST_TOLERANCE).any():
            return -prices[self.types.index(node_type)], empty
        upper = [0 if no or item.gpus > node_type.gpus else node_type.gpus // item.gpus
                 for item, no in zip(items, blocked, strict=True)]  # fmt: skip
        limits = LinearConstraint(
            np.array([[i.gpus for i in items], [i.cpu_milli for i in items], [i.memory_gib for i in items]]),
            -np.inf,
            [node_type.gpus, node_type.cpu_milli, node_type.memory_bytes / GIB],
        )
        result = milp(
            -values, constraints=limits, integrality=np.ones(len(items)), bounds=Bounds(0, upper),
            options={"time_limit": PRICING_SECONDS},
        )  # fmt: skip
        if result.x is None:
            return 0.0, empty
        counts = tuple(int(n) for n in np.rint(result.x))
        pattern = FullPattern(node_type, counts[: len(self.wholes)], counts[len(self.wholes) :])
        return -float(result.fun) - prices[self.types.index(node_type)], pattern

    def generate(self) -> None:
        """Column generation until no type offers a column with a positive reduced cost."""
        for _ in range(MAX_ROUNDS):
            _, prices = self.lp.solve()
            new = [p for reduced, p in (self.price(prices, t) for t in self.types)
                   if reduced > REDUCED_COST_TOLERANCE and p not in self.lp.known]  # fmt: skip
            if not new:
                return
            for pattern in new:
                self.add(pattern)

    def integer_choice(self, seconds: float) -> dict[FullPattern, int]:
        """How many nodes take each generated column: HiGHS's best integer answer within `seconds`."""
        return self.lp.integer_choice(seconds)
