"""Anything a client can send gets a 4xx with a reason or per-node verdicts, never a 500, and leaves
the state as it was."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupack.extender.app import create_app
from gpupack.extender.decisions import UNKNOWN_NODE
from gpupack.extender.settings import Settings
from gpupack.extender.warm_up import warm_up
from tests.extender_helpers import L4, file_state, node, pod, write_cluster

LIMIT = 64 * 1024
NODES = ["h", "l"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    path = write_cluster(
        tmp_path_factory.mktemp("bad") / "c.yaml", [node("h", mig="dynamic"), node("l", L4, 4), pod("p", gpus=1)]
    )
    config = Settings(max_body_bytes=LIMIT)
    state, _ = file_state(path, config)
    warm_up(state)
    return TestClient(create_app(state, config)), state


def args(pod_obj: Any, names: Any = NODES, **extra: Any) -> bytes:
    body = {"Pod": pod_obj, "Nodes": None, "NodeNames": names, **extra}
    return orjson.dumps(body)


def post(client: TestClient, verb: str, content: bytes):
    return client.post(f"/{verb}", content=content, headers={"Content-Type": "application/json"})


def fingerprint(client: TestClient, state) -> tuple:
    scores = post(client, "prioritize", args(pod("probe", gpus=2))).json()
    snap = state.snapshot()
    return orjson.dumps(scores), snap.gpus_allocated, snap.reservations, sorted(state.placements())


BAD_BODIES = {
    "malformed JSON": b'{"Pod": {',
    "not an object": b"[1, 2]",
    "empty": b"",
    "missing Pod": orjson.dumps({"Nodes": None, "NodeNames": NODES}),
    "Pod null": args(None),
    "Pod a string": args("pod"),
    "NodeNames a string": args(pod("x", gpus=1), "h"),
    "NodeNames of numbers": args(pod("x", gpus=1), [1, 2]),
    "both Nodes and NodeNames": args(pod("x", gpus=1), NODES, Nodes={"items": []}),
    "neither": args(pod("x", gpus=1), None),
    "Nodes item without name": args(pod("x", gpus=1), None, Nodes={"items": [{"metadata": {}}]}),
    "metadata a list": args({"metadata": [], "spec": {}}),
    "no name": args({"metadata": {"namespace": "d"}, "spec": {}}),
    "annotations not strings": args({"metadata": {"name": "x", "annotations": {"a": 1}}, "spec": {}}),
    "spec a list": args({"metadata": {"name": "x"}, "spec": []}),
    "nodeName a number": args({"metadata": {"name": "x"}, "spec": {"nodeName": 3}}),
    "uid a number": args({"metadata": {"name": "x", "uid": 7}, "spec": {}}),
}

PRODUCT = "nvidia.com/gpu.product"


def expressions(value: Any) -> dict[str, Any]:
    """spec.affinity with one required node-affinity term whose matchExpressions is `value`."""
    terms = [{"matchExpressions": value}]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


BAD_PODS = {
    "unknown MIG profile": pod("m", mig="5g.50gb"),
    "negative GPUs": pod("n", gpus=-1),
    "huge GPU count": pod("g", gpus=100000),
    "huge CPU": pod("c", gpus=1, cpu="1e30"),
    "garbage quantity": pod("q", gpus=1, memory="lots"),
    "mixed kinds": pod("x", gpus=1, milli=200),
    "share out of range": pod("s", milli=1500),
    "containers not a list": {"metadata": {"name": "k"}, "spec": {"containers": {"a": 1}}},
    "resources a string": {"metadata": {"name": "r"}, "spec": {"containers": [{"name": "c", "resources": "x"}]}},
    "affinity garbage": {"metadata": {"name": "a"}, "spec": {"affinity": {"nodeAffinity": 5}}},
    "matchExpressions a number": {"metadata": {"name": "e"}, "spec": {"affinity": expressions(5)}},
    "matchExpressions a string": {"metadata": {"name": "t"}, "spec": {"affinity": expressions("x")}},
    "nodeSelector value a dict": {"metadata": {"name": "d"}, "spec": {"nodeSelector": {PRODUCT: {"a": 1}}}},
    "nodeSelector value a list": {"metadata": {"name": "l"}, "spec": {"nodeSelector": {PRODUCT: ["x"]}}},
    "nodeSelector value a number": {"metadata": {"name": "i"}, "spec": {"nodeSelector": {PRODUCT: 5}}},
}


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_bad_bodies_get_400_with_a_reason(served, verb: str, case: str) -> None:
    client, state = served
    before = fingerprint(client, state)
    response = post(client, verb, BAD_BODIES[case])
    assert response.status_code == 400, response.text
    assert response.json()["Error"]
    assert fingerprint(client, state) == before


@pytest.mark.parametrize("case", sorted(BAD_PODS))
def test_bad_pods_get_per_node_verdicts(served, case: str) -> None:
    client, state = served
    before = fingerprint(client, state)
    response = post(client, "filter", args(BAD_PODS[case], [*NODES, "nowhere"]))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["NodeNames"] == [] and body["Error"] == ""
    assert set(body["FailedAndUnresolvableNodes"]) == {*NODES, "nowhere"}
    assert all(body["FailedAndUnresolvableNodes"].values())
    scores = post(client, "prioritize", args(BAD_PODS[case]))
    assert scores.status_code == 200 and [s["Score"] for s in scores.json()] == [0, 0]
    assert fingerprint(client, state) == before


def test_unknown_node_names_are_unresolvable(served) -> None:
    client, _ = served
    body = post(client, "filter", args(pod("u", gpus=1), ["ghost-1", "ghost-2"])).json()
    assert body["NodeNames"] == [] and body["FailedNodes"] == {}
    assert body["FailedAndUnresolvableNodes"] == {"ghost-1": UNKNOWN_NODE, "ghost-2": UNKNOWN_NODE}
    assert post(client, "filter", args(pod("e", gpus=1), [])).json()["NodeNames"] == []


def test_body_over_the_limit_gets_413(served) -> None:
    client, state = served
    before = fingerprint(client, state)
    big = args(pod("big", gpus=1), [f"n{i}" for i in range(LIMIT // 4)])
    assert len(big) > LIMIT
    response = post(client, "filter", big)
    assert response.status_code == 413 and "limit" in response.json()["Error"]

    def chunks():  # no Content-Length: the limit holds while streaming
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    response = client.post("/filter", content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert fingerprint(client, state) == before


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"{}",
        orjson.dumps({"PodName": "p", "PodNamespace": "default", "PodUID": "u"}),
        orjson.dumps({"PodName": 5, "PodNamespace": "default", "PodUID": "u", "Node": "h"}),
        orjson.dumps({"PodName": "", "PodNamespace": "default", "PodUID": "u", "Node": "h"}),
    ],
)
def test_bad_bind_bodies_get_400(served, body: bytes) -> None:
    client, _ = served
    response = post(client, "bind", body)
    assert response.status_code == 400 and response.json()["Error"]


def test_bind_for_an_unknown_pod_answers_with_a_reason(served) -> None:
    client, state = served
    before = fingerprint(client, state)
    for name, node_name in (("nobody", "h"), ("p", "ghost")):
        body = orjson.dumps({"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}", "Node": node_name})
        response = post(client, "bind", body)
        assert response.status_code == 200
        assert "no reservation" in response.json()["Error"]
    assert fingerprint(client, state) == before


def test_valid_filter_answers_the_same_before_and_after_garbage(served) -> None:
    client, _ = served
    valid = args(pod("stable", gpus=1, uid="uid-stable"))
    first = post(client, "filter", valid).json()
    for body in BAD_BODIES.values():
        post(client, "filter", body)
    assert post(client, "filter", valid).json() == first


def test_unexpected_errors_become_verb_answers_not_500(served, monkeypatch, caplog) -> None:
    client, state = served

    def boom(*_: Any) -> None:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(state, "decide_for_filter", boom)
    monkeypatch.setattr(state, "scores_for_prioritize", boom)
    monkeypatch.setattr(state, "bind", boom)
    bind = orjson.dumps({"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "h"})
    with caplog.at_level(logging.ERROR, logger="gpupack.extender.app"):
        for _ in range(2):
            f = post(client, "filter", args(pod("z", gpus=1)))
            assert f.status_code == 200 and "internal error" in f.json()["Error"]
            p = post(client, "prioritize", args(pod("z", gpus=1)))
            assert p.status_code == 200 and p.json() == []
            b = post(client, "bind", bind)
            assert b.status_code == 200 and "internal error" in b.json()["Error"]
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 3  # once per verb, not per request
    metrics = client.get("/metrics").text  # ...and every one of them counted
    for verb in ("filter", "prioritize", "bind"):
        assert f'gpupack_internal_errors_total{{exception="RuntimeError",verb="{verb}"}} 2.0' in metrics


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/filter", 405), ("POST", "/filter/", 404), ("POST", "/nowhere", 404), ("DELETE", "/bind", 405)],
)
def test_wrong_paths_and_methods_answer_an_error_like_every_other(served, method: str, path: str, status: int) -> None:
    client, _ = served
    response = client.request(method, path, content=args(pod("w", gpus=1)), follow_redirects=False)
    assert response.status_code == status and set(response.json()) == {"Error"} and response.json()["Error"]


def test_health_endpoints(served) -> None:
    client, _ = served
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    text = metrics.text
    for name in (
        "gpupack_request_duration_seconds_bucket",
        "gpupack_decisions_total",
        "gpupack_gpus_allocated",
        "gpupack_gpus_free",
        "gpupack_mig_free_slices",
        'gpupack_reservations{state="assumed"}',
    ):
        assert name in text, name
    assert client.get("/filter").status_code == 405


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
pod_like = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {"name": st.text(min_size=1, max_size=5)}, optional={"annotations": json_values}
        )
    },
    optional={
        "spec": json_values | st.fixed_dictionaries({"containers": json_values}, optional={"nodeSelector": json_values})
    },
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pod_obj=pod_like | json_values, names=st.none() | st.lists(st.sampled_from(["h", "l", "x", ""]), max_size=4))
def test_random_bodies_never_500(served, pod_obj: Any, names: Any) -> None:
    client, _ = served
    for verb in ("filter", "prioritize"):
        body = json.dumps({"Pod": pod_obj, "Nodes": None, "NodeNames": names}).encode()  # big ints too
        response = post(client, verb, body)
        assert response.status_code in (200, 400), response.text
        assert response.json() is not None


def test_readyz_is_503_until_synced_and_warm(tmp_path: Path) -> None:
    from gpupack.extender.state import ClusterState

    state = ClusterState(Settings())
    client = TestClient(create_app(state, Settings()))
    response = client.get("/readyz")
    assert response.status_code == 503 and response.json()["waiting_for"] == ["sync", "warm-up"]
    assert client.get("/healthz").status_code == 200
