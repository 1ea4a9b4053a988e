"""GPU pools (GPU model x capacity type) and what each holds, wastes and costs, kept at O(changed nodes).

Per node: GPUs, GPUs allocated (shares by their fraction, MIG by compute slices), idle GPUs and their
$/h (the node's price x idle / GPUs), free MIG slices (as `scoring.usage`), stranded MIG slices, and
whether no GPU of it is in use (a node that could be released) and its price then.

A free MIG memory slice is *stranded* when no pod can use it as things stand: on a dynamic-MIG GPU no
profile of the GPU's family fits at a placement covering it (its neighbours are taken, or the GPU's
compute slices are used up — seven 1g instances leave the eighth memory slice stranded), or its
node has no free pod slot. Free static instances can be used as they are, so they strand only with
the pod slots.

`PoolTotals` keeps each pool's sums and, on each read, recomputes only the nodes whose
`node_version` or active flag moved since the last read (as `scoring.usage.UsageTotals`): a
/metrics scrape costs O(changed nodes) of Python, not O(cluster).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupack.scoring.facts import MigMode
from gpupack.scoring.geometry import FREE_STARTS, SHAPES, slice_bits
from gpupack.scoring.inventory import MAX_GPUS, Inventory
from gpupack.scoring.request import MILLI_PER_GPU
from gpupack.scoring.usage import node_usage

SPOT = "spot"
ON_DEMAND = "on-demand"
# columns of a node's figures (and of a pool's sums)
NODES, GPUS, ALLOCATED, IDLE, IDLE_COST, FREE_MIG, STRANDED, HOURLY, EMPTY_NODES, EMPTY_COST = range(10)
FIGURES = ("nodes", "gpus", "gpus_allocated", "idle_gpus", "idle_hourly_cost", "free_mig_slices",
           "stranded_mig_slices", "hourly_cost", "empty_nodes", "empty_hourly_cost")  # fmt: skip


def _stranded_table() -> np.ndarray:
    """STRANDED[geometry (0: 8 slices, 1: A30's 4), compute slices left (0..7), occupied mask]: free
    memory slices that no instance of the family's shapes can cover."""
    table = np.zeros((2, 8, 256), dtype=np.int64)
    for geometry, slices in ((0, 8), (1, 4)):
        shapes = [(sid, shape) for sid, shape in enumerate(SHAPES) if shape.slices == slices]
        for compute_left in range(8):
            for mask in range(1 << slices):
                usable = 0
                for sid, shape in shapes:
                    if shape.compute > compute_left:
                        continue
                    starts = int(FREE_STARTS[sid, mask])
                    for start in shape.starts:
                        if starts >> start & 1:
                            usable |= slice_bits(shape.size, start)
                free = ~mask & ((1 << slices) - 1)
                table[geometry, compute_left, mask] = bin(free & ~usable).count("1")
    return table


_STRANDED_BY_MASK = _stranded_table()


def stranded_slices(inv: Inventory, rows: np.ndarray, free_mig: np.ndarray) -> np.ndarray:
    """Stranded MIG slices of each node in `rows` (see the module docstring); `free_mig` is its free
    MIG slices (`scoring.usage.node_usage`), all of which strand on a node without a free pod slot."""
    gpu = rows[:, None] * MAX_GPUS + np.arange(MAX_GPUS)[None, :]
    present = np.arange(MAX_GPUS)[None, :] < inv.node_gpu_count[rows][:, None]
    model = inv.node_model[rows][:, None]
    dynamic = inv.node_mig_mode[rows][:, None] == MigMode.DYNAMIC
    partitioned = dynamic & ~inv.gpu_whole[gpu] & (inv.gpu_milli_free[gpu] == MILLI_PER_GPU) & present
    geometry = (inv.model_slices[model] == 4).astype(np.int64)
    compute_left = np.clip(inv.model_compute[model] - inv.gpu_compute[gpu], 0, 7)
    stranded = _STRANDED_BY_MASK[geometry, compute_left, inv.gpu_slices[gpu] & 0xFF] * partitioned
    by_node = stranded.sum(axis=1)
    return np.where(inv.node_pods_free[rows] < 1, free_mig, by_node)


def node_figures(inv: Inventory, rows: np.ndarray) -> np.ndarray:
    """The figures (columns NODES .. EMPTY_COST) of each node in `rows`; a node without GPUs is all 0."""
    allocated, free_mig = node_usage(inv, rows)
    gpus = inv.node_gpu_count[rows].astype(np.float64)
    has_gpus = gpus > 0
    price = np.nan_to_num(inv.node_price[rows], nan=0.0)
    idle = np.maximum(gpus - allocated, 0.0)
    out = np.zeros((rows.size, len(FIGURES)), dtype=np.float64)
    out[:, NODES] = 1
    out[:, GPUS] = gpus
    out[:, ALLOCATED] = allocated
    out[:, IDLE] = idle
    out[:, IDLE_COST] = np.divide(price * idle, gpus, out=np.zeros_like(idle), where=has_gpus)
    out[:, FREE_MIG] = free_mig
    out[:, STRANDED] = stranded_slices(inv, rows, free_mig)
    out[:, HOURLY] = price
    out[:, EMPTY_NODES] = allocated <= 0
    out[:, EMPTY_COST] = price * (allocated <= 0)
    return out * has_gpus[:, None]


@dataclass(frozen=True, order=True)
class PoolKey:
    """A GPU pool: one GPU product on one capacity type."""

    product: str
    capacity_type: str  # SPOT or ON_DEMAND


def pool_of(inv: Inventory, row: int) -> PoolKey:
    """The pool of inventory row `row`."""
    product = inv.models[int(inv.node_model[row])].product
    return PoolKey(product, SPOT if inv.node_spot[row] else ON_DEMAND)


class PoolTotals:
    """Per-pool sums of the node figures of one inventory, kept up to date lazily by node version."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self._version = np.zeros(0, dtype=np.int64)
        self._active = np.zeros(0, dtype=np.bool_)
        self._figures = np.zeros((0, len(FIGURES)), dtype=np.float64)
        self._pool: list[PoolKey | None] = []
        self._sums: dict[PoolKey, np.ndarray] = {}

    def pools(self) -> dict[PoolKey, dict[str, float]]:
        """Every pool with GPUs and its figures by name (see FIGURES), pools sorted."""
        self._refresh()
        return {
            key: {name: _tidy(float(value)) for name, value in zip(FIGURES, sums, strict=True)}
            for key, sums in sorted(self._sums.items())
            if sums[NODES] > 0.5
        }

    def _refresh(self) -> None:
        inv = self.inventory
        n = inv.size
        if len(self._version) < n:
            grown = max(n, 2 * len(self._version))
            extra = grown - len(self._version)
            self._version = np.concatenate([self._version, np.full(extra, -1)])
            self._active = np.concatenate([self._active, np.zeros(extra, dtype=np.bool_)])
            self._figures = np.concatenate([self._figures, np.zeros((extra, len(FIGURES)))])
            self._pool.extend([None] * extra)
        active = inv.node_active[:n]
        stale = np.flatnonzero((self._version[:n] != inv.node_version[:n]) | (self._active[:n] != active))
        if not stale.size:
            return
        fresh = node_figures(inv, stale)
        for i, row in enumerate(stale.tolist()):
            old = self._pool[row]
            if old is not None:
                self._sums[old] -= self._figures[row]
            key = pool_of(inv, row) if active[row] and inv.node_gpu_count[row] > 0 else None
            self._pool[row] = key
            self._figures[row] = fresh[i]
            if key is not None:
                self._sums.setdefault(key, np.zeros(len(FIGURES)))
                self._sums[key] += fresh[i]
        self._version[stale] = inv.node_version[stale]
        self._active[stale] = active[stale]


def _tidy(value: float) -> float:
    """A sum kept by adding and subtracting, rid of floating-point dust (-1e-13 -> 0)."""
    return round(value, 6) + 0.0
