"""The kernels' data layout (`scoring.layout`): codes in step with the enums, one definition of each constant."""

from __future__ import annotations

import pytest

from gpupack.scoring import inventory, kernels, layout, reference
from gpupack.scoring.facts import MigMode
from gpupack.scoring.request import Kind


def test_kernel_codes_equal_the_enums() -> None:
    for kind in Kind:
        assert getattr(layout, f"KIND_{kind.name}") == int(kind)
    for mode in MigMode:
        assert getattr(layout, f"MODE_{mode.name}") == int(mode)
    layout.check_codes(layout.CODES)
    layout.check_enums_covered()


def test_a_code_out_of_step_fails_the_import_check() -> None:
    wrong = dict(layout.CODES, KIND_MIG=(4, Kind.MIG))
    with pytest.raises(layout.LayoutError, match=r"KIND_MIG = 4"):
        layout.check_codes(wrong)


def test_shared_constants_are_defined_once() -> None:
    assert kernels.UNIT is layout.UNIT and reference.UNIT is layout.UNIT
    assert kernels.MILLI_UNIT is layout.MILLI_UNIT and reference.MILLI_UNIT is layout.MILLI_UNIT
    assert kernels.MAX_GPUS == inventory.MAX_GPUS == layout.MAX_GPUS
    assert kernels.KIND_MIG is layout.KIND_MIG and kernels.MODE_STATIC is layout.MODE_STATIC


def test_scratch_follows_the_layout() -> None:
    scratch = kernels.make_scratch(types=3, width=5)
    assert scratch[layout.SCRATCH_UNUSABLE].shape == (1, 3)
    assert scratch[layout.SCRATCH_LOCAL].shape == (layout.LOCAL_ROWS, layout.MAX_GPUS)
    assert scratch[layout.SCRATCH_GPU].shape == (5,)
    assert scratch[layout.SCRATCH_PAIRS].shape == (layout.MAX_GPUS * layout.MAX_GPUS,)
    assert scratch[layout.SCRATCH_GPU_HOSTS].shape == (layout.MAX_GPUS, 3)
