"""Kubernetes Events on pods (#18 item 2): `Assigned` on every bind, `FailedAssignment` on repeated
failure, written off the decision lock, never blocking or failing a bind, counted when not written.

The cluster-level tests go through the fake API server (tests/fake_apiserver.py): a real
KubernetesSource, the real binder, events kept by the fake as the API server keeps them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from gpupack.extender import pod_events
from gpupack.extender.binder import BindError
from gpupack.extender.pod_events import (
    NOTE_LIMIT,
    REPEATED_FAILURES,
    WARNING_INTERVAL_SECONDS,
    EventFailure,
    EventReason,
    PodEvents,
    PodRef,
    assignment_note,
    micro_time,
    no_node_note,
)
from gpupack.extender.service_metrics import Metrics
from gpupack.scoring.facts import GpuSlot, Placement
from tests.extender_helpers import L4, FakeClock, file_state, node, pod, write_cluster
from tests.fake_apiserver import Extender, FakeApiServer, launch

ASSIGNMENT = "gpupack.io/assignment"


# --- the notes ---------------------------------------------------------------------------------


def test_assignment_notes_read_as_one_line() -> None:
    whole = Placement("gpu-node-7", (GpuSlot(0), GpuSlot(1)))
    assert assignment_note(whole) == "node gpu-node-7: GPUs 0, 1"
    assert assignment_note(Placement("a", (GpuSlot(5),))) == "node a: GPU 5"
    mig = Placement("h", (GpuSlot(3, mig="3g.40gb", start=4), GpuSlot(3, mig="1g.10gb+me", start=0)))
    assert assignment_note(mig) == "node h: GPU 3 MIG 3g.40gb@4, GPU 3 MIG 1g.10gb+me@0"
    assert assignment_note(Placement("l", (GpuSlot(2, milli=250),))) == "node l: GPU 2 share 250/1000"
    assert assignment_note(Placement("c", (), 1000, 1 << 30)) == "node c: no GPU"
    many = Placement("n" * 253, tuple(GpuSlot(i // 7, mig="1g.10gb", start=i % 7) for i in range(56)))
    note = assignment_note(many)
    assert len(note.encode()) <= NOTE_LIMIT and note.endswith("…") and "\n" not in note


def test_no_node_note_counts_the_commonest_reasons() -> None:
    failed = {"a": "not enough free GPU capacity", "b": "not enough free GPU capacity", "c": "not enough free CPU"}
    unresolvable = {"d": "node is cordoned or not Ready", "e": "x", "f": "y"}
    note = no_node_note(failed, unresolvable)
    assert note.startswith("no node fits: 2 nodes: not enough free GPU capacity; 1 node: ")
    assert note.endswith("; 2 more with other reasons")
    assert no_node_note({}, {}) == "no node fits: no candidate nodes"


def test_micro_time_has_six_fractional_digits() -> None:
    assert micro_time(1_700_000_000.0) == "2023-11-14T22:13:20.000000Z"
    assert micro_time(1_700_000_000.25) == "2023-11-14T22:13:20.250000Z"


# --- through the fake API server ---------------------------------------------------------------


def flushed(extender: Extender) -> Extender:
    assert extender.state.events.flush(5)
    return extender


def test_a_bind_puts_an_assigned_event_naming_what_the_annotation_says(extenders: list[Extender]) -> None:
    pods = [pod("whole", gpus=2), pod("mig", mig="3g.40gb"), pod("share", milli=300)]
    server = FakeApiServer([node("l4", L4, 2), node("h", mig="dynamic")], pods)
    extender = launch(extenders, server)
    for key, candidates in (("default/whole", ["l4"]), ("default/mig", ["h"]), ("default/share", ["h", "l4"])):
        chosen = extender.filter(key, candidates)
        assert chosen is not None
        extender.bind(key, chosen)
    flushed(extender)
    for key in ("default/whole", "default/mig", "default/share"):
        (event,) = server.events_on(key)
        obj = server.pod(key)
        placed = json.loads(obj["metadata"]["annotations"][ASSIGNMENT])
        assert (event["type"], event["reason"], event["action"]) == ("Normal", "Assigned", "Binding")
        assert event["regarding"] == {
            "apiVersion": "v1", "kind": "Pod", "namespace": "default",
            "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"],
        }  # fmt: skip
        assert event["reportingController"] == "gpupack.io/extender" and event["reportingInstance"]
        note = event["note"]
        assert note.startswith(f"node {placed['node']}: GPU") and "\n" not in note
        for slot in placed["gpus"]:
            assert str(slot["index"]) in note
            if "mig" in slot:
                assert f"MIG {slot['mig']}@{slot['start']}" in note
            if "milli" in slot:
                assert f"share {slot['milli']}/1000" in note
    assert extender.state.events.counts() == ({"Assigned": 3}, {})
    assert 'gpupack_events_total{reason="Assigned"} 3.0' in Metrics(extender.state).render().decode()


def test_repeated_filter_failures_give_one_warning_then_a_series_at_most_once_a_minute(
    extenders: list[Extender],
) -> None:
    clock = FakeClock()
    server = FakeApiServer([node("a", L4, 1)], [pod("big", gpus=2)])
    extender = launch(extenders, server, clock=clock)
    for _ in range(REPEATED_FAILURES - 1):
        assert extender.filter("default/big", ["a"]) is None
    assert flushed(extender).server.events_on("default/big") == []  # not yet repeated
    assert extender.filter("default/big", ["a"]) is None
    (warning,) = flushed(extender).server.events_on("default/big")
    assert (warning["type"], warning["reason"], warning["action"]) == ("Warning", "FailedAssignment", "Scheduling")
    assert warning["note"] == "no node fits: 1 node: the node has 1 GPU, the pod asks for 2"
    assert "series" not in warning
    for _ in range(5):  # within the minute: counted, not written
        assert extender.filter("default/big", ["a"]) is None
    assert len(flushed(extender).server.events_on("default/big")) == 1
    clock.advance(WARNING_INTERVAL_SECONDS)
    assert extender.filter("default/big", ["a"]) is None
    (again,) = flushed(extender).server.events_on("default/big")  # the same note: the series counts it
    assert again["metadata"]["name"] == warning["metadata"]["name"] and again["series"]["count"] == 2
    assert again["series"]["lastObservedTime"].endswith("Z")
    clock.advance(WARNING_INTERVAL_SECONDS)
    assert extender.filter("default/big", ["a", "ghost"]) is None  # another reason: another event
    events = flushed(extender).server.events_on("default/big")
    assert [e["note"] for e in events][1] == (
        "no node fits: 1 node: node unknown to gpupack; 1 node: the node has 1 GPU, the pod asks for 2"
    )
    written, failures = extender.state.events.counts()
    assert written == {"FailedAssignment": 3} and failures == {}


def test_a_bind_or_the_pods_deletion_starts_the_count_again(extenders: list[Extender]) -> None:
    server = FakeApiServer([node("a", L4, 1)], [pod("p", gpus=1), pod("q", gpus=1), pod("r", gpus=1)])
    extender = launch(extenders, server)
    assert extender.filter("default/q", ["a"]) == "a"  # q holds the only GPU
    for _ in range(REPEATED_FAILURES - 1):
        assert extender.filter("default/p", ["a"]) is None
        assert extender.filter("default/r", ["a"]) is None
    uid_p, uid_r = (server.pod(key)["metadata"]["uid"] for key in ("default/p", "default/r"))
    assert extender.state.events.failing() == {uid_p: 2, uid_r: 2}
    server.delete_pod("default/r")
    server.delete_pod("default/q")
    extender.caught_up()
    assert extender.state.events.failing() == {uid_p: 2}
    assert extender.filter("default/p", ["a"]) == "a"
    extender.bind("default/p", "a")
    assert extender.state.events.failing() == {}
    assert [e["reason"] for e in flushed(extender).server.events_on("default/p")] == ["Assigned"]


def test_repeated_bind_failures_warn_with_the_binds_reason(extenders: list[Extender]) -> None:
    server = FakeApiServer([node("a", L4, 1)], [pod("p", gpus=1)])
    extender = launch(extenders, server)
    server.fail_binding = lambda ns, name: ApiException(status=500, reason="etcdserver: request timed out")
    for _ in range(REPEATED_FAILURES):
        assert extender.filter("default/p", ["a"]) == "a"
        with pytest.raises(BindError):
            extender.bind("default/p", "a")
    (warning,) = flushed(extender).server.events_on("default/p")
    assert warning["note"] == "bind to a failed: cannot bind pod default/p to a: HTTP 500 etcdserver: request timed out"


def test_a_pod_whose_request_cannot_be_placed_is_warned_with_why(extenders: list[Extender]) -> None:
    server = FakeApiServer([node("a", L4, 1)], [pod("mixed", gpus=1, milli=200)])
    extender = launch(extenders, server)
    for _ in range(REPEATED_FAILURES):
        assert extender.filter("default/mixed", ["a"]) is None
    (warning,) = flushed(extender).server.events_on("default/mixed")
    assert warning["note"].startswith("the pod's request cannot be placed: ") and "mixes" in warning["note"]


def test_event_writes_that_fail_are_counted_and_never_fail_the_bind(extenders: list[Extender]) -> None:
    server = FakeApiServer([node("a", L4, 2)], [pod("p", gpus=1)])
    extender = launch(extenders, server)
    server.fail_events = lambda ns, name: ApiException(status=403, reason="Forbidden")
    assert extender.filter("default/p", ["a"]) == "a"
    extender.bind("default/p", "a")  # no exception
    assert server.pod("default/p")["spec"]["nodeName"] == "a"
    flushed(extender)
    assert server.events == {} and extender.state.events.counts() == ({}, {"write": 1})
    text = Metrics(extender.state).render().decode()
    assert 'gpupack_event_failures_total{reason="write"} 1.0' in text
    extender.assert_matches_rebuild()


class BlockedSink:
    """An event writer whose API server does not answer until `release` is set."""

    create_binding: Callable[..., None]

    def __init__(self) -> None:
        self.release = threading.Event()
        self.created: list[dict] = []

    def create_event(self, namespace: str, event: dict) -> None:
        self.release.wait(10)
        self.created.append(event)

    def patch_event(self, namespace: str, name: str, patch: dict) -> None:
        self.release.wait(10)


def test_a_writer_that_does_not_answer_blocks_nothing_and_a_full_queue_drops_and_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pod_events, "QUEUE_LIMIT", 5)
    sink = BlockedSink()
    events = PodEvents(lambda: sink)
    started = time.perf_counter()
    for i in range(20):
        events.assigned(PodRef("default", f"p{i}", f"uid-{i}"), Placement("a", (GpuSlot(0),)))
    assert time.perf_counter() - started < 5.0  # never waited for the API (one blocked write takes 10 s)
    _, failures = events.counts()
    assert failures[EventFailure.QUEUE_FULL] >= 20 - 5 - 1  # one may already be in the writer's hands
    sink.release.set()
    assert events.flush(5)
    written, failures = events.counts()
    assert written[EventReason.ASSIGNED] == len(sink.created) and len(sink.created) + failures["queue-full"] == 20


def test_a_bind_returns_while_its_event_is_still_being_written(tmp_path: Path) -> None:
    path = write_cluster(tmp_path / "c.yaml", [node("a", L4, 2), pod("p1", gpus=1), pod("p2", gpus=1)])
    state, source = file_state(path)
    sink = BlockedSink()
    sink.create_binding = source.create_binding  # binds go through; events wait for `release`
    state.writer = sink
    for obj in source.pods:
        assert state.decide_for_filter(obj, ["a"])[0] == "a"
        state.bind("default", obj["metadata"]["name"], obj["metadata"]["uid"], "a")  # returns at once
    assert sink.created == [] and state.snapshot().gpus_allocated == 2
    sink.release.set()
    assert state.events.flush(5) and len(sink.created) == 2


def test_the_cluster_file_logs_its_events(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_cluster(tmp_path / "c.yaml", [node("a", L4, 1), pod("p1", gpus=1)])
    state, source = file_state(path)
    assert state.decide_for_filter(source.pods[0], ["a"])[0] == "a"
    with caplog.at_level(logging.INFO, logger="gpupack.kube.sources.file_source"):
        state.bind("default", "p1", "uid-default-p1", "a")
        assert state.events.flush(5)
    (line,) = [r.getMessage() for r in caplog.records if "event" in r.getMessage()]
    assert line == "event Normal Assigned on pod default/p1: node a: GPU 0"


def test_without_a_writer_nothing_is_queued() -> None:
    events = PodEvents(lambda: None)
    for _ in range(REPEATED_FAILURES):
        events.failed(PodRef("default", "p", "u"), lambda: "why")
    assert events.failing() == {"u": REPEATED_FAILURES}  # counted all the same
    events.assigned(PodRef("default", "p", "u"), Placement("a", ()))
    assert events.counts() == ({}, {}) and events.failing() == {}


def test_the_failures_of_at_most_tracked_pods_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pod_events, "TRACKED_PODS", 100)
    now = [0.0]
    events = PodEvents(lambda: None, clock=lambda: now[0])
    for i in range(250):
        events.failed(PodRef("default", f"p{i}", f"uid-{i}"), lambda: "why")
    failing = events.failing()
    assert len(failing) == 100 and "uid-0" in failing and "uid-249" not in failing  # the newest not counted
    assert events.counts()[1] == {"untracked": 150}
    now[0] = pod_events.STALE_SECONDS  # the first ones stopped failing long ago: they make room
    events.failed(PodRef("default", "p249", "uid-249"), lambda: "why")
    assert "uid-249" in events.failing() and "uid-0" not in events.failing()


def test_more_pods_failing_in_turn_than_are_tracked_still_get_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """#26 low: forgetting the least recently failed forgot every pod before its next failure: no Warning."""
    monkeypatch.setattr(pod_events, "TRACKED_PODS", 100)
    events = PodEvents(lambda: None)
    for _ in range(REPEATED_FAILURES):
        for i in range(150):
            events.failed(PodRef("default", f"p{i}", f"uid-{i}"), lambda: "why")
    assert sum(1 for failures in events.failing().values() if failures >= REPEATED_FAILURES) == 100
