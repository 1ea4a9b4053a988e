"""The assignment checker itself (no cluster): it passes legal placements and names every kind of clash."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpupack.harness.controlplane import pod_body
from tests.e2e.catalogue import A30, H100, STATIC_H100_LAYOUT, dynamic_mig_node, static_mig_node, whole_gpu_node
from tests.e2e.checks import assignment_problems

NODES = [
    whole_gpu_node("whole", H100, 8, "on-demand", 98.32),
    dynamic_mig_node("dynamic", H100, 2, "on-demand", 24.58),
    static_mig_node("static", H100, STATIC_H100_LAYOUT, "on-demand", 24.58),
]


def bound_pod(
    name: str, resource: str, amount: int, node: str, gpus: list[dict[str, Any]], **kw: Any
) -> dict[str, Any]:
    """A pod bound to `node` with an assignment of `gpus` (assignment node: `kw["assigned"]` or `node`)."""
    body = pod_body(name, {resource: amount}, node_affinity=kw.get("affinity"))
    body["metadata"]["namespace"] = "ns"
    body["metadata"]["annotations"]["gpupack.io/assignment"] = json.dumps(
        {"node": kw.get("assigned", node), "gpus": gpus}
    )
    body["spec"]["nodeName"] = node
    return body


LEGAL = [
    bound_pod("whole", "nvidia.com/gpu", 2, "whole", [{"index": 0}, {"index": 1}]),
    bound_pod("share-a", "gpupack.io/gpu-milli", 600, "whole", [{"index": 2, "milli": 600}]),
    bound_pod("share-b", "gpupack.io/gpu-milli", 400, "whole", [{"index": 2, "milli": 400}]),
    bound_pod("mig-a", "nvidia.com/mig-3g.40gb", 1, "dynamic", [{"index": 0, "mig": "3g.40gb", "start": 4}]),
    bound_pod("mig-b", "nvidia.com/mig-1g.10gb.me", 1, "dynamic", [{"index": 0, "mig": "1g.10gb+me", "start": 0}]),
    bound_pod("mig-c", "nvidia.com/mig-1g.10gb.me", 1, "static", [{"index": 0, "mig": "1g.10gb+me", "start": 0}]),
    bound_pod("mig-d", "nvidia.com/mig-4g.40gb", 1, "static", [{"index": 1, "mig": "4g.40gb", "start": 0}]),
]


def test_legal_placements_pass() -> None:
    assert assignment_problems(NODES, LEGAL) == []


@pytest.mark.parametrize(
    ("pod", "problem"),
    [
        (bound_pod("x", "nvidia.com/gpu", 1, "whole", [{"index": 1}]), "already taken"),
        (bound_pod("x", "gpupack.io/gpu-milli", 100, "whole", [{"index": 2, "milli": 100}]), "1100 milli"),
        (bound_pod("x", "gpupack.io/gpu-milli", 100, "whole", [{"index": 0, "milli": 100}]), "already taken"),
        (bound_pod("x", "nvidia.com/gpu", 1, "whole", [{"index": 8}]), "has 8 GPUs"),
        (bound_pod("x", "nvidia.com/gpu", 1, "whole", [{"index": 5}], assigned="dynamic"), "names node"),
        (
            bound_pod("x", "nvidia.com/gpu", 1, "whole", [{"index": 5}], affinity={"nvidia.com/gpu.product": [A30]}),
            "affinity",
        ),
        (
            bound_pod("x", "nvidia.com/mig-2g.20gb", 1, "dynamic", [{"index": 0, "mig": "2g.20gb", "start": 4}]),
            "overlaps",
        ),
        (
            bound_pod("x", "nvidia.com/mig-1g.10gb.me", 1, "dynamic", [{"index": 0, "mig": "1g.10gb+me", "start": 1}]),
            "+me",
        ),
        (
            bound_pod("x", "nvidia.com/mig-1g.10gb.me", 1, "static", [{"index": 0, "mig": "1g.10gb", "start": 1}]),
            "asked for",
        ),
        (
            bound_pod("x", "nvidia.com/mig-1g.10gb.me", 1, "static", [{"index": 0, "mig": "1g.10gb+me", "start": 1}]),
            "static layout",
        ),
        (bound_pod("x", "nvidia.com/mig-1g.10gb", 1, "static", [{"index": 1, "mig": "1g.10gb", "start": 6}]), ""),
        (
            bound_pod("x", "nvidia.com/mig-3g.40gb", 1, "dynamic", [{"index": 1, "mig": "3g.40gb", "start": 2}]),
            "cannot start",
        ),
        (bound_pod("x", "nvidia.com/gpu", 1, "static", [{"index": 0}]), "static-MIG GPU"),
    ],
)
def test_each_clash_is_named(pod: dict[str, Any], problem: str) -> None:
    problems = assignment_problems(NODES, [*LEGAL, pod])
    if problem:
        assert any(problem in p for p in problems), problems
    else:
        assert problems == []  # control: a free instance of the static layout


def test_a_bound_pod_without_an_assignment_is_a_problem() -> None:
    pod = bound_pod("x", "nvidia.com/gpu", 1, "whole", [])
    del pod["metadata"]["annotations"]["gpupack.io/assignment"]
    assert assignment_problems(NODES, [pod]) == ["ns/x: bound to whole without gpupack.io/assignment"]
