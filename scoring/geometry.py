"""MIG geometry: which GPU instance profiles exist on which GPU product, and where they may sit.

A MIG-capable GPU has 8 memory slices and 7 compute slices (A30: 4 and 4). A GPU instance of a
profile occupies `size` consecutive memory slices starting at one of the profile's allowed `starts`
(NVIDIA's `nvidia-smi mig -lgipp` notation `{starts}:size`). Profiles of different products with the
same placement rules share one *shape*, so kernels only ever see small integer shape ids, placement
ids and 8-bit occupancy masks.

Everything here is computed once at import: for every shape and every occupancy mask, the set of
free starts and the largest number of instances of that shape that still fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Shape:
    """Placement rule shared by equivalent profiles of different products."""

    name: str
    slices: int  # memory slices of the whole GPU (8, or 4 on A30)
    compute_total: int  # compute slices of the whole GPU (7, or 4 on A30)
    size: int  # memory slices one instance occupies
    compute: int  # compute slices one instance uses
    starts: tuple[int, ...]


SHAPES: tuple[Shape, ...] = (
    Shape("1g", 8, 7, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    Shape("1g-2x", 8, 7, 2, 1, (0, 2, 4, 6)),
    Shape("2g", 8, 7, 2, 2, (0, 2, 4)),
    Shape("3g", 8, 7, 4, 3, (0, 4)),
    Shape("4g", 8, 7, 4, 4, (0,)),
    Shape("7g", 8, 7, 8, 7, (0,)),
    Shape("a30-1g", 4, 4, 1, 1, (0, 1, 2, 3)),
    Shape("a30-2g", 4, 4, 2, 2, (0, 2)),
    Shape("a30-4g", 4, 4, 4, 4, (0,)),
)
SHAPE_ID: dict[str, int] = {shape.name: i for i, shape in enumerate(SHAPES)}
N_SHAPES = len(SHAPES)
N_MASKS = 256  # every occupancy mask of up to 8 memory slices


@dataclass(frozen=True)
class MigFamily:
    """The MIG profiles of one product family, by NVIDIA's profile name (without `+me`)."""

    name: str
    slices: int
    compute_total: int
    profiles: dict[str, int]  # profile name -> shape id
    # The profile that takes the whole GPU; its name is what a non-MIG request of one GPU equals.
    full_profile: str


def _family(name: str, mem: tuple[str, str, str, str, str, str]) -> MigFamily:
    one, one_2x, two, three, four, seven = mem
    return MigFamily(
        name,
        8,
        7,
        {
            f"1g.{one}": SHAPE_ID["1g"],
            f"1g.{one_2x}": SHAPE_ID["1g-2x"],
            f"2g.{two}": SHAPE_ID["2g"],
            f"3g.{three}": SHAPE_ID["3g"],
            f"4g.{four}": SHAPE_ID["4g"],
            f"7g.{seven}": SHAPE_ID["7g"],
        },
        f"7g.{seven}",
    )


FAMILIES: dict[str, MigFamily] = {
    f.name: f
    for f in (
        _family("A100-40GB", ("5gb", "10gb", "10gb", "20gb", "20gb", "40gb")),
        _family("A100-80GB", ("10gb", "20gb", "20gb", "40gb", "40gb", "80gb")),
        _family("H100-80GB", ("10gb", "20gb", "20gb", "40gb", "40gb", "80gb")),
        _family("H100-94GB", ("12gb", "24gb", "24gb", "47gb", "47gb", "94gb")),
        _family("H200-141GB", ("18gb", "35gb", "35gb", "71gb", "71gb", "141gb")),
        MigFamily(
            "A30-24GB",
            4,
            4,
            {"1g.6gb": SHAPE_ID["a30-1g"], "2g.12gb": SHAPE_ID["a30-2g"], "4g.24gb": SHAPE_ID["a30-4g"]},
            "4g.24gb",
        ),
    )
}


ME_SUFFIX = "+me"  # nvidia-smi's spelling of a media-extensions profile: annotations and internal names
ME_RESOURCE_SUFFIX = ".me"  # the Kubernetes resource name's spelling (`+` is not allowed there)


def canonical_profile(profile: str) -> str:
    """The profile in nvidia-smi's spelling: `1g.10gb.me` and `1g.10gb+me` both give `1g.10gb+me`."""
    if profile.endswith(ME_RESOURCE_SUFFIX):
        return profile.removesuffix(ME_RESOURCE_SUFFIX) + ME_SUFFIX
    return profile


def resource_profile(profile: str) -> str:
    """The profile as `nvidia.com/mig-<profile>` spells it: `1g.10gb+me` gives `1g.10gb.me`."""
    if profile.endswith(ME_SUFFIX):
        return profile.removesuffix(ME_SUFFIX) + ME_RESOURCE_SUFFIX
    return profile


def resolve_profile(family: MigFamily, profile: str) -> tuple[int, bool]:
    """Shape id of `profile` on `family` and whether it is a media-extensions (`+me`/`.me`) variant.

    Raises KeyError when the family has no such profile.
    """
    base, plus, suffix = canonical_profile(profile).partition("+")
    if plus and suffix != "me":
        raise KeyError(profile)
    return family.profiles[base], bool(plus)


# --- placements: every (shape, start) pair gets a global id, so a GPU's static MIG layout and the
# --- static instances in use are bitmasks over placement ids.
PLACEMENT_SHAPE: np.ndarray
PLACEMENT_START: np.ndarray
_pl_shape: list[int] = []
_pl_start: list[int] = []
PLACEMENT_ID: dict[tuple[int, int], int] = {}
for _sid, _shape in enumerate(SHAPES):
    for _start in _shape.starts:
        PLACEMENT_ID[(_sid, _start)] = len(_pl_shape)
        _pl_shape.append(_sid)
        _pl_start.append(_start)
PLACEMENT_SHAPE = np.array(_pl_shape, dtype=np.int8)
PLACEMENT_START = np.array(_pl_start, dtype=np.int8)
N_PLACEMENTS = len(_pl_shape)
assert N_PLACEMENTS <= 32, "placement bitmasks are int32"

SHAPE_SIZE = np.array([s.size for s in SHAPES], dtype=np.int8)
SHAPE_COMPUTE = np.array([s.compute for s in SHAPES], dtype=np.int8)
SHAPE_COMPUTE_TOTAL = np.array([s.compute_total for s in SHAPES], dtype=np.int8)
SHAPE_SLICES = np.array([s.slices for s in SHAPES], dtype=np.int8)


def slice_bits(size: int, start: int) -> int:
    """Occupancy mask of an instance of `size` slices starting at `start`."""
    return ((1 << size) - 1) << start


def _free_starts(shape: Shape, mask: int) -> int:
    bits = 0
    for start in shape.starts:
        if mask & slice_bits(shape.size, start) == 0:
            bits |= 1 << start
    return bits


def _max_fit(shape: Shape, mask: int) -> int:
    """Most instances of `shape` that fit in the free slices of `mask` (memory geometry only)."""
    # Greedy from the highest start is optimal here: every shape's starts are multiples of its
    # size (aligned buddy placements), so picking the highest free aligned slot never blocks two.
    best = 0
    for start in reversed(shape.starts):
        bits = slice_bits(shape.size, start)
        if mask & bits == 0:
            mask |= bits
            best += 1
    return best


def _build_tables() -> tuple[np.ndarray, np.ndarray]:
    free = np.zeros((N_SHAPES, N_MASKS), dtype=np.int16)
    fit = np.zeros((N_SHAPES, N_MASKS), dtype=np.int8)
    for sid, shape in enumerate(SHAPES):
        valid = (1 << shape.slices) - 1
        for mask in range(N_MASKS):
            if mask & ~valid:
                continue  # masks with bits beyond the GPU's slices never occur
            free[sid, mask] = _free_starts(shape, mask)
            fit[sid, mask] = _max_fit(shape, mask)
    return free, fit


# FREE_STARTS[shape, mask]: bitmask of the starts where one more instance fits.
# MAX_FIT[shape, mask]: most instances of the shape that still fit (memory slices only).
FREE_STARTS, MAX_FIT = _build_tables()
