"""The kernels' data layout (`scoring.layout`): codes in step with the enums, one definition of each constant."""

from __future__ import annotations

import pytest

from gpupack.scoring import inventory, kernels, layout, policies, reference, request
from gpupack.scoring.facts import MigMode
from gpupack.scoring.policies import POLICY_TABLE, PolicyRow, TieBreak
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
    assert kernels.MAX_GPUS is inventory.MAX_GPUS is layout.MAX_GPUS is reference.MAX_GPUS
    assert kernels.MILLI_PER_GPU is inventory.MILLI_PER_GPU is request.MILLI_PER_GPU is reference.MILLI_PER_GPU
    assert kernels.MAX_SPEC_CPU is layout.MAX_SPEC_CPU is reference.MAX_SPEC_CPU
    assert kernels.KIND_MIG is layout.KIND_MIG and kernels.MODE_STATIC is layout.MODE_STATIC


def test_scratch_follows_the_layout() -> None:
    scratch = kernels.make_scratch(types=3, width=5)
    assert scratch[layout.SCRATCH_UNUSABLE].shape == (1, 3)
    assert scratch[layout.SCRATCH_LOCAL].shape == (layout.LOCAL_ROWS, layout.MAX_GPUS)
    assert scratch[layout.SCRATCH_GPU].shape == (5,)
    assert scratch[layout.SCRATCH_PAIRS].shape == (layout.MAX_GPUS * layout.MAX_GPUS,)
    assert scratch[layout.SCRATCH_GPU_HOSTS].shape == (layout.MAX_GPUS, 3)


def test_the_kernels_and_the_reference_read_no_policy_id() -> None:
    """Policies are dispatched from their row of the table (rules and weights), never by id."""
    for module in (kernels, reference):
        assert not [name for name in vars(module) if name.startswith("P_")], module.__name__


SPECIAL = {"gpupack": policies.gpupack, "fgd": lambda: policies.fgd(policies.empty_mix())}


def test_every_policy_row_becomes_its_spec() -> None:
    assert len(layout.PART_NAMES) == layout.N_PARTS
    for name, row in POLICY_TABLE.items():
        spec = SPECIAL[name]() if name in SPECIAL else policies.baseline(name)
        assert spec.kernel_id == row.kernel_id and spec.tie_break == row.tie_break
        assert spec.rules[layout.RULE_SHARE] == row.share and spec.rules[layout.RULE_MIG] == row.mig
        assert spec.rules[layout.RULE_FRAG] == row.fragmentation
        assert spec.params.shape == (layout.N_WEIGHTS,) and spec.rules.shape == (layout.N_RULES,)
        for part, weight in row.parts.items():
            assert spec.params[part] == weight
    assert policies.baseline("kube-default", topology_sets=True).rules[layout.RULE_SETS] == 1
    assert policies.gpupack().rules[layout.RULE_SETS] == 1


@pytest.mark.parametrize(
    ("share", "mig", "parts"),
    [
        (layout.PICK_LEAST_FRAG, layout.PICK_FIRST, {}),
        (layout.PICK_FIRST, layout.PICK_FIRST, {layout.W_FGD: 1.0}),
        (layout.PICK_FGD, layout.PICK_FIRST, {}),
        (layout.PICK_FIRST, layout.PICK_FULLEST_LEAST_FRAG, {}),
    ],
)
def test_a_row_that_needs_fragmentation_must_measure_it(share: int, mig: int, parts: dict[int, float]) -> None:
    with pytest.raises(ValueError, match="without measuring fragmentation"):
        PolicyRow(layout.P_FIRSTFIT, share, mig, False, parts)


def test_random_and_fgd_picks_are_for_shares_only() -> None:
    with pytest.raises(ValueError, match="shares only"):
        PolicyRow(layout.P_RANDOM, layout.PICK_RANDOM, layout.PICK_RANDOM, False, {}, TieBreak.PER_POD)


def test_the_fullest_gpu_then_least_fragmentation_picks_mig_instances_only() -> None:
    with pytest.raises(ValueError, match="MIG instances only"):
        PolicyRow(layout.P_GPUPACK, layout.PICK_FULLEST_LEAST_FRAG, layout.PICK_LEAST_FRAG, True, {})
