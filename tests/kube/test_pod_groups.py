"""kube.pod_groups (#29): which group a pod belongs to, which convention wins, and sizes read safely."""

from __future__ import annotations

from typing import Any

import pytest

from gpupack.kube.pod_groups import GroupId, Membership, MembershipError, Rule, membership, min_member
from gpupack.scoring.gang import Level

GPUPACK = {"gpupack.io/group": "train", "gpupack.io/group-size": "8"}
X_K8S = {"scheduling.x-k8s.io/pod-group": "train"}
VOLCANO = {"scheduling.k8s.io/group-name": "train"}


def of(labels: dict[str, str], annotations: dict[str, str]) -> Membership | None:
    return membership({"metadata": {"namespace": "ml", "labels": labels, "annotations": annotations}})


def test_no_group_no_membership() -> None:
    assert of({}, {}) is None


@pytest.mark.parametrize(
    ("labels", "annotations", "rule", "size"),
    [
        ({}, GPUPACK, Rule.GPUPACK, 8),
        (X_K8S, {}, Rule.X_K8S, None),
        ({}, VOLCANO, Rule.VOLCANO, None),
        (X_K8S, {**GPUPACK, **VOLCANO}, Rule.GPUPACK, 8),  # gpupack's own pair wins
        (X_K8S, VOLCANO, Rule.X_K8S, None),  # then scheduler-plugins' label
        (X_K8S, {"gpupack.io/group-size": "4"}, Rule.X_K8S, 4),  # the size stands in for a missing PodGroup
    ],
)
def test_the_first_convention_that_applies_wins(
    labels: dict[str, str], annotations: dict[str, str], rule: Rule, size: int | None
) -> None:
    assert of(labels, annotations) == Membership(GroupId(rule, "ml", "train"), size, Level.CLUSTER)


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"gpupack.io/group": "train"}, "needs gpupack.io/group-size"),
        ({**GPUPACK, "gpupack.io/group-size": "0"}, "is not an integer 1..1000"),
        ({**GPUPACK, "gpupack.io/group-size": "1001"}, "is not an integer 1..1000"),
        ({**GPUPACK, "gpupack.io/group-size": "-3"}, "is not an integer 1..1000"),
        ({**GPUPACK, "gpupack.io/group-topology": "galaxy"}, "choose one of nvlink, rack, zone"),
    ],
)
def test_unreadable_annotations_are_named(annotations: dict[str, str], message: str) -> None:
    with pytest.raises(MembershipError, match=message):
        of({}, annotations)


def test_topology_annotation_sets_the_widest_domain() -> None:
    member = of({}, {**GPUPACK, "gpupack.io/group-topology": "rack"})
    assert member is not None and member.widest == Level.RACK


SPECS = [({"minMember": 8}, 8), ({}, 1), ({"minMember": 0}, 1), ({"minMember": "8"}, 1), ({"minMember": True}, 1)]


@pytest.mark.parametrize(("spec", "size"), [*SPECS, ({"minMember": 10**6}, 1000)])
def test_min_member_is_read_safely(spec: dict[str, Any], size: int) -> None:
    assert min_member({"spec": spec}) == size
    assert min_member({}) == 1
