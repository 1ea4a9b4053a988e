"""Bounds on the work and memory one request can cause (#13 item 3): candidates per call, identifier
lengths, answer size, heavy bodies in flight, work whose answer is no longer wanted, remembered requests in bytes."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient

from gpupack.extender import decisions, verbs
from gpupack.extender.app import create_app
from gpupack.extender.decisions import SEEN_LIMIT, request_bytes
from gpupack.extender.settings import Settings
from gpupack.extender.wire import MAX_REASON_CHARS
from tests.extender_helpers import L4, node, pod, state_from

NODES = ["a", "b", "c"]
SETTINGS = Settings(max_candidates=len(NODES))


@pytest.fixture()
def state():
    return state_from([node(name, L4, 4) for name in NODES], settings=SETTINGS)


@pytest.fixture()
def client(state) -> TestClient:
    return TestClient(create_app(state, SETTINGS))


def names_last(pod_obj: dict[str, Any], names: list[str]) -> bytes:
    """kube-scheduler's own layout (NodeNames last): read from its wire bytes."""
    return orjson.dumps({"Pod": pod_obj, "Nodes": None, "NodeNames": names})


def names_first(pod_obj: dict[str, Any], names: list[str]) -> bytes:
    """Any other layout: parsed whole."""
    return orjson.dumps({"NodeNames": names, "Nodes": None, "Pod": pod_obj})


def nodes_mode(pod_obj: dict[str, Any], names: list[str]) -> bytes:
    items = [{"metadata": {"name": name}} for name in names]
    return orjson.dumps({"Pod": pod_obj, "NodeNames": None, "Nodes": {"metadata": {}, "items": items}})


LAYOUTS = {"NodeNames last": names_last, "NodeNames first": names_first, "Nodes": nodes_mode}


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_more_candidates_than_max_candidates_get_400(client: TestClient, verb: str, layout: str) -> None:
    body = LAYOUTS[layout](pod("p", gpus=1), [*NODES, "unknown"])
    answer = client.post(f"/{verb}", content=body)
    assert answer.status_code == 400
    assert "4 nodes exceed the limit of 3 per call (maxCandidates)" in answer.json()["Error"]
    assert client.post(f"/{verb}", content=LAYOUTS[layout](pod("p", gpus=1), NODES)).status_code == 200


LONG = "x" * 254
OVERLONG_PODS = {
    "name": (pod(LONG, gpus=1), "Pod.metadata.name of 254 characters exceeds Kubernetes' 253"),
    "namespace": (
        pod("p", gpus=1, namespace="n" * 64),
        "Pod.metadata.namespace of 64 characters exceeds Kubernetes' 63",
    ),
    "uid": (pod("p", gpus=1, uid="u" * (4 << 20)), "Pod.metadata.uid of 4194304 characters exceeds Kubernetes' 253"),
}


@pytest.mark.parametrize("field", OVERLONG_PODS)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_overlong_pod_identifiers_get_400_naming_the_field(client: TestClient, state, verb: str, field: str) -> None:
    pod_obj, reason = OVERLONG_PODS[field]
    answer = client.post(f"/{verb}", content=names_last(pod_obj, NODES))
    assert answer.status_code == 400
    assert answer.json()["Error"] == reason
    assert state.remembered_requests().entries == {}  # nothing of it is kept


@pytest.mark.parametrize("layout", LAYOUTS)
def test_overlong_node_names_get_400(client: TestClient, layout: str) -> None:
    answer = client.post("/filter", content=LAYOUTS[layout](pod("p", gpus=1), ["a", LONG]))
    assert answer.status_code == 400
    assert "a node name of 254 characters exceeds Kubernetes' 253" in answer.json()["Error"]


@pytest.mark.parametrize("field", ["PodName", "PodNamespace", "PodUID", "Node"])
def test_overlong_bind_fields_get_400_naming_the_field(client: TestClient, field: str) -> None:
    body = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "a", field: LONG}
    answer = client.post("/bind", content=orjson.dumps(body))
    assert answer.status_code == 400
    assert answer.json()["Error"].startswith(f"{field}: String should have at most")


def test_a_reason_quoting_the_pod_is_cut_so_the_answer_stays_small(client: TestClient) -> None:
    bad = pod("p", gpus=1)
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "9" * 100_000  # quoted in the reason
    body = names_last(bad, NODES)
    answer = client.post("/filter", content=body)
    assert answer.status_code == 200
    reasons = answer.json()["FailedAndUnresolvableNodes"]
    assert set(reasons) == set(NODES)
    assert all(len(reason) == MAX_REASON_CHARS and reason.endswith("…") for reason in reasons.values())
    assert len(answer.content) < len(body)  # was 3 x the body: the reason once per candidate


def test_unknown_names_are_answered_within_a_small_multiple_of_the_body() -> None:
    config = Settings()
    state = state_from([node("a", L4, 4)], settings=config)
    client = TestClient(create_app(state, config))
    names = [f"n{i}" for i in range(config.max_candidates)]  # short names: the worst ratio
    body = names_last(pod("p", gpus=1), names)
    answer = client.post("/filter", content=body)
    assert answer.status_code == 200 and len(answer.json()["FailedAndUnresolvableNodes"]) == len(names)
    assert len(answer.content) <= 5 * len(body)
    too_many = client.post("/filter", content=names_last(pod("p", gpus=1), [*names, "one-more"]))
    assert too_many.status_code == 400 and len(too_many.content) < 200  # was a 4x answer, 65 MiB at 16 MiB


def test_heavy_bodies_are_decided_one_at_a_time_and_the_others_get_a_busy_answer(monkeypatch, state) -> None:
    config = Settings(heavy_body_bytes=1024, max_heavy_in_flight=1, verb_timeout_seconds=0.5)
    running, peak = 0, 0
    counter = threading.Lock()

    def slow_filter(state, settings, body, deadline):  # a heavy decision still working past the deadline
        nonlocal running, peak
        with counter:
            running += 1
            peak = max(peak, running)
        time.sleep(1.0)
        with counter:
            running -= 1
        return b'{"Error":""}'

    monkeypatch.setattr(verbs, "filter_body", slow_filter)
    heavy = names_last(pod("p", gpus=1, annotations={"pad": "x" * (300 << 10)}), NODES)  # not decided inline

    async def two_at_once() -> list[str]:
        transport = httpx.ASGITransport(app=create_app(state, config))
        async with httpx.AsyncClient(transport=transport, base_url="http://gpupack") as http:
            first = asyncio.create_task(http.post("/filter", content=heavy))
            await asyncio.sleep(0.1)
            second = await http.post("/filter", content=heavy)
            return [(await first).json()["Error"], second.json()["Error"]]

    first, second = asyncio.run(two_at_once())
    assert first == "gpupack filter took longer than 0.5 s"
    assert second == "gpupack is busy with other large filter bodies; retry"  # the first's work still held the slot
    assert peak == 1


def test_a_filter_whose_caller_left_during_the_decision_commits_nothing(monkeypatch, state) -> None:
    deadline = verbs.Deadline()
    decide = state.decider.engine.decide

    def decide_then_hang_up(*args: Any, **kwargs: Any):
        decision = decide(*args, **kwargs)
        deadline.gone.set()  # the caller hangs up while gpupack decides
        return decision

    monkeypatch.setattr(state.decider.engine, "decide", decide_then_hang_up)
    with pytest.raises(verbs.Abandoned, match="the caller left before answering") as raised:
        verbs.filter_body(state, SETTINGS, names_last(pod("p", gpus=1), NODES), deadline)
    assert raised.value.caller_gone
    assert state.snapshot().gpus_allocated == 0 and not state.book.get("uid-default-p")


@pytest.mark.parametrize("verb", [verbs.filter_body, verbs.prioritize_body])
def test_work_past_its_deadline_stops_after_parsing(state, verb) -> None:
    late = verbs.Deadline(at=time.perf_counter() - 1)
    args = (state, SETTINGS) if verb is verbs.filter_body else (state,)
    with pytest.raises(verbs.Abandoned, match="the deadline passed before") as raised:
        verb(*args, names_last(pod("p", gpus=1), NODES), late)
    assert not raised.value.caller_gone
    assert state.remembered_requests().entries == {}  # not even the request was looked at


def test_seen_is_bounded_in_bytes(monkeypatch, state) -> None:
    monkeypatch.setattr(decisions, "SEEN_BYTES_LIMIT", 64 << 10)
    products = [f"product-{i:04d}-" + "x" * 48 for i in range(100)]  # 100 product values, each 62 chars
    for i in range(50):
        heavy = pod(f"p{i}", gpus=1)
        term = {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": products}]}
        affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        heavy["spec"]["affinity"] = {"nodeAffinity": affinity}
        state.scores_for_prioritize(heavy, NODES)
    remembered = state.remembered_requests()
    assert remembered.bytes <= 64 << 10
    assert remembered.bytes == sum(request_bytes(uid, *seen) for uid, seen in remembered.entries.items())
    assert 1 <= len(remembered.entries) < 50 < SEEN_LIMIT
    assert list(remembered.entries)[-1] == "uid-default-p49"  # the newest are kept
