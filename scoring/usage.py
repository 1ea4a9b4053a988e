"""Cluster-wide usage read-outs (GPUs allocated, free MIG slices) that cost O(changed nodes).

A `/metrics` scrape holds the state lock while it reads the inventory, so recomputing every GPU of a
5,000-node cluster on each scrape stalled filter calls (#13). `UsageTotals` keeps each node's sums and
recomputes only the nodes whose `node_version` moved since the last read; a read is then a sum over
one small array per figure.
"""

from __future__ import annotations

import numpy as np

from gpupack.scoring.facts import MigMode
from gpupack.scoring.geometry import PLACEMENT_SHAPE, SHAPE_COMPUTE, SHAPE_SIZE
from gpupack.scoring.inventory import MAX_GPUS, Inventory
from gpupack.scoring.request import MILLI_PER_GPU

_POPCOUNT8 = np.array([bin(mask).count("1") for mask in range(256)], dtype=np.int64)
_PLACEMENTS = range(len(PLACEMENT_SHAPE))


class UsageTotals:
    """Per-node GPU usage sums of one inventory, kept up to date lazily by node version."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self._version = np.zeros(0, dtype=np.int64)
        self._allocated = np.zeros(0, dtype=np.float64)
        self._free_mig = np.zeros(0, dtype=np.int64)

    def gpus_allocated(self) -> float:
        """GPUs in use, in whole-GPU units: shares count their fraction, MIG its compute slices."""
        active = self._refresh()
        return float(self._allocated[: len(active)][active].sum())

    def free_mig_slices(self) -> int:
        """Free MIG memory slices: untouched slices of free dynamic-MIG GPUs plus unused static instances."""
        active = self._refresh()
        return int(self._free_mig[: len(active)][active].sum())

    def _refresh(self) -> np.ndarray:
        """Recompute the sums of the nodes changed since the last call; the active-row mask."""
        inv = self.inventory
        n = inv.size
        if len(self._version) < n:
            grown = max(n, 2 * len(self._version))
            self._version = np.concatenate([self._version, np.full(grown - len(self._version), -1)])
            self._allocated = np.resize(self._allocated, grown)
            self._free_mig = np.resize(self._free_mig, grown)
        stale = np.flatnonzero(self._version[:n] != inv.node_version[:n])
        if stale.size:
            self._allocated[stale], self._free_mig[stale] = node_usage(inv, stale)
            self._version[stale] = inv.node_version[stale]
        return inv.node_active[:n]


def node_usage(inv: Inventory, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(GPUs allocated, free MIG slices) of each node in `rows`, from its GPU arrays."""
    gpu = rows[:, None] * MAX_GPUS + np.arange(MAX_GPUS)[None, :]
    present = np.arange(MAX_GPUS)[None, :] < inv.node_gpu_count[rows][:, None]
    model = inv.node_model[rows][:, None]
    mode = inv.node_mig_mode[rows][:, None]
    compute_total = np.where(inv.model_slices[model] == 4, 4, 7)
    whole, milli = inv.gpu_whole[gpu], inv.gpu_milli_free[gpu]
    static_idle = inv.gpu_static[gpu] & ~inv.gpu_static_used[gpu]
    static_compute = np.zeros(gpu.shape, dtype=np.float64)
    idle_slices = np.zeros(gpu.shape, dtype=np.int64)
    for pid in _PLACEMENTS:
        static_compute += ((inv.gpu_static_used[gpu] >> pid) & 1) * int(SHAPE_COMPUTE[PLACEMENT_SHAPE[pid]])
        idle_slices += ((static_idle >> pid) & 1) * int(SHAPE_SIZE[PLACEMENT_SHAPE[pid]])
    used = np.where(whole, 1.0, (MILLI_PER_GPU - milli) / MILLI_PER_GPU)
    used += (inv.gpu_compute[gpu] + static_compute) / compute_total
    untouched = (mode == MigMode.DYNAMIC) & ~whole & (milli == MILLI_PER_GPU)
    dynamic_free = (inv.model_slices[model] - _POPCOUNT8[inv.gpu_slices[gpu] & 0xFF]) * untouched
    free_mig = np.where(mode == MigMode.STATIC, idle_slices, dynamic_free)
    return (used * present).sum(axis=1), (free_mig * present).sum(axis=1)
