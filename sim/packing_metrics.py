"""Scenario metrics read from a simulator run: MIG stranding and occupancy, NVLink quality, node cost.

Everything here reads the inventory arrays and placements; nothing changes them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpupack.scoring.cost import placement_gpus
from gpupack.scoring.engine import Decision
from gpupack.scoring.facts import MigMode, NodeFacts, Placement
from gpupack.scoring.geometry import (
    MAX_FIT,
    PLACEMENT_SHAPE,
    PLACEMENT_START,
    SHAPE_COMPUTE,
    SHAPE_SIZE,
    MigFamily,
    resolve_profile,
)
from gpupack.scoring.inventory import MAX_GPUS, Inventory
from gpupack.scoring.request import MILLI_PER_GPU, Kind
from gpupack.sim.workload import TracePod


def pct(part: float, whole: float) -> float:
    """100 * part / whole, rounded to 2 decimals (0 when whole is 0)."""
    return round(100.0 * part / whole, 2) if whole else 0.0


# ----------------------------------------------------------------------------- MIG
@dataclass(frozen=True)
class GpuState:
    """One GPU's state as the inventory holds it."""

    mode: MigMode
    compute_total: int
    milli_free: int
    whole: bool
    slices: int  # dynamic: occupied memory-slice mask
    compute: int  # dynamic: compute slices in use
    static: int  # static: placement-id mask of the instances that exist
    static_used: int  # static: placement-id mask of the instances in use

    @property
    def plain_free(self) -> bool:
        """Untouched: a whole-GPU request (or any profile on a dynamic GPU) fits."""
        return (
            not self.whole
            and self.milli_free == MILLI_PER_GPU
            and not self.slices
            and not self.compute
            and not self.static
        )

    def free_compute(self) -> int:
        """Compute slices (shares: thousandths) still free on this GPU."""
        if self.static:
            return sum(int(SHAPE_COMPUTE[PLACEMENT_SHAPE[p]]) for p in _bits(self.static & ~self.static_used))
        if self.whole:
            return 0
        if self.mode == MigMode.DYNAMIC:
            return self.compute_total - self.compute
        return self.milli_free

    def fits_shape(self, shape: int) -> bool:
        """One more instance of MIG shape `shape` fits here."""
        if self.mode == MigMode.STATIC:
            return any(int(PLACEMENT_SHAPE[p]) == shape for p in _bits(self.static & ~self.static_used))
        if self.mode != MigMode.DYNAMIC or self.whole or self.milli_free != MILLI_PER_GPU:
            return False
        return self.compute + int(SHAPE_COMPUTE[shape]) <= self.compute_total and MAX_FIT[shape, self.slices] > 0


def _bits(mask: int) -> Iterable[int]:
    return (i for i in range(32) if mask >> i & 1)


def gpu_states(inventory: Inventory) -> Iterable[tuple[int, int, GpuState]]:
    """(node row, GPU index, state) of every GPU on an active node."""
    for row in range(inventory.size):
        if not inventory.node_active[row]:
            continue
        model = inventory.models[int(inventory.node_model[row])]
        mode = MigMode(int(inventory.node_mig_mode[row]))
        for j in range(int(inventory.node_gpu_count[row])):
            g = row * MAX_GPUS + j
            yield (
                row,
                j,
                GpuState(
                    mode,
                    model.mig_family.compute_total if model.mig_family else 7,
                    int(inventory.gpu_milli_free[g]),
                    bool(inventory.gpu_whole[g]),
                    int(inventory.gpu_slices[g]),
                    int(inventory.gpu_compute[g]),
                    int(inventory.gpu_static[g]),
                    int(inventory.gpu_static_used[g]),
                ),
            )


def failed_profiles(failed_by_kind: Mapping[str, int]) -> dict[str, int]:
    """Failed pods by what they asked for: a MIG profile, `N GPU` for whole GPUs, `cpu only`."""
    out: dict[str, int] = {}
    for kind, count in sorted(failed_by_kind.items()):
        if kind.startswith("mig-"):
            label = kind.removeprefix("mig-")
        elif kind.startswith("gpu-"):
            label = f"{kind.removeprefix('gpu-')} GPU"
        else:
            label = "cpu only" if kind == "none" else kind
        out[label] = out.get(label, 0) + count
    return out


@dataclass(frozen=True)
class Stranding:
    """GPUs with free compute at the end of a run, and those on which no pending profile fits."""

    gpus: int
    with_free: int
    stranded: int

    def to_json(self) -> dict[str, float]:
        return {
            "gpus": self.gpus,
            "with_free_slices": self.with_free,
            "stranded": self.stranded,
            "stranded_pct": pct(self.stranded, self.gpus),
        }


def stranded_gpus(inventory: Inventory, failed_by_kind: Mapping[str, int]) -> Stranding:
    """Count the GPUs with free compute on which none of the failed requests' shapes fits.

    A failed MIG profile fits a GPU when one more instance of it does (static: a free instance of that
    shape; dynamic: free memory slices at an allowed start and enough compute slices); a failed
    whole-GPU request fits an untouched GPU.
    """
    profiles = [k.removeprefix("mig-") for k in failed_by_kind if k.startswith("mig-")]
    whole_pending = any(k.startswith("gpu-") for k in failed_by_kind)
    gpus = with_free = stranded = 0
    for row, _, state in gpu_states(inventory):
        gpus += 1
        if state.free_compute() <= 0:
            continue
        with_free += 1
        family = inventory.models[int(inventory.node_model[row])].mig_family
        shapes = [_shape(family, profile) for profile in profiles]
        fits = (whole_pending and state.plain_free) or any(s is not None and state.fits_shape(s) for s in shapes)
        if not fits:
            stranded += 1
    return Stranding(gpus, with_free, stranded)


def _shape(family: MigFamily | None, profile: str) -> int | None:
    if family is None:
        return None
    try:
        return resolve_profile(family, profile)[0]
    except KeyError:
        return None


FREE = "free"
WHOLE = "whole GPU"
IDLE = "unused static instance"
NOT_A_SLICE = ""


def occupancy_grid(inventory: Inventory, placements: Iterable[Placement], sample: int) -> list[list[str]]:
    """Memory-slice occupancy of up to `sample` partitioned 8-slice GPUs, evenly spread over all of them.

    Partitioned: holding MIG instances, but not one instance that takes the whole GPU (whole GPUs and
    7g instances say nothing about packing). On static nodes every used GPU counts.
    Each row is one GPU, 8 cells (slice 0..7) labelled with the profile using it, `whole GPU`,
    `unused static instance`, or `free`.
    """
    used: dict[tuple[int, int], list[str]] = {}
    for placement in placements:
        row = inventory.index[placement.node]
        for slot in placement.slots:
            cells = used.setdefault((row, slot.index), [FREE] * 8)
            if slot.mig:
                family = inventory.models[int(inventory.node_model[row])].mig_family
                assert family is not None  # a MIG slot was placed on this model
                size = int(SHAPE_SIZE[resolve_profile(family, slot.mig)[0]])
                cells[slot.start : slot.start + size] = [slot.mig] * size
            else:
                cells[:] = [WHOLE] * 8
    keys = sorted(
        k
        for k, cells in used.items()
        if int(inventory.model_slices[int(inventory.node_model[k[0]])]) == 8
        and (int(inventory.gpu_static[k[0] * MAX_GPUS + k[1]]) or len(set(cells)) > 1)
    )
    if len(keys) > sample:
        keys = [keys[round(i * (len(keys) - 1) / (sample - 1))] for i in range(sample)] if sample > 1 else keys[:1]
    grid = []
    for row, j in keys:
        cells = used[row, j]
        g = row * MAX_GPUS + j
        free_static = int(inventory.gpu_static[g]) & ~int(inventory.gpu_static_used[g])
        for pid in _bits(free_static):
            start, size = int(PLACEMENT_START[pid]), int(SHAPE_SIZE[PLACEMENT_SHAPE[pid]])
            cells[start : start + size] = [IDLE] * size
        grid.append(cells)
    return grid


# ----------------------------------------------------------------------------- NVLink
def pair_score(facts: NodeFacts, a: int, b: int) -> int:
    """go-gpuallocator's pair affinity, as scoring.kernels.pair_score: 100 per NVLink + 20 same NUMA / 10 across."""
    links = facts.nvlink[a][b] if facts.nvlink is not None else 0
    numa = facts.numa or (0,) * facts.gpu_count
    return 100 * links + (20 if numa[a] == numa[b] else 10)


def set_score(facts: NodeFacts, gpus: Iterable[int]) -> int:
    """Sum of pair scores over every pair of `gpus`."""
    return sum(pair_score(facts, a, b) for a, b in itertools.combinations(sorted(gpus), 2))


def free_whole_gpus(inventory: Inventory, row: int) -> list[int]:
    """Local indices of the node's untouched GPUs."""
    base = row * MAX_GPUS
    return [
        j
        for j in range(int(inventory.node_gpu_count[row]))
        if not inventory.gpu_whole[base + j]
        and inventory.gpu_milli_free[base + j] == MILLI_PER_GPU
        and not inventory.gpu_slices[base + j]
        and not inventory.gpu_compute[base + j]
        and not inventory.gpu_static[base + j]
    ]


class LinkTracker:
    """`run_once`'s `on_decision` hook: NVLink quality of every placed multi-GPU pod.

    For each pod: are all its GPUs pairwise NVLinked, and its set's pair score relative to the best
    set of the same size that was free on that node just before the commit.
    """

    def __init__(self) -> None:
        self.pods = 0
        self.all_linked = 0
        self.ratio_sum = 0.0

    def __call__(self, pod: TracePod, decision: Decision, inventory: Inventory) -> None:
        placement = decision.placement
        request = pod.request
        if placement is None or request.kind != Kind.WHOLE or request.gpus < 2:
            return
        row = inventory.index[placement.node]
        facts = inventory.facts[row]
        assert facts is not None
        chosen = [slot.index for slot in placement.slots]
        free = free_whole_gpus(inventory, row)
        best = max(set_score(facts, subset) for subset in itertools.combinations(free, request.gpus))
        self.pods += 1
        self.ratio_sum += set_score(facts, chosen) / best if best else 1.0
        links = facts.nvlink
        if links is not None and all(links[a][b] > 0 for a, b in itertools.combinations(chosen, 2)):
            self.all_linked += 1

    def to_json(self) -> dict[str, float]:
        return {
            "multi_gpu_pods": self.pods,
            "all_nvlinked_pct": pct(self.all_linked, self.pods),
            "mean_link_score_vs_best_pct": round(100.0 * self.ratio_sum / self.pods, 2) if self.pods else 0.0,
        }


# ----------------------------------------------------------------------------- cost
def cost_metrics(
    inventory: Inventory, placements: Mapping[str, Placement], pods: Mapping[str, TracePod]
) -> dict[str, float]:
    """Hourly cost of the nodes holding a pod, and where interruptible and other pods went.

    `placements` and `pods` are keyed by pod name.
    """
    busy_cost = total_cost = 0.0
    busy = 0
    for row, facts in enumerate(inventory.facts):
        if facts is None:
            continue
        price = facts.hourly_cost or 0.0
        total_cost += price
        if not inventory.node_is_empty(row):
            busy += 1
            busy_cost += price
    firm = firm_on_spot = 0
    flexible_gpus = flexible_gpus_on_spot = 0.0
    for name, placement in placements.items():
        facts = inventory.facts[inventory.index[placement.node]]
        assert facts is not None
        if pods[name].request.interruptible:
            gpus = placement_gpus(inventory, placement)
            flexible_gpus += gpus
            flexible_gpus_on_spot += gpus if facts.spot else 0.0
        else:
            firm += 1
            firm_on_spot += int(facts.spot)
    return {
        "busy_nodes": busy,
        "busy_node_cost_per_hour": round(busy_cost, 2),
        "cluster_cost_per_hour": round(total_cost, 2),
        "busy_cost_pct": pct(busy_cost, total_cost),
        "non_interruptible_pods_on_spot_pct": pct(firm_on_spot, firm),
        "interruptible_gpu_demand_on_spot_pct": pct(flexible_gpus_on_spot, flexible_gpus),
    }
