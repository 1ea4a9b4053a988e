"""`gpupack.io/cordoned-gpus`: indexes and UUIDs read, anything else reported, never an error."""

from __future__ import annotations

import pytest

from gpupack.kube.gpu_cordon import MAX_CORDON_CHARS, Cordon, cordon_reason, parse_cordon, read_cordon
from gpupack.kube.node_usage import Exclusion, read_node_usage
from gpupack.scoring.facts import GpuSlot
from tests.extender_helpers import node

CORDON = "gpupack.io/cordoned-gpus"


@pytest.mark.parametrize(
    ("value", "indexes", "uuids", "invalid"),
    [
        ("2", {2}, set(), ()),
        (" 0 , GPU-5f1c-aa ,", {0}, {"GPU-5f1c-aa"}, ()),
        ("x,-1,1.5,GPU-,MIG-abc", set(), set(), ("x", "-1", "1.5", "GPU-", "MIG-abc")),
        ("", set(), set(), ()),
    ],
)
def test_entries_are_indexes_uuids_or_invalid(value: str, indexes: set[int], uuids: set[str], invalid: tuple) -> None:
    assert parse_cordon(value) == Cordon(frozenset(indexes), frozenset(uuids), invalid)


def test_a_value_longer_than_any_node_needs_is_one_invalid_entry() -> None:
    cordon = parse_cordon("1," * MAX_CORDON_CHARS)
    assert not cordon.indexes and len(cordon.invalid) == 1 and "characters" in cordon.invalid[0]


def test_resolve_names_gpus_of_the_node_and_reports_the_rest() -> None:
    cordon = parse_cordon("1, 7, GPU-a, GPU-gone")
    assert cordon.resolve({"GPU-a": 3}, gpu_count=4) == (frozenset({1, 3}), ("7", "GPU-gone"))


def test_serve_reads_indexes_and_leaves_uuids_to_the_agent() -> None:
    usage = read_node_usage(node("n1", gpus=4, annotations={CORDON: "3, GPU-a, 8, ?"}), gpu_count=4)
    assert usage.excluded == (Exclusion(3, cordon_reason("3")),)
    assert usage.cordon_invalid == ("?", "8")  # unreadable first, then those naming no GPU
    assert usage.excluded[0].why == "cordoned"


def test_the_agents_reason_wins_over_the_cordon_for_the_same_gpu() -> None:
    in_use = '{"blocked": [{"index": 1, "reason": "unhealthy: GPU is lost (NVML)"}]}'
    annotations = {CORDON: "1", "gpupack.io/devices-in-use": in_use}
    usage = read_node_usage(node("n1", gpus=2, annotations=annotations), gpu_count=2)
    assert usage.excluded == (Exclusion(1, "unhealthy: GPU is lost (NVML)"),)
    assert usage.excluded[0].why == "unhealthy"


def test_no_annotation_or_not_a_string_is_no_cordon() -> None:
    assert read_cordon(node("n1")) == Cordon()
    assert read_cordon({"metadata": {"annotations": {CORDON: 3}}}) == Cordon()


def test_an_exclusion_of_a_gpu_the_node_does_not_have_is_dropped() -> None:
    in_use = '{"blocked": [{"index": 9, "reason": "unhealthy: GPU is lost (NVML)"}]}'
    usage = read_node_usage(node("n1", gpus=2, annotations={"gpupack.io/devices-in-use": in_use}), gpu_count=2)
    assert usage.excluded == () and usage.blocked == (GpuSlot(9),)  # the hold skips it, as before
