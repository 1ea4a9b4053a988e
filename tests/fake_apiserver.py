"""An in-memory Kubernetes API server for fault tests: a `KubeApi` with live watches and faults to inject,
and `Extender`: a ClusterState fed through a real KubernetesSource over it.

Objects get increasing resourceVersions and every change goes into one event log. Watches stream
that log from the requested resourceVersion and block for new entries, like the real thing. Faults:
`drop_watches()` ends every open watch with a connection error (the source re-watches from where it
was), `compact()` also forgets history so that re-watch gets 410 Gone (the source relists),
`pause()`/`resume()` hold back watch delivery (a lagging informer), and `fail_binding` /
`bind_then_fail` make the binder's one write (the Binding with the assignment annotation) fail.
`patch_pod_annotations` is a user's edit, not a binder's write. Events on pods (events.k8s.io/v1)
are kept in `events` by namespace/name, created and merge-patched as the API server would (409 when
the name exists, 404 when it does not); `fail_events` makes those writes fail.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.kube.pods import pod_key
from gpupack.kube.sources import Event, JsonObject, KubernetesSource, ObjectList, Synced
from tests.extender_helpers import FakeClock, assert_matches_rebuild

KINDS = ("Node", "Pod")
WriteFault = Callable[[str, str], Exception | None]  # (namespace, name) -> exception to raise, or None


class FakeApiServer:
    """Nodes and Pods with resourceVersions, an event log, blocking watches and injectable faults."""

    def __init__(self, nodes: Iterable[JsonObject] = (), pods: Iterable[JsonObject] = ()) -> None:
        self.cond = threading.Condition()
        self.version = 100
        self.nodes: dict[str, JsonObject] = {}
        self.pods: dict[str, JsonObject] = {}
        self.log: list[tuple[int, str, str, JsonObject]] = []
        self.last_version = dict.fromkeys(KINDS, "")
        self.compacted = 0
        self.generation = 0
        self.paused = False
        self.list_calls = dict.fromkeys(KINDS, 0)
        self.fail_binding: WriteFault | None = None
        self.bind_then_fail: WriteFault | None = None  # the Binding is created, then the call fails
        self.events: dict[str, JsonObject] = {}  # events.k8s.io/v1 Events by namespace/name
        self.fail_events: WriteFault | None = None
        for obj in nodes:
            self.put_node(obj)
        for obj in pods:
            self.put_pod(obj)

    # -- cluster changes --------------------------------------------------------------------------

    def put_node(self, node: JsonObject) -> None:
        """Create or replace a Node."""
        with self.cond:
            name = node["metadata"]["name"]
            kind = "MODIFIED" if name in self.nodes else "ADDED"
            self.nodes[name] = copy.deepcopy(node)
            self._record("Node", kind, self.nodes[name])

    def delete_node(self, name: str) -> None:
        """Delete a Node."""
        with self.cond:
            self._record("Node", "DELETED", self.nodes.pop(name))

    def put_pod(self, pod: JsonObject) -> None:
        """Create or replace a Pod."""
        with self.cond:
            key = pod_key(pod)
            kind = "MODIFIED" if key in self.pods else "ADDED"
            self.pods[key] = copy.deepcopy(pod)
            self._record("Pod", kind, self.pods[key])

    def delete_pod(self, key: str) -> JsonObject | None:
        """Delete a Pod (None when it does not exist)."""
        with self.cond:
            pod = self.pods.pop(key, None)
            if pod is not None:
                self._record("Pod", "DELETED", pod)
            return pod

    def pod(self, key: str) -> JsonObject:
        """A copy of the current Pod."""
        with self.cond:
            return copy.deepcopy(self.pods[key])

    def objects(self) -> tuple[list[JsonObject], list[JsonObject]]:
        """Copies of every Node and Pod."""
        with self.cond:
            return copy.deepcopy(list(self.nodes.values())), copy.deepcopy(list(self.pods.values()))

    def _record(self, kind: str, event: str, obj: JsonObject) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.log.append((self.version, kind, event, copy.deepcopy(obj)))
        self.last_version[kind] = str(self.version)
        self.cond.notify_all()

    # -- faults -----------------------------------------------------------------------------------

    def drop_watches(self) -> None:
        """Every open watch ends with a connection error."""
        with self.cond:
            self.generation += 1
            self.cond.notify_all()

    def compact(self) -> None:
        """Forget history up to now and drop the watches: re-watching from any older version gets 410.

        The version moves on first, as other kinds of objects in a real cluster keep changing, so
        every kind's last seen version is behind.
        """
        with self.cond:
            self.version += 1
            self.compacted = self.version
            self.drop_watches()

    def pause(self) -> None:
        """Hold back watch delivery (the informer lags)."""
        with self.cond:
            self.paused = True

    def resume(self) -> None:
        """Deliver what was held back."""
        with self.cond:
            self.paused = False
            self.cond.notify_all()

    # -- KubeApi ----------------------------------------------------------------------------------

    def list_nodes(self) -> ObjectList:
        return self._list("Node", self.nodes)

    def list_pods(self) -> ObjectList:
        return self._list("Pod", self.pods)

    def watch_nodes(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        return self._watch("Node", resource_version)

    def watch_pods(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        return self._watch("Pod", resource_version)

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        with self.cond:
            pod = self._existing(namespace, name)
            merged = dict(pod["metadata"].get("annotations") or {})
            for key, value in annotations.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
            pod["metadata"]["annotations"] = merged
            self._record("Pod", "MODIFIED", pod)

    def create_binding(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        """Like the Binding subresource: nodeName and annotations in one change, or neither."""
        with self.cond:
            self._fault(self.fail_binding, namespace, name)
            pod = self._existing(namespace, name)
            if uid and pod["metadata"]["uid"] != uid:
                raise ApiException(status=409, reason="Conflict: uid precondition failed")
            if pod["spec"].get("nodeName"):
                raise ApiException(status=409, reason=f"Conflict: already assigned to {pod['spec']['nodeName']}")
            pod["spec"]["nodeName"] = node
            pod["metadata"]["annotations"] = {**(pod["metadata"].get("annotations") or {}), **annotations}
            self._record("Pod", "MODIFIED", pod)
            self._fault(self.bind_then_fail, namespace, name)

    def create_event(self, namespace: str, event: JsonObject) -> None:
        """Create an Event; 409 when one of that name exists."""
        with self.cond:
            name = event["metadata"]["name"]
            self._fault(self.fail_events, namespace, name)
            if f"{namespace}/{name}" in self.events:
                raise ApiException(status=409, reason=f'events.events.k8s.io "{name}" already exists')
            self.events[f"{namespace}/{name}"] = copy.deepcopy(event)

    def patch_event(self, namespace: str, name: str, patch: JsonObject) -> None:
        """Merge-patch an Event's top-level fields; 404 when it does not exist."""
        with self.cond:
            self._fault(self.fail_events, namespace, name)
            event = self.events.get(f"{namespace}/{name}")
            if event is None:
                raise ApiException(status=404, reason=f'events.events.k8s.io "{name}" not found')
            event.update(copy.deepcopy(patch))

    def events_on(self, key: str) -> list[JsonObject]:
        """Copies of the Events regarding the pod `key` (namespace/name), in creation order."""
        namespace, name = key.split("/", 1)
        with self.cond:
            found = [e for e in self.events.values() if e["metadata"]["namespace"] == namespace]
            return copy.deepcopy([e for e in found if e["regarding"]["name"] == name])

    # -- internals --------------------------------------------------------------------------------

    def _fault(self, fault: WriteFault | None, namespace: str, name: str) -> None:
        error = fault(namespace, name) if fault else None
        if error is not None:
            raise error

    def _existing(self, namespace: str, name: str) -> JsonObject:
        pod = self.pods.get(f"{namespace}/{name}")
        if pod is None:
            raise ApiException(status=404, reason=f'pods "{name}" not found')
        return pod

    def _list(self, kind: str, objects: dict[str, JsonObject]) -> ObjectList:
        with self.cond:
            self.list_calls[kind] += 1
            return ObjectList(copy.deepcopy(list(objects.values())), str(self.version))

    def _watch(self, kind: str, resource_version: str) -> WatchStream:
        with self.cond:
            if int(resource_version or 0) < self.compacted:
                raise ApiException(status=410, reason=f"Expired: too old resource version {resource_version}")
            return WatchStream(self, kind, int(resource_version or 0))


class WatchStream:
    """One open watch: the log after `since`, blocking for more, until closed or dropped."""

    def __init__(self, server: FakeApiServer, kind: str, since: int) -> None:
        self._server = server
        self._kind = kind
        self._since = since
        self._generation = server.generation
        self._closed = False
        self._cursor = next((i for i, entry in enumerate(server.log) if entry[0] > since), len(server.log))

    def __iter__(self) -> WatchStream:
        return self

    def __next__(self) -> dict[str, Any]:
        server = self._server
        with server.cond:
            while True:
                if self._closed:
                    raise StopIteration
                if server.generation != self._generation:
                    raise ProtocolError("connection reset (injected)")
                if not server.paused:
                    while self._cursor < len(server.log):
                        _, kind, event, obj = server.log[self._cursor]
                        self._cursor += 1
                        if kind == self._kind:
                            return {"type": event, "object": copy.deepcopy(obj)}
                server.cond.wait(0.05)

    def close(self) -> None:
        with self._server.cond:
            self._closed = True
            self._server.cond.notify_all()


class Extender:
    """A ClusterState fed by a KubernetesSource over the fake API server, and bound through it."""

    def __init__(self, server: FakeApiServer, settings: Settings | None = None, clock: FakeClock | None = None):
        self.server = server
        self.settings = settings or Settings()
        self.state = ClusterState(self.settings, **({"clock": clock} if clock else {}))
        self.source = KubernetesSource(
            server, self._apply, backoff_base=0.001, backoff_cap=0.01, sleep=lambda s: time.sleep(min(s, 0.01))
        )
        self.state.writer = self.source
        self.synced_count = 0

    def _apply(self, event: Event) -> None:
        self.state.apply(event)
        if isinstance(event, Synced):
            self.synced_count += 1

    def start(self) -> Extender:
        self.source.start()
        assert self.source.wait_synced(5)
        return self

    def stop(self) -> None:
        self.source.stop(timeout=2)

    def caught_up(self, timeout: float = 5.0) -> None:
        """Wait until every event the server logged has been applied to the state."""
        deadline = time.monotonic() + timeout
        while any(int(self.source.resource_version(k) or 0) < int(self.server.last_version[k] or 0) for k in KINDS):
            assert time.monotonic() < deadline, "the source did not catch up"
            time.sleep(0.005)
        with self.source.emit_lock:  # the event whose version was just recorded is applied too
            pass

    def relist(self, timeout: float = 5.0) -> None:
        """Expire the server's history and wait until both kinds have been listed and applied again."""
        target = self.synced_count + len(KINDS)
        self.server.compact()
        deadline = time.monotonic() + timeout
        while self.synced_count < target:
            assert time.monotonic() < deadline, "the source did not relist"
            time.sleep(0.005)

    def filter(self, key: str, candidates: list[str]) -> str | None:
        return self.state.decide_for_filter(self.server.pod(key), candidates)[0]

    def bind(self, key: str, node_name: str) -> None:
        obj = self.server.pod(key)
        meta = obj["metadata"]
        self.state.bind(meta["namespace"], meta["name"], meta["uid"], node_name)

    def assert_matches_rebuild(self) -> ClusterState:
        self.caught_up()
        return assert_matches_rebuild(self.state, *self.server.objects(), self.settings)


def launch(extenders: list[Extender], server: FakeApiServer, **kw) -> Extender:
    extender = Extender(server, **kw).start()
    extenders.append(extender)
    return extender
