"""KubernetesSource against a scripted fake API: list, watch, bookmarks, drops, 410 Gone, terminal pods."""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from gpupack.kube.pods import pod_is_terminal, pod_key
from gpupack.kube.sources import (
    Backoff,
    JsonObject,
    KubernetesSource,
    NodeDeleted,
    NodeUpserted,
    ObjectList,
    PodDeleted,
    PodUpserted,
    Synced,
)
from tests.kube.test_sources_helpers import Mirror, make_node, make_pod

KINDS = ("Node", "Pod")


def added(obj: JsonObject) -> dict[str, Any]:
    return {"type": "ADDED", "object": obj}


def modified(obj: JsonObject) -> dict[str, Any]:
    return {"type": "MODIFIED", "object": obj}


def deleted(obj: JsonObject) -> dict[str, Any]:
    return {"type": "DELETED", "object": obj}


def bookmark(kind: str, rv: str) -> dict[str, Any]:
    return {"type": "BOOKMARK", "object": {"kind": kind, "metadata": {"resourceVersion": rv}}}


def gone_event(rv: str = "100") -> dict[str, Any]:
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {rv} (500)",
            "reason": "Expired",
            "code": 410,
        },
    }


class FakeStream:
    """A scripted watch: yields dict steps, raises exception steps, then ends (or blocks until closed)."""

    def __init__(self, steps: list[Any], idle: threading.Event | None = None) -> None:
        self._steps = deque(steps)
        self._idle = idle
        self._closed = threading.Event()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._steps:
            step = self._steps.popleft()
            if isinstance(step, BaseException):
                raise step
            return step
        if self._idle is not None:  # the script is over: behave like a quiet, open watch
            self._idle.set()
            self._closed.wait(5)
        raise StopIteration

    def close(self) -> None:
        self._closed.set()


class FakeKubeApi:
    """``KubeApi`` with scripted lists and watch streams, recording every call."""

    def __init__(self) -> None:
        self.lists: dict[str, deque[Any]] = {kind: deque() for kind in KINDS}
        self.watches: dict[str, deque[list[Any]]] = {kind: deque() for kind in KINDS}
        self.list_calls = dict.fromkeys(KINDS, 0)
        self.watch_calls: dict[str, list[tuple[str, int]]] = {kind: [] for kind in KINDS}
        self.idle = {kind: threading.Event() for kind in KINDS}
        self.writes: list[tuple[Any, ...]] = []
        self._last_list: dict[str, ObjectList] = {}
        # Scripted watches start only once every kind has been listed, so that event orders (and the
        # number of Synced) do not depend on thread scheduling.
        self._listed = {kind: threading.Event() for kind in KINDS}

    def script_list(self, kind: str, items: list[JsonObject], rv: str) -> None:
        self.lists[kind].append(ObjectList(items=items, resource_version=rv))

    def script_list_step(self, kind: str, step: Exception | Callable[[], ObjectList]) -> None:
        self.lists[kind].append(step)

    def script_watch(self, kind: str, *steps: Any) -> None:
        self.watches[kind].append(list(steps))

    def wait_idle(self, timeout: float = 3.0) -> None:
        for kind in KINDS:
            assert self.idle[kind].wait(timeout), f"{kind} loop did not reach the end of its script"

    # -- KubeApi ----------------------------------------------------------------------------------

    def list_nodes(self) -> ObjectList:
        return self._list("Node")

    def list_pods(self) -> ObjectList:
        return self._list("Pod")

    def watch_nodes(self, resource_version: str, timeout_seconds: int) -> FakeStream:
        return self._watch("Node", resource_version, timeout_seconds)

    def watch_pods(self, resource_version: str, timeout_seconds: int) -> FakeStream:
        return self._watch("Pod", resource_version, timeout_seconds)

    def create_binding(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        self.writes.append(("bind", namespace, name, uid, node, annotations))

    def create_event(self, namespace: str, event: JsonObject) -> None:
        self.writes.append(("event", namespace, event))

    def patch_event(self, namespace: str, name: str, patch: JsonObject) -> None:
        self.writes.append(("patch event", namespace, name, patch))

    def _list(self, kind: str) -> ObjectList:
        self.list_calls[kind] += 1
        if not self.lists[kind]:
            return self._last_list[kind]
        step = self.lists[kind].popleft()
        if isinstance(step, Exception):
            raise step
        listing = step() if callable(step) else step
        self._last_list[kind] = listing
        self._listed[kind].set()
        return listing

    def _watch(self, kind: str, resource_version: str, timeout_seconds: int) -> FakeStream:
        self.watch_calls[kind].append((resource_version, timeout_seconds))
        for listed in self._listed.values():
            assert listed.wait(5), "a kind was never listed"
        if self.watches[kind]:
            steps = self.watches[kind].popleft()
            if steps and isinstance(steps[0], ApiException) and len(steps) == 1:
                raise steps[0]  # the watch request itself is refused
            return FakeStream(steps)
        return FakeStream([], idle=self.idle[kind])


class Harness:
    """A source over a fake API, a mirror consumer, and a recording sleeper (no real sleeps)."""

    def __init__(self, clock: Callable[[], float] = lambda: 0.0, consumer: Mirror | None = None) -> None:
        self.api = FakeKubeApi()
        self.mirror = Mirror() if consumer is None else consumer
        self.sleeps: list[float] = []
        self.source = KubernetesSource(
            self.api,
            self.mirror,
            watch_timeout_seconds=240,
            sleep=self.sleeps.append,
            clock=clock,
            rng=random.Random(7),
        )

    def run(self) -> None:
        self.source.start()
        self.api.wait_idle()

    def stop(self) -> bool:
        return self.source.stop(timeout=2)


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.stop()


NODES = [make_node("gpu-1", "10"), make_node("gpu-2", "11")]
PODS = [
    make_pod("train-a", "12", node="gpu-1"),
    make_pod("train-b", "13", namespace="ml", node="gpu-2"),
    make_pod("done", "14", phase="Succeeded"),
]


def script_initial(h: Harness, nodes: list[JsonObject] = NODES, pods: list[JsonObject] = PODS) -> None:
    h.api.script_list("Node", nodes, "100")
    h.api.script_list("Pod", pods, "100")


def test_initial_lists_then_one_synced(harness: Harness) -> None:
    script_initial(harness)
    harness.run()
    assert harness.source.wait_synced(1)
    harness.mirror.assert_equals_fresh_list(NODES, PODS)
    assert harness.mirror.synced_count == 1
    assert isinstance(harness.mirror.events[-1], Synced)
    assert "default/done" not in harness.mirror.pods  # terminal pods hold nothing
    assert harness.api.watch_calls == {"Node": [("100", 240)], "Pod": [("100", 240)]}
    assert harness.sleeps == []


def test_not_synced_until_both_kinds_listed() -> None:
    h = Harness()
    gate = threading.Event()
    h.api.script_list("Node", NODES, "100")
    h.api.script_list_step("Pod", lambda: (gate.wait(5), ObjectList(PODS, "100"))[1])
    h.source.start()
    try:
        deadline = time.monotonic() + 3
        while len(h.mirror.nodes) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(h.mirror.nodes) == 2
        assert not h.source.wait_synced(0.02)
        assert h.mirror.synced_count == 0
        gate.set()
        assert h.source.wait_synced(3)
        h.api.wait_idle()
        assert h.mirror.synced_count == 1
    finally:
        h.stop()


def test_failed_list_is_retried_with_backoff(harness: Harness) -> None:
    harness.api.script_list("Node", NODES, "100")
    harness.api.script_list_step("Pod", ApiException(status=500, reason="etcd timeout"))
    harness.api.script_list("Pod", PODS, "100")
    harness.run()
    harness.mirror.assert_equals_fresh_list(NODES, PODS)
    assert harness.api.list_calls["Pod"] == 2
    assert len(harness.sleeps) == 1 and 0.25 <= harness.sleeps[0] <= 0.5
    assert harness.mirror.synced_count == 1


def test_watch_added_modified_deleted(harness: Harness) -> None:
    script_initial(harness)
    new_node = make_node("gpu-3", "101")
    relabelled = make_node("gpu-1", "102", gpus=4)
    new_pod = make_pod("infer", "103", node="gpu-3")
    moved = make_pod("train-a", "104", node="gpu-1", annotations={"gpupack.io/assignment": "{}"})
    gone_node = make_node("gpu-2", "105")
    gone_pod = make_pod("train-b", "106", namespace="ml")
    harness.api.script_watch("Node", added(new_node), modified(relabelled), deleted(gone_node))
    harness.api.script_watch("Pod", added(new_pod), modified(moved), deleted(gone_pod))
    harness.run()

    harness.mirror.assert_equals_fresh_list([relabelled, new_node], [moved, new_pod])
    watched = harness.mirror.events[harness.mirror.events.index(Synced()) + 1 :]
    assert [e for e in watched if isinstance(e, NodeUpserted | NodeDeleted)] == [
        NodeUpserted(new_node),
        NodeUpserted(relabelled),
        NodeDeleted("gpu-2"),
    ]
    assert [e for e in watched if isinstance(e, PodUpserted | PodDeleted)] == [
        PodUpserted(new_pod),
        PodUpserted(moved),
        PodDeleted("ml/train-b", "uid-pod-ml-train-b"),
    ]
    assert harness.mirror.synced_count == 1  # watch events never re-announce Synced
    # both streams ended after delivering events: healthy, so re-watched at once from the last version
    assert harness.api.watch_calls["Node"] == [("100", 240), ("105", 240)]
    assert harness.api.watch_calls["Pod"] == [("100", 240), ("106", 240)]
    assert harness.sleeps == []


def test_bookmark_moves_resource_version_and_emits_nothing(harness: Harness) -> None:
    script_initial(harness)
    harness.api.script_watch("Pod", added(make_pod("infer", "120")), bookmark("Pod", "175"))
    harness.run()
    watched = harness.mirror.events[harness.mirror.events.index(Synced()) + 1 :]
    assert watched == [PodUpserted(make_pod("infer", "120"))]
    assert harness.api.watch_calls["Pod"] == [("100", 240), ("175", 240)]
    assert harness.source.resource_version("Pod") == "175"
    assert harness.api.list_calls == {"Node": 1, "Pod": 1}


def test_dropped_stream_rewatches_from_last_version_without_relist(harness: Harness) -> None:
    script_initial(harness)
    harness.api.script_watch("Node", added(make_node("gpu-3", "130")), ProtocolError("connection reset"))
    harness.api.script_watch("Node", ConnectionResetError("again, before any event"))
    harness.run()
    assert harness.api.list_calls == {"Node": 1, "Pod": 1}
    assert harness.api.watch_calls["Node"] == [("100", 240), ("130", 240), ("130", 240)]
    assert "gpu-3" in harness.mirror.nodes
    # two consecutive failures: jittered delays below 0.5 s then below 1 s
    assert len(harness.sleeps) == 2
    assert 0.25 <= harness.sleeps[0] <= 0.5 and 0.5 <= harness.sleeps[1] <= 1.0
    assert harness.mirror.synced_count == 1


def test_stream_ending_at_once_backs_off_but_a_long_quiet_one_does_not() -> None:
    h = Harness()
    script_initial(h)
    h.api.script_watch("Node")  # ends immediately, nothing delivered: suspicious
    h.api.script_watch("Node")
    h.run()
    h.stop()
    assert len(h.sleeps) == 2

    ticks = iter(range(0, 10_000, 100))
    quiet = Harness(clock=lambda: float(next(ticks)))  # every watch "lasted" 100 s
    script_initial(quiet)
    quiet.api.script_watch("Node")
    quiet.api.script_watch("Node")
    quiet.run()
    quiet.stop()
    assert quiet.sleeps == []
    assert quiet.api.watch_calls["Node"] == [("100", 240)] * 3


def test_backoff_grows_is_capped_and_jittered() -> None:
    backoff = Backoff(base=0.5, cap=4.0, rng=random.Random(1))
    delays = [backoff.next_delay() for _ in range(8)]
    ceilings = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert len(set(delays)) == len(delays)  # jittered
    backoff.reset()
    assert backoff.next_delay() <= 0.5


def test_backoff_after_a_long_outage_stays_at_the_cap() -> None:
    """A watch that failed thousands of times in a row (an API server away for hours) keeps its thread:
    2 ** 1100 does not fit a float, so the growth must stop at the cap."""
    backoff = Backoff(base=0.5, cap=30.0, rng=random.Random(1))
    delays = [backoff.next_delay() for _ in range(5000)]
    assert 15.0 <= delays[-1] <= 30.0


@pytest.mark.parametrize(
    "gone",
    [gone_event(), ApiException(status=410, reason="Gone")],
    ids=["error-event", "api-exception"],
)
def test_410_relists_and_converges_to_fresh_list(harness: Harness, gone: Any) -> None:
    script_initial(harness)
    # While the watch was down: gpu-2 and ml/train-b vanished, gpu-3 and infer appeared, train-a finished,
    # and default/train-c was deleted and recreated under the same name (new uid).
    harness.api.script_watch("Node", added(make_node("gpu-9", "150")), gone)
    harness.api.script_watch("Pod", gone)
    fresh_nodes = [make_node("gpu-1", "190"), make_node("gpu-3", "191")]
    fresh_pods = [
        make_pod("train-a", "192", phase="Succeeded"),
        make_pod("infer", "193", node="gpu-3"),
        make_pod("done", "14", phase="Succeeded"),
    ]
    harness.api.script_list("Node", fresh_nodes, "200")
    harness.api.script_list("Pod", fresh_pods, "200")
    harness.run()

    harness.mirror.assert_equals_fresh_list(fresh_nodes, fresh_pods)
    assert NodeDeleted("gpu-2") in harness.mirror.events
    assert NodeDeleted("gpu-9") in harness.mirror.events  # seen on the watch, absent from the relist
    assert PodDeleted("ml/train-b", "uid-pod-ml-train-b") in harness.mirror.events
    assert PodDeleted("default/train-a", "uid-pod-default-train-a") in harness.mirror.events
    assert harness.api.list_calls == {"Node": 2, "Pod": 2}
    assert harness.api.watch_calls["Node"][-1] == ("200", 240)
    assert harness.api.watch_calls["Pod"][-1] == ("200", 240)
    assert harness.mirror.synced_count == 3  # initial, then one per relist
    assert harness.sleeps == []  # the first 410 relists at once


def test_410_when_the_watch_request_itself_is_refused(harness: Harness) -> None:
    script_initial(harness)
    harness.api.script_watch("Pod", ApiException(status=410, reason="Expired"))
    harness.api.script_list("Pod", PODS[:1], "300")
    harness.run()
    harness.mirror.assert_equals_fresh_list(NODES, PODS[:1])
    assert harness.api.watch_calls["Pod"] == [("100", 240), ("300", 240)]


def test_repeated_410_backs_off(harness: Harness) -> None:
    script_initial(harness)
    harness.api.script_watch("Pod", gone_event())
    harness.api.script_watch("Pod", gone_event())
    harness.run()
    assert harness.api.list_calls["Pod"] == 3
    assert len(harness.sleeps) == 1  # the first 410 relists at once, the second one after a pause


def test_other_error_event_rewatches_without_relist(harness: Harness) -> None:
    script_initial(harness)
    error = {"type": "ERROR", "object": {"kind": "Status", "code": 500, "reason": "InternalError"}}
    harness.api.script_watch("Node", bookmark("Node", "140"), error)
    harness.run()
    assert harness.api.list_calls["Node"] == 1
    assert harness.api.watch_calls["Node"] == [("100", 240), ("140", 240)]
    assert len(harness.sleeps) == 1


def test_pod_turning_terminal_is_deleted_once(harness: Harness) -> None:
    script_initial(harness)
    harness.api.script_watch(
        "Pod",
        modified(make_pod("train-a", "160", phase="Succeeded")),
        modified(make_pod("train-a", "161", phase="Succeeded")),  # status updates of a finished pod
        deleted(make_pod("train-a", "162", phase="Succeeded")),
        added(make_pod("batch", "163", phase="Failed")),  # never live: never announced
        modified(make_pod("train-b", "164", namespace="ml", phase="Failed")),
    )
    harness.run()
    pod_deletes = harness.mirror.of_type(PodDeleted)
    assert pod_deletes == [
        PodDeleted("default/train-a", "uid-pod-default-train-a"),
        PodDeleted("ml/train-b", "uid-pod-ml-train-b"),
    ]
    assert harness.mirror.errors == []
    assert harness.mirror.pods == {}


def test_pod_recreated_under_same_name_deletes_old_uid_first(harness: Harness) -> None:
    script_initial(harness)
    reborn = make_pod("train-a", "170", uid="uid-new")
    harness.api.script_watch("Pod", added(reborn))
    harness.run()
    tail = harness.mirror.events[-2:]
    assert tail == [PodDeleted("default/train-a", "uid-pod-default-train-a"), PodUpserted(reborn)]
    assert harness.mirror.errors == []


def test_stale_delete_of_another_uid_is_ignored(harness: Harness) -> None:
    script_initial(harness)
    harness.api.script_watch("Pod", deleted(make_pod("train-a", "171", uid="uid-of-an-older-incarnation")))
    harness.run()
    assert "default/train-a" in harness.mirror.pods


class FlakyMirror(Mirror):
    """Raises (once) on the node called ``boom`` instead of applying it."""

    def __init__(self) -> None:
        super().__init__()
        self.raised = False

    def __call__(self, event: Any) -> None:
        if isinstance(event, NodeUpserted) and event.name == "boom" and not self.raised:
            self.raised = True
            raise RuntimeError("consumer bug")
        super().__call__(event)


def test_failing_consumer_triggers_a_relist() -> None:
    harness = Harness(consumer=FlakyMirror())
    script_initial(harness)
    harness.api.script_watch("Node", added(make_node("boom", "180")))
    harness.api.script_list("Node", [*NODES, make_node("boom", "180")], "181")
    harness.run()
    harness.mirror.assert_equals_fresh_list([*NODES, make_node("boom", "180")], PODS)
    assert harness.api.list_calls["Node"] == 2
    assert harness.mirror.synced_count == 2
    harness.stop()


def test_stop_interrupts_a_pending_watch() -> None:
    h = Harness()
    script_initial(h)
    h.run()
    assert h.stop()  # within 2 s; the watch would hold its loop for 240


def test_writes_are_forwarded_to_the_api(harness: Harness) -> None:
    assigned = {"gpupack.io/assignment": '{"node": "gpu-2"}'}
    harness.source.create_binding("ml", "train-b", "uid-pod-ml-train-b", "gpu-2", assigned)
    assert harness.api.writes == [("bind", "ml", "train-b", "uid-pod-ml-train-b", "gpu-2", assigned)]


class ListCheckingMirror(Mirror):
    """A mirror that, at the n-th Synced, compares itself with the n-th scripted Pod list."""

    def __init__(self, lists: list[list[JsonObject]]) -> None:
        super().__init__()
        self.lists = lists
        self.mismatches: list[int] = []

    def __call__(self, event: Any) -> None:
        super().__call__(event)
        if isinstance(event, Synced):
            expected = self.lists[self.synced_count - 1]
            if self.pods != {pod_key(pod): pod for pod in expected if not pod_is_terminal(pod)}:
                self.mismatches.append(self.synced_count)


class RandomCluster:
    """Pods churning at random: created, updated, finished, deleted, recreated under an old name."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.pods: dict[str, JsonObject] = {}
        self.version = 100
        self._uids = iter(range(10_000))

    def mutate(self) -> dict[str, Any]:
        self.version += 1
        name = f"p{self.rng.randrange(10)}"
        held = self.pods.get(name)
        if held is not None and self.rng.random() < 0.3:
            del self.pods[name]
            return deleted({**held, "metadata": {**held["metadata"], "resourceVersion": str(self.version)}})
        phase = self.rng.choice(["Pending", "Running", "Running", "Succeeded", "Failed"])
        recreate = held is None or self.rng.random() < 0.1
        uid = f"u{next(self._uids)}" if recreate or held is None else held["metadata"]["uid"]
        pod = make_pod(name, str(self.version), uid=uid, phase=phase)
        self.pods[name] = pod
        return (added if held is None else modified)(pod)


@pytest.mark.parametrize("seed", range(10))
def test_random_histories_converge_to_a_fresh_list(seed: int) -> None:
    """Random churn, dropped watches and expired versions: at every Synced the mirror equals that list."""
    rng = random.Random(seed)
    cluster = RandomCluster(rng)
    for _ in range(8):
        cluster.mutate()
    lists = [list(cluster.pods.values())]
    mirror = ListCheckingMirror(lists)
    h = Harness(consumer=mirror)
    h.api.script_list("Node", [], "1")
    h.api.script_list("Pod", lists[0], str(cluster.version))
    for _window in range(8):
        events = [cluster.mutate() for _ in range(rng.randrange(1, 6))]
        if rng.random() < 0.5:  # the watch delivers them, then the connection drops
            h.api.script_watch("Pod", *events, ProtocolError("reset"))
        else:  # they happened while the watch was down and the version expired: 410, relist
            h.api.script_watch("Pod", gone_event())
            lists.append(list(cluster.pods.values()))
            h.api.script_list("Pod", lists[-1], str(cluster.version))
    h.run()
    h.stop()
    assert mirror.mismatches == []
    assert h.mirror.synced_count == len(lists)
    h.mirror.assert_equals_fresh_list([], list(cluster.pods.values()))
