"""Nodes a filter turns down, sorted as kube-scheduler's preemption needs them (#18 item 3).

FailedNodes are nodes where evicting lower-priority pods could make room: capacity shortages.
FailedAndUnresolvableNodes are nodes no preemption can help, and the reason says what is wrong: a MIG
profile the node's GPU model does not have, MIG asked of a node without MIG, more GPUs than the node
has. Each case goes through the extender's filter verb, deciding in filter and not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpupack.extender.app import create_app
from gpupack.extender.settings import Settings
from gpupack.extender.warm_up import warm_up
from gpupack.scoring.geometry import FAMILIES
from tests.extender_helpers import L4, file_state, node, pod, write_cluster

H200 = "NVIDIA-H200"
A30 = "NVIDIA-A30"
H100 = "NVIDIA-H100-80GB-HBM3"
EIGHT_GPUS = [{"index": i} for i in range(8)]


def cluster() -> list[dict[str, Any]]:
    return [
        node("h200", H200, 8, mig="dynamic"),
        node("a30", A30, 4),  # MIG-capable, MIG not enabled
        node("l4", L4, 8),
        node("h100", H100, 8),
        node("busy", H100, 8),
        pod("holder", gpus=8, cpu="190", node_name="busy", assignment={"node": "busy", "gpus": EIGHT_GPUS}),
    ]


@pytest.fixture(params=[True, False], ids=["decideInFilter", "decideInFilter-false"])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> TestClient:
    settings = Settings(decide_in_filter=request.param)
    state, _ = file_state(write_cluster(tmp_path / "cluster.yaml", cluster()), settings)
    warm_up(state)  # kernels compiled (or loaded) before the first timed filter
    return TestClient(create_app(state, settings))


def filter_(client: TestClient, obj: dict[str, Any], names: list[str]) -> dict[str, Any]:
    response = client.post("/filter", json={"Pod": obj, "Nodes": None, "NodeNames": names})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["Error"] == "" and body["NodeNames"] == []
    return body


def test_a_mig_profile_the_model_does_not_have_is_unresolvable(client: TestClient) -> None:
    body = filter_(client, pod("p", mig="3g.40gb"), ["h200"])  # the H200's 3g is 3g.71gb
    assert body["FailedNodes"] == {}
    reason = body["FailedAndUnresolvableNodes"]["h200"]
    assert reason.startswith(f"{H200} has no MIG profile 3g.40gb (its profiles: ")
    assert all(profile in reason for profile in FAMILIES["H200-141GB"].profiles)


@pytest.mark.parametrize(
    ("name", "reason"),
    [("a30", f"MIG is not enabled on this {A30} node"), ("l4", f"{L4} has no MIG")],
)
def test_mig_asked_of_a_node_without_mig_is_unresolvable(client: TestClient, name: str, reason: str) -> None:
    body = filter_(client, pod("p", mig="1g.6gb"), [name])  # an A30 profile
    assert body["FailedNodes"] == {}
    assert body["FailedAndUnresolvableNodes"] == {name: reason}


def test_more_gpus_than_the_node_has_is_unresolvable(client: TestClient) -> None:
    body = filter_(client, pod("p", gpus=9), ["h100", "a30"])
    assert body["FailedNodes"] == {}
    assert body["FailedAndUnresolvableNodes"] == {
        "h100": "the node has 8 GPUs, the pod asks for 9",
        "a30": "the node has 4 GPUs, the pod asks for 9",
    }


def test_capacity_shortages_stay_resolvable(client: TestClient) -> None:
    body = filter_(client, pod("p", gpus=1), ["busy"])  # its eight GPUs and 190 of 192 cores are held
    assert body["FailedNodes"] == {"busy": "not enough free GPU capacity"}
    assert body["FailedAndUnresolvableNodes"] == {}
    body = filter_(client, pod("q", cpu="4"), ["busy"])
    assert body["FailedNodes"] == {"busy": "not enough free CPU"}
    assert body["FailedAndUnresolvableNodes"] == {}
