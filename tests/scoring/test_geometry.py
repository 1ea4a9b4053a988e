"""MIG geometry pinned to docs/contracts.md#mig-geometry and to real `nvidia-smi mig -lgipp` output."""

from __future__ import annotations

import itertools
import re

import pytest

from gpupack.scoring.geometry import (
    FAMILIES,
    FREE_STARTS,
    MAX_FIT,
    N_PLACEMENTS,
    PLACEMENT_ID,
    PLACEMENT_SHAPE,
    PLACEMENT_START,
    SHAPE_ID,
    SHAPES,
    resolve_profile,
    slice_bits,
)
from gpupack.scoring.gpu_models import lookup_model
from tests.conftest import DATA

# docs/contracts.md#mig-geometry: profile -> (starts, memory slices, compute slices), per family
EIGHTY = {
    "1g.10gb": ((0, 1, 2, 3, 4, 5, 6), 1, 1),
    "1g.20gb": ((0, 2, 4, 6), 2, 1),
    "2g.20gb": ((0, 2, 4), 2, 2),
    "3g.40gb": ((0, 4), 4, 3),
    "4g.40gb": ((0,), 4, 4),
    "7g.80gb": ((0,), 8, 7),
}
FORTY = {
    "1g.5gb": ((0, 1, 2, 3, 4, 5, 6), 1, 1),
    "1g.10gb": ((0, 2, 4, 6), 2, 1),  # the size-2 profile on A100-40GB, not the 80 GB 1g.10gb
    "2g.10gb": ((0, 2, 4), 2, 2),
    "3g.20gb": ((0, 4), 4, 3),
    "4g.20gb": ((0,), 4, 4),
    "7g.40gb": ((0,), 8, 7),
}
H200 = {
    "1g.18gb": ((0, 1, 2, 3, 4, 5, 6), 1, 1),
    "1g.35gb": ((0, 2, 4, 6), 2, 1),
    "2g.35gb": ((0, 2, 4), 2, 2),
    "3g.71gb": ((0, 4), 4, 3),
    "4g.71gb": ((0,), 4, 4),
    "7g.141gb": ((0,), 8, 7),
}
A30 = {
    "1g.6gb": ((0, 1, 2, 3), 1, 1),
    "2g.12gb": ((0, 2), 2, 2),
    "4g.24gb": ((0,), 4, 4),
}
TABLES = {
    "A100-80GB": EIGHTY,
    "H100-80GB": EIGHTY,
    "A100-40GB": FORTY,
    "H200-141GB": H200,
    "A30-24GB": A30,
}


def _geometry(family: str, profile: str) -> tuple[tuple[int, ...], int, int]:
    shape = SHAPES[resolve_profile(FAMILIES[family], profile)[0]]
    return shape.starts, shape.size, shape.compute


@pytest.mark.parametrize("family", sorted(TABLES))
def test_family_matches_design_table(family: str) -> None:
    table = TABLES[family]
    assert set(FAMILIES[family].profiles) == set(table)
    for profile, expected in table.items():
        assert _geometry(family, profile) == expected, profile


def test_whole_gpu_sizes() -> None:
    for name in ("A100-80GB", "H100-80GB", "A100-40GB", "H200-141GB"):
        assert (FAMILIES[name].slices, FAMILIES[name].compute_total) == (8, 7)
    assert (FAMILIES["A30-24GB"].slices, FAMILIES["A30-24GB"].compute_total) == (4, 4)
    assert FAMILIES["H200-141GB"].full_profile == "7g.141gb"
    assert FAMILIES["A30-24GB"].full_profile == "4g.24gb"
    for shape in SHAPES:  # every instance fits inside its GPU at every allowed start
        assert all(start + shape.size <= shape.slices for start in shape.starts)


def test_a100_40gb_1g10gb_is_the_double_memory_1g() -> None:
    assert resolve_profile(FAMILIES["A100-40GB"], "1g.10gb")[0] == SHAPE_ID["1g-2x"]
    assert resolve_profile(FAMILIES["A100-80GB"], "1g.10gb")[0] == SHAPE_ID["1g"]


def _parse_lgipp(text: str) -> dict[str, tuple[tuple[int, ...], int]]:
    """profile name -> (starts, size) from `nvidia-smi mig -lgip` + `-lgipp` output."""
    ids: dict[int, str] = {}
    for match in re.finditer(r"^\|\s+\d+\s+MIG\s+(\S+)\s+(\d+)\s", text, re.MULTILINE):
        ids[int(match.group(2))] = match.group(1)
    placements: dict[str, tuple[tuple[int, ...], int]] = {}
    pattern = r"Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,]+)\}:(\d+)"
    for match in re.finditer(pattern, text):
        starts = tuple(int(s) for s in match.group(2).split(","))
        placements[ids[int(match.group(1))]] = (starts, int(match.group(3)))
    return placements


def test_h200_rows_equal_real_nvidia_smi_output() -> None:
    real = _parse_lgipp((DATA / "h200-mig-profiles.txt").read_text())  # `nvidia-smi mig -lgip`, `-lgipp`
    assert set(real) == {*H200, "1g.18gb+me"}  # the parser found every profile
    family = FAMILIES["H200-141GB"]
    assert lookup_model("NVIDIA-H200").mig_family is family
    for profile, (starts, size) in real.items():
        shape = SHAPES[resolve_profile(family, profile)[0]]
        assert (shape.starts, shape.size) == (starts, size), profile


def test_plus_me_follows_its_base_profile() -> None:
    for family in FAMILIES.values():
        for profile, shape in family.profiles.items():
            assert resolve_profile(family, profile) == (shape, False)
            assert resolve_profile(family, profile + "+me") == (shape, True)
    h100 = FAMILIES["H100-80GB"]
    for bad in ("1g.10gb+gfx", "1g.10gb+", "9g.90gb+me", "1g.18gb+me"):
        with pytest.raises(KeyError):
            resolve_profile(h100, bad)


def test_unknown_product_is_not_mig() -> None:
    model = lookup_model("ACME-Accelerator-X1")
    assert model.mig_family is None and model.memory_mib == 0
    assert lookup_model("NVIDIA-L4").mig_family is None
    assert lookup_model("NVIDIA-A30").mig_family is FAMILIES["A30-24GB"]


def test_placement_ids_cover_every_shape_start() -> None:
    expected = {(sid, start) for sid, shape in enumerate(SHAPES) for start in shape.starts}
    assert set(PLACEMENT_ID) == expected
    assert N_PLACEMENTS == len(expected) <= 32
    for (sid, start), pid in PLACEMENT_ID.items():
        assert (PLACEMENT_SHAPE[pid], PLACEMENT_START[pid]) == (sid, start)


def _bits(*starts: int) -> int:
    return sum(1 << s for s in starts)


def test_free_starts_and_max_fit_spot_checks() -> None:
    one, one2, two, three, four, seven = (SHAPE_ID[n] for n in ("1g", "1g-2x", "2g", "3g", "4g", "7g"))
    a1, a2, a4 = (SHAPE_ID[n] for n in ("a30-1g", "a30-2g", "a30-4g"))
    # empty GPU
    assert FREE_STARTS[one, 0] == _bits(0, 1, 2, 3, 4, 5, 6) and MAX_FIT[one, 0] == 7
    assert FREE_STARTS[one2, 0] == _bits(0, 2, 4, 6) and MAX_FIT[one2, 0] == 4
    assert FREE_STARTS[two, 0] == _bits(0, 2, 4) and MAX_FIT[two, 0] == 3
    assert FREE_STARTS[three, 0] == _bits(0, 4) and MAX_FIT[three, 0] == 2
    assert FREE_STARTS[four, 0] == _bits(0) and MAX_FIT[four, 0] == 1
    assert FREE_STARTS[seven, 0] == _bits(0) and MAX_FIT[seven, 0] == 1
    # slice 0 taken: no 4g/7g, one 3g at 4
    assert FREE_STARTS[four, 0b1] == 0 and MAX_FIT[seven, 0b1] == 0
    assert FREE_STARTS[three, 0b1] == _bits(4) and MAX_FIT[three, 0b1] == 1
    # three 1g at 4, 5, 6: a 4g still fits at 0
    assert FREE_STARTS[four, 0b0111_0000] == _bits(0) and MAX_FIT[four, 0b0111_0000] == 1
    # a 2g at 4: 4g at 0 still fits, 3g only at 0
    assert FREE_STARTS[four, 0b0011_0000] == _bits(0) and FREE_STARTS[three, 0b0011_0000] == _bits(0)
    # slice 7 is no 1g start, but blocks the 1g-2x at 6
    assert MAX_FIT[one, 0b1000_0000] == 7 and MAX_FIT[one2, 0b1000_0000] == 3
    # full GPU
    assert all(MAX_FIT[s, 0xFF] == 0 and FREE_STARTS[s, 0xFF] == 0 for s in range(len(SHAPES)))
    # A30: 4 slices
    assert FREE_STARTS[a1, 0] == _bits(0, 1, 2, 3) and MAX_FIT[a1, 0] == 4
    assert FREE_STARTS[a2, 0b0001] == _bits(2) and MAX_FIT[a2, 0b0001] == 1
    assert MAX_FIT[a4, 0b1000] == 0 and MAX_FIT[a4, 0] == 1
    assert MAX_FIT[a1, 0b1_0000] == 0  # masks beyond the A30's 4 slices never occur


def test_tables_match_their_definition_for_every_mask() -> None:
    for sid, shape in enumerate(SHAPES):
        for mask in range(1 << shape.slices):
            free = [s for s in shape.starts if mask & slice_bits(shape.size, s) == 0]
            assert FREE_STARTS[sid, mask] == _bits(*free)
            best = 0  # exhaustive: the largest set of pairwise disjoint free placements
            for n in range(len(free), 0, -1):
                if any(
                    len({b for s in subset for b in range(s, s + shape.size)}) == n * shape.size
                    for subset in itertools.combinations(free, n)
                ):
                    best = n
                    break
            assert MAX_FIT[sid, mask] == best, (shape.name, bin(mask))
