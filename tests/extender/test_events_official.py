"""OfficialKubeApi's two event calls through the real `kubernetes` client, against a canned HTTP server:
the path, the body and the content type events.k8s.io/v1 expects (#18 item 2)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpupack.extender.pod_events import PodEvents, PodRef
from gpupack.scoring.facts import GpuSlot, Placement
from tests.kube.test_sources_official_api import CannedHttpApiServer, official

EVENTS = "/apis/events.k8s.io/v1/namespaces/ml/events"


@pytest.fixture
def server() -> Iterator[CannedHttpApiServer]:
    fake = CannedHttpApiServer()
    yield fake
    fake.close()


def test_create_event_posts_an_events_k8s_io_event(server: CannedHttpApiServer) -> None:
    server.routes["POST", EVENTS] = (201, {"kind": "Event", "apiVersion": "events.k8s.io/v1"})
    api = official(server)
    events = PodEvents(lambda: api, wall=lambda: 1_700_000_000.0, instance="gpupack-extender-test")
    events.assigned(PodRef("ml", "train", "uid-1"), Placement("gpu-3", (GpuSlot(3, mig="3g.40gb", start=4),)))
    assert events.flush(5)
    (request,) = server.requests
    body = request["body"]
    assert (request["method"], request["path"]) == ("POST", EVENTS)
    assert body["metadata"]["name"].startswith("train.") and body["metadata"]["namespace"] == "ml"
    assert body["eventTime"] == "2023-11-14T22:13:20.000000Z"  # a whole second keeps its six digits (MicroTime)
    assert {key: body[key] for key in ("reportingController", "reportingInstance", "action", "reason", "type")} == {
        "reportingController": "gpupack.io/extender",
        "reportingInstance": "gpupack-extender-test",
        "action": "Binding",
        "reason": "Assigned",
        "type": "Normal",
    }
    assert body["note"] == "node gpu-3: GPU 3 MIG 3g.40gb@4"
    assert body["regarding"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "ml", "name": "train", "uid": "uid-1"}
    assert events.counts() == ({"Assigned": 1}, {})


def test_patch_event_sends_a_merge_patch(server: CannedHttpApiServer) -> None:
    server.routes["PATCH", f"{EVENTS}/train.1"] = (200, {"kind": "Event", "apiVersion": "events.k8s.io/v1"})
    series = {"series": {"count": 2, "lastObservedTime": "2026-11-26T13:00:00.000000Z"}}
    official(server).patch_event("ml", "train.1", series)
    (request,) = server.requests
    assert request["method"] == "PATCH" and request["content_type"] == "application/merge-patch+json"
    assert request["body"] == series


def test_a_refused_event_is_counted(server: CannedHttpApiServer) -> None:
    server.routes["POST", EVENTS] = (403, {"kind": "Status", "code": 403, "reason": "Forbidden"})
    api = official(server)
    events = PodEvents(lambda: api)
    events.assigned(PodRef("ml", "train", "uid-1"), Placement("gpu-3", (GpuSlot(0),)))
    assert events.flush(5) and events.counts() == ({}, {"write": 1})
