"""The rows of docs/bad-input.md not already proven in tests/extender/test_app_bad_input.py: nodes with garbage
`gpupack.io/*` annotations or topology matrices of the wrong shape, unknown GPU products, and the
whole catalogue against a real server process-in-a-thread that must keep answering.

Every case: a 4xx with a reason or per-node verdicts with reasons, and a valid request answers the
same before and after (the state is unchanged).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient

from gpupack.extender.app import create_app
from gpupack.extender.binder import NOT_SYNCED
from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.extender.warm_up import warm_up
from gpupack.kube.sources import NodeUpserted, PodDeleted, Synced
from tests.extender.test_app_bad_input import BAD_BODIES, BAD_PODS, LIMIT, args, fingerprint, post
from tests.extender_helpers import L4, file_state, live_server, node, pod, write_cluster

UNKNOWN_PRODUCT = "ACME-Tensor-X1"
GOOD = ["h", "l"]


def topology(nvlink: Any = None, numa: Any = None) -> dict[str, str]:
    data = {k: v for k, v in (("nvlink", nvlink), ("numa", numa)) if v is not None}
    return {"gpupack.io/gpu-topology": json.dumps(data)}


# node name -> (annotations, the annotation key its unresolvable reason must name)
GARBAGE_NODES: dict[str, tuple[dict[str, str], str]] = {
    "topo-2x2-on-8": (topology(nvlink=[[0, 1], [1, 0]]), "gpu-topology"),
    "topo-ragged": (topology(nvlink=[[0] * 8] * 7 + [[0] * 3]), "gpu-topology"),
    "topo-asymmetric": (topology(nvlink=[[0] * 8 for _ in range(7)] + [[1] + [0] * 7]), "gpu-topology"),
    "topo-negative": (topology(nvlink=[[-1] * 8] * 8), "gpu-topology"),
    "topo-numa-short": (topology(numa=[0, 1]), "gpu-topology"),
    "topo-not-json": ({"gpupack.io/gpu-topology": "{nvlink"}, "gpu-topology"),
    "topo-a-list": ({"gpupack.io/gpu-topology": "[1, 2]"}, "gpu-topology"),
    "mig-sometimes": ({"gpupack.io/mig": "sometimes"}, "gpupack.io/mig"),
    "layout-garbage": ({"gpupack.io/mig-layout": "{\"0\": [\"9g.99gb@0\"]}"}, "mig-layout"),
    "cost-cheap": ({"gpupack.io/hourly-cost": "cheap"}, "hourly-cost"),
    "cost-negative": ({"gpupack.io/hourly-cost": "-3"}, "hourly-cost"),
    "cost-minus-zero": ({"gpupack.io/hourly-cost": "-0"}, "hourly-cost"),
}
BROKEN = [*GARBAGE_NODES, "acme-dynamic"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    nodes = [node("h", mig="dynamic"), node("l", L4, 4), node("acme", UNKNOWN_PRODUCT, 4)]
    nodes += [node(name, annotations=notes) for name, (notes, _) in GARBAGE_NODES.items()]
    nodes.append(node("acme-dynamic", UNKNOWN_PRODUCT, 4, mig="dynamic"))
    path = write_cluster(tmp_path_factory.mktemp("catalogue") / "c.yaml", [*nodes, pod("p", gpus=1)])
    config = Settings(max_body_bytes=LIMIT)
    state, _ = file_state(path, config)
    warm_up(state)
    return TestClient(create_app(state, config)), state, config


@pytest.mark.parametrize("name", sorted(GARBAGE_NODES))
def test_node_with_garbage_gpupack_annotation_is_unresolvable_with_the_key(served, name: str) -> None:
    client, state, _ = served
    before = fingerprint(client, state)
    response = post(client, "filter", args(pod(f"g-{name}", gpus=1), [name, *GOOD]))
    assert response.status_code == 200
    body = response.json()
    reason = body["FailedAndUnresolvableNodes"][name]
    assert GARBAGE_NODES[name][1] in reason and name in reason
    assert name not in body["NodeNames"] and len(body["NodeNames"]) == 1  # the good nodes still serve
    scores = dict((s["Host"], s["Score"]) for s in post(client, "prioritize", args(pod("x", gpus=1), [name])).json())
    assert scores == {name: 0}
    release(state, f"g-{name}")
    assert fingerprint(client, state) == before


def test_nodes_mode_items_with_garbage_annotations_are_answered_from_gpupack_state(served) -> None:
    """In Nodes mode the Node objects in the body are not read for facts: only their names count."""
    client, state, _ = served
    before = fingerprint(client, state)
    items = [node("l", L4, 4, annotations={"gpupack.io/gpu-topology": "garbage", "gpupack.io/mig": "7"})]
    body = orjson.dumps({"Pod": pod("nm", gpus=1), "Nodes": {"items": items}, "NodeNames": None})
    answer = post(client, "filter", body).json()
    assert [n["metadata"]["name"] for n in answer["Nodes"]["items"]] == ["l"]
    release(state, "nm")
    assert fingerprint(client, state) == before


def nested(depth: int) -> dict[str, Any]:
    """An object `depth` levels deep."""
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"x": value}
    return value


def test_nodes_mode_item_too_deep_to_answer_with_reserves_nothing(served) -> None:
    """A chosen Node gpupack cannot write back (orjson stops at 255 levels) is refused before the
    placement is committed: nothing stays held (#13)."""
    client, state, _ = served
    before = fingerprint(client, state)
    deep = node("l", L4, 4)
    deep["status"]["deep"] = nested(300)
    body = json.dumps({"Pod": pod("deep", gpus=1), "Nodes": {"items": [deep]}, "NodeNames": None}).encode()
    answer = post(client, "filter", body)
    assert answer.status_code == 400 and "nested too deeply" in answer.json()["Error"]
    assert fingerprint(client, state) == before and state.book.get("uid-default-deep") is None


def test_unknown_gpu_product_is_a_plain_gpu_node(served) -> None:
    """No MIG geometry known: whole GPUs and shares are served, MIG requests are unresolvable with a reason."""
    client, state, _ = served
    before = fingerprint(client, state)
    whole = post(client, "filter", args(pod("acme-whole", gpus=4), ["acme"])).json()
    assert whole["NodeNames"] == ["acme"]
    release(state, "acme-whole")
    mig = post(client, "filter", args(pod("acme-mig", mig="1g.10gb"), ["acme"])).json()
    assert mig["NodeNames"] == [] and "acme" not in mig["FailedNodes"]
    assert "MIG" in mig["FailedAndUnresolvableNodes"]["acme"]  # no MIG on it: preemption cannot help
    pinned = pod("acme-pinned", gpus=1)
    pinned["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "Nonexistent-GPU"}
    answer = post(client, "filter", args(pinned, ["acme", "l"])).json()
    assert answer["NodeNames"] == [] and set(answer["FailedNodes"]) == {"acme", "l"}
    assert fingerprint(client, state) == before


def test_unknown_gpu_product_with_mig_annotation_is_unresolvable(served) -> None:
    client, state, _ = served
    answer = post(client, "filter", args(pod("acme-dyn", gpus=1), ["acme-dynamic"])).json()
    assert "no MIG geometry" in answer["FailedAndUnresolvableNodes"]["acme-dynamic"]
    assert state.bad_nodes().keys() == set(BROKEN)


def release(state: ClusterState, pod_name: str) -> None:
    """Drop the reservation a passing filter made (the pod is deleted), so fingerprints compare alike."""
    state.apply(PodDeleted(f"default/{pod_name}", f"uid-default-{pod_name}"))


def test_the_whole_catalogue_against_a_live_server_keeps_it_up(served, tmp_path: Path) -> None:
    """Every bad input over real HTTP; the server answers each with 4xx or verdicts and stays up."""
    _, state, config = served
    with live_server(state, config) as (host, port), httpx.Client(base_url=f"http://{host}:{port}") as client:
        valid = args(pod("probe-live", gpus=2), GOOD)
        first = client.post("/prioritize", content=valid).json()
        statuses = []
        for body in BAD_BODIES.values():
            statuses.append(client.post("/filter", content=body).status_code)
        for bad in BAD_PODS.values():
            statuses.append(client.post("/filter", content=args(bad, GOOD)).status_code)
        statuses.append(client.post("/filter", content=args(pod("ghosts", gpus=1), ["ghost"])).status_code)
        statuses.append(client.post("/filter", content=b"x" * (LIMIT + 1)).status_code)
        unknown = {"PodName": "nobody", "PodNamespace": "default", "PodUID": "u", "Node": "h"}
        statuses.append(client.post("/bind", json=unknown).status_code)
        assert all(s in (200, 400, 413) for s in statuses), statuses
        assert statuses.count(400) == len(BAD_BODIES) and 413 in statuses
        assert client.get("/healthz").status_code == 200
        assert client.post("/prioritize", content=valid).json() == first


def test_filter_before_the_first_sync_answers_an_error_and_reserves_nothing() -> None:
    state = ClusterState(Settings())
    state.apply(NodeUpserted(node("l", L4, 4)))  # listed in part: a decision now could double-book
    client = TestClient(create_app(state, Settings()))
    answer = post(client, "filter", args(pod("early", gpus=1), ["l"])).json()
    assert answer["Error"] == NOT_SYNCED
    assert state.book.live() == [] and state.snapshot().gpus_allocated == 0
    state.apply(Synced())
    assert post(client, "filter", args(pod("early", gpus=1), ["l"])).json()["NodeNames"] == ["l"]
