"""Static MIG layouts: where a node's existing MIG instances sit, read or inferred.

The annotation's contract: docs/contracts.md#gpupackiomig-layout.

A layout maps a GPU index to its instances as `(profile, start)` pairs. It is either given by the
`gpupack.io/mig-layout` annotation (`{"0": ["4g.40gb@0", "3g.40gb@4"]}`; media-extension profiles as
nvidia-smi writes them, `1g.10gb+me`, or as resource names do, `1g.10gb.me`) and checked against the MIG
geometry, or synthesized from the instance counts allocatable advertises: largest profile first, each
instance on the lowest-indexed GPU that can hold it, at its first free start.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpupack.errors import GpupackError
from gpupack.scoring.geometry import SHAPES, MigFamily, canonical_profile, resolve_profile, slice_bits
from gpupack.scoring.request import MAX_GPUS_PER_NODE

Layout = dict[int, tuple[tuple[str, int], ...]]

_INSTANCE = re.compile(r"(?P<profile>[^@\s]+)@(?P<start>[0-9])")
_GPU_INDEX = re.compile(r"0|[1-9][0-9]?")


class MigLayoutError(GpupackError, ValueError):
    """A MIG layout that does not fit the GPU family's geometry or is not well formed."""


@dataclass(eq=False)
class _GpuPlan:
    """The instances on one GPU, with the memory slices and compute slices they occupy."""

    family: MigFamily
    instances: list[tuple[str, int]] = field(default_factory=list)
    slices: int = 0
    compute: int = 0
    has_me: bool = False

    def conflict(self, profile: str, start: int) -> str | None:
        """Why `profile@start` cannot be added to this GPU, or None when it can."""
        shape_id, is_me = _resolve(self.family, profile)
        shape = SHAPES[shape_id]
        if start not in shape.starts:
            starts = ",".join(map(str, shape.starts))
            return f"{profile} cannot start at slice {start} (allowed starts: {starts})"
        if self.slices & slice_bits(shape.size, start):
            return f"{profile}@{start} overlaps another instance"
        if self.compute + shape.compute > self.family.compute_total:
            return f"{profile}@{start} exceeds the GPU's {self.family.compute_total} compute slices"
        if is_me and self.has_me:
            return f"{profile}@{start}: only one +me instance fits on a GPU"
        return None

    def add(self, profile: str, start: int) -> None:
        """Record `profile@start` (callers check `conflict` first)."""
        shape_id, is_me = _resolve(self.family, profile)
        shape = SHAPES[shape_id]
        self.instances.append((profile, start))
        self.slices |= slice_bits(shape.size, start)
        self.compute += shape.compute
        self.has_me |= is_me


def _resolve(family: MigFamily, profile: str) -> tuple[int, bool]:
    try:
        return resolve_profile(family, profile)
    except KeyError:
        known = ", ".join(sorted(family.profiles))
        raise MigLayoutError(f"MIG profile {profile!r} does not exist on {family.name} ({known})") from None


def profile_size(family: MigFamily, profile: str) -> tuple[int, int]:
    """(memory slices, compute slices) of one instance of `profile`; MigLayoutError if unknown."""
    shape = SHAPES[_resolve(family, profile)[0]]
    return shape.size, shape.compute


def parse_layout(data: object, family: MigFamily, gpu_count: int | None) -> Layout:
    """Check a decoded `gpupack.io/mig-layout` value against the geometry of `family`.

    `gpu_count` bounds the GPU indices (None: MAX_GPUS_PER_NODE). Raises MigLayoutError.
    """
    if not isinstance(data, dict):
        raise MigLayoutError('must be a JSON object of GPU index -> ["profile@start", ...]')
    limit = MAX_GPUS_PER_NODE if gpu_count is None else gpu_count
    layout: Layout = {}
    for key, entries in data.items():
        if not isinstance(key, str) or not _GPU_INDEX.fullmatch(key):
            raise MigLayoutError(f"GPU index {key!r} is not a non-negative integer")
        index = int(key)
        if index >= limit:
            raise MigLayoutError(f"GPU index {index} does not exist on a node with {limit} GPUs")
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise MigLayoutError(f'GPU {index}: expected a list of "profile@start" strings')
        plan = _GpuPlan(family)
        for entry in entries:
            match = _INSTANCE.fullmatch(entry)
            if match is None:
                raise MigLayoutError(f'GPU {index}: {entry!r} is not "profile@start"')
            profile, start = canonical_profile(match["profile"]), int(match["start"])
            reason = plan.conflict(profile, start)
            if reason:
                raise MigLayoutError(f"GPU {index}: {reason}")
            plan.add(profile, start)
        if plan.instances:
            layout[index] = tuple(plan.instances)
    return layout


def synthesize_layout(family: MigFamily, counts: Mapping[str, int], gpu_count: int | None) -> Layout:
    """Place `counts` (profile -> instances) on GPUs 0, 1, ...: largest profile first, first fit.

    At most `gpu_count` GPUs are used (None: as many as needed, up to MAX_GPUS_PER_NODE).
    Raises MigLayoutError when the instances cannot all be placed.
    """
    limit = MAX_GPUS_PER_NODE if gpu_count is None else gpu_count
    order = sorted(counts, key=lambda p: (*profile_size(family, p), p), reverse=True)
    plans: list[_GpuPlan] = []
    for profile in order:
        for _ in range(counts[profile]):
            if not _place_first_fit(plans, family, profile, limit):
                raise MigLayoutError(
                    f"{counts[profile]} x {profile} (with the other instances) do not fit on {limit} GPUs"
                )
    return {i: tuple(plan.instances) for i, plan in enumerate(plans) if plan.instances}


def _place_first_fit(plans: list[_GpuPlan], family: MigFamily, profile: str, limit: int) -> bool:
    starts = SHAPES[_resolve(family, profile)[0]].starts
    candidates = plans if len(plans) >= limit else [*plans, _GpuPlan(family)]
    for i, plan in enumerate(candidates):
        for start in starts:
            if plan.conflict(profile, start) is None:
                plan.add(profile, start)
                if i == len(plans):
                    plans.append(plan)
                return True
    return False


def instance_counts(layout: Layout) -> Counter[str]:
    """How many instances of each profile a layout holds."""
    return Counter(profile for instances in layout.values() for profile, _ in instances)
