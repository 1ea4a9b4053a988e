"""PodGroups (#29) from every source: the official client's calls, list and watch of both kinds by
KubernetesSource (a missing CRD neither blocks ``Synced`` nor floods the log, and is picked up once
installed), the PodGroups of a cluster file, and consumers that have no use for them."""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.kube.pods import pod_key
from gpupack.kube.sources import (
    POD_GROUP_KINDS,
    ClusterFileSource,
    Event,
    GroupApi,
    GroupDeleted,
    GroupUpserted,
    JsonObject,
    KubernetesSource,
    ObjectList,
    PodGroupKind,
    SourceError,
    Synced,
    load_cluster_objects,
)
from tests.fake_apiserver import FakeApiServer, WatchStream
from tests.kube.test_sources_helpers import make_node, make_pod
from tests.kube.test_sources_official_api import CannedHttpApiServer, OpenStream, lines, official, strip

X_K8S, VOLCANO = POD_GROUP_KINDS
SOURCE_LOGGER = "gpupack.kube.sources.kubernetes_source"


def make_group(
    name: str, kind: PodGroupKind = X_K8S, *, namespace: str = "ml", min_member: int = 4, rv: str = "1"
) -> JsonObject:
    """A PodGroup as the API server sends it."""
    return {
        "apiVersion": kind.api_version,
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{kind.group}-{namespace}-{name}",
            "resourceVersion": rv,
        },
        "spec": {"minMember": min_member},
    }


def source_kind(kind: PodGroupKind) -> str:
    """The name KubernetesSource gives the kind (its resource_version and log lines)."""
    return f"PodGroup.{kind.group}"


class GroupApiServer(FakeApiServer):
    """The fake API server with PodGroups of both kinds; a kind whose group is not in ``served`` answers
    404 to list and watch, as an API server without that CRD does."""

    def __init__(self, *args: Any, served: set[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.served = {kind.group for kind in POD_GROUP_KINDS} if served is None else served
        self.groups: dict[str, dict[str, JsonObject]] = {source_kind(kind): {} for kind in POD_GROUP_KINDS}
        self.list_calls.update(dict.fromkeys(self.groups, 0))
        self.refused = dict.fromkeys(self.groups, 0)  # 404s answered, by kind

    def put_group(self, group: JsonObject) -> None:
        """Create or replace a PodGroup."""
        with self.cond:
            objects = self.groups[f"PodGroup.{group['apiVersion'].split('/')[0]}"]
            event = "MODIFIED" if pod_key(group) in objects else "ADDED"
            objects[pod_key(group)] = copy.deepcopy(group)
            self._record(f"PodGroup.{group['apiVersion'].split('/')[0]}", event, objects[pod_key(group)])

    def delete_group(self, kind: PodGroupKind, key: str) -> None:
        """Delete a PodGroup."""
        with self.cond:
            self._record(source_kind(kind), "DELETED", self.groups[source_kind(kind)].pop(key))

    def list_pod_groups(self, kind: PodGroupKind) -> ObjectList:
        """The GroupApi list: 404 unless the kind is served."""
        self._served_or_404(kind)
        return self._list(source_kind(kind), self.groups[source_kind(kind)])

    def watch_pod_groups(self, kind: PodGroupKind, resource_version: str, timeout_seconds: int) -> WatchStream:
        """The GroupApi watch: 404 unless the kind is served."""
        self._served_or_404(kind)
        return self._watch(source_kind(kind), resource_version)

    def _served_or_404(self, kind: PodGroupKind) -> None:
        if kind.group not in self.served:
            with self.cond:
                self.refused[source_kind(kind)] += 1
            raise ApiException(status=404, reason="Not Found")


class Events:
    """A source consumer that keeps every event and lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._cond = threading.Condition()

    def __call__(self, event: Event) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait_for(self, matches: Callable[[Event], bool], timeout: float = 5.0) -> Event:
        """The first event that ``matches``, waiting up to ``timeout`` seconds for it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = next((event for event in self.events if matches(event)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                assert left > 0, f"no matching event in {self.events}"
                self._cond.wait(left)

    def groups(self) -> list[GroupUpserted | GroupDeleted]:
        """The group events, in order."""
        with self._cond:
            return [event for event in self.events if isinstance(event, GroupUpserted | GroupDeleted)]


def running(server: GroupApiServer, events: Events) -> KubernetesSource:
    """A started source over ``server`` with a quick backoff."""
    source = KubernetesSource(server, events, backoff_base=0.01, backoff_cap=0.05, sleep=time.sleep)
    source.start()
    return source


# --- the official client ----------------------------------------------------------------------


@pytest.fixture
def http() -> Iterator[CannedHttpApiServer]:
    fake = CannedHttpApiServer()
    yield fake
    fake.close()


def test_the_official_api_offers_groups(http: CannedHttpApiServer) -> None:
    assert isinstance(official(http), GroupApi)


@pytest.mark.parametrize("kind", POD_GROUP_KINDS, ids=lambda kind: kind.group)
def test_list_pod_groups_reads_every_namespace_and_gives_items_their_kind(
    http: CannedHttpApiServer, kind: PodGroupKind
) -> None:
    groups = [make_group(f"g{i}", kind, namespace=f"ns{i}") for i in range(3)]

    def pages(request: dict[str, Any]) -> tuple[int, Any]:
        if request["query"].get("continue") == "next":
            return 200, {"metadata": {"resourceVersion": "40"}, "items": [strip(groups[2])]}
        return 200, {"metadata": {"resourceVersion": "40", "continue": "next"}, "items": [strip(g) for g in groups[:2]]}

    http.routes["GET", f"/apis/{kind.group}/{kind.version}/podgroups"] = pages
    listing = official(http).list_pod_groups(kind)
    assert listing.items == groups
    assert listing.resource_version == "40"
    assert [r["query"].get("limit") for r in http.requests] == ["2", "2"]


@pytest.mark.parametrize("kind", POD_GROUP_KINDS, ids=lambda kind: kind.group)
def test_watch_pod_groups_yields_raw_events(http: CannedHttpApiServer, kind: PodGroupKind) -> None:
    group = make_group("train", kind, rv="41")
    mark = {"kind": "PodGroup", "apiVersion": kind.api_version, "metadata": {"resourceVersion": "45"}}
    stream = lines({"type": "ADDED", "object": group}, {"type": "BOOKMARK", "object": mark})
    http.routes["GET", f"/apis/{kind.group}/{kind.version}/podgroups"] = (200, stream)
    assert list(official(http).watch_pod_groups(kind, "40", 30)) == [
        {"type": "ADDED", "object": group},
        {"type": "BOOKMARK", "object": mark},
    ]
    query = http.requests[0]["query"]
    assert query["watch"].lower() == "true"
    assert query["allowWatchBookmarks"].lower() == "true"
    assert (query["resourceVersion"], query["timeoutSeconds"]) == ("40", "30")


def test_a_missing_crd_is_a_404(http: CannedHttpApiServer) -> None:
    not_found = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
    http.routes["GET", "/apis/scheduling.x-k8s.io/v1alpha1/podgroups"] = (404, not_found)
    with pytest.raises(ApiException) as listed:
        official(http).list_pod_groups(X_K8S)
    with pytest.raises(ApiException) as watched:
        next(iter(official(http).watch_pod_groups(X_K8S, "1", 30)))
    assert listed.value.status == watched.value.status == 404


def list_or_watch(listing: JsonObject, watch: OpenStream) -> Callable[[dict[str, Any]], tuple[int, Any]]:
    """A route answering a list with ``listing`` and a watch with the open stream ``watch``."""
    return lambda request: (200, watch if request["query"].get("watch") else listing)


def test_source_over_the_official_client_syncs_without_one_crd(http: CannedHttpApiServer) -> None:
    """Nodes, pods and Volcano's PodGroups are served, scheduler-plugins' are not: Synced comes, the
    served kind's groups arrive, and the other kind's list is asked again."""
    node, pod, group = make_node("gpu-1", "5"), make_pod("train", "6"), make_group("train", VOLCANO, rv="7")
    watches = [OpenStream(b"") for _ in range(3)]
    served = {"/api/v1/nodes": node, "/api/v1/pods": pod, "/apis/scheduling.volcano.sh/v1beta1/podgroups": group}
    for (path, obj), watch in zip(served.items(), watches, strict=True):
        http.routes["GET", path] = list_or_watch({"metadata": {"resourceVersion": "7"}, "items": [strip(obj)]}, watch)
    missing = "/apis/scheduling.x-k8s.io/v1alpha1/podgroups"
    http.routes["GET", missing] = (404, {"kind": "Status", "reason": "NotFound", "code": 404})
    events = Events()
    source = KubernetesSource(official(http), events, backoff_base=0.01, backoff_cap=0.05)
    source.start()
    try:
        assert source.wait_synced(5)
        upserted = events.wait_for(lambda e: isinstance(e, GroupUpserted))
        deadline = time.monotonic() + 5
        while sum(r["path"] == missing for r in http.requests) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        source.stop(timeout=3)
        for watch in watches:
            watch.release.set()
    assert isinstance(upserted, GroupUpserted)
    assert (upserted.api, upserted.key, upserted.uid) == ("scheduling.volcano.sh", "ml/train", group["metadata"]["uid"])
    assert upserted.group == group
    assert sum(r["path"] == missing for r in http.requests) >= 3


# --- KubernetesSource: list and watch -----------------------------------------------------------


def test_list_and_watch_of_both_kinds_give_group_events() -> None:
    server = GroupApiServer([make_node("gpu-1")])
    listed = make_group("train", X_K8S)
    server.put_group(listed)
    events = Events()
    source = running(server, events)
    try:
        assert source.wait_synced(5)
        events.wait_for(lambda e: isinstance(e, GroupUpserted) and e.key == "ml/train")
        server.put_group(make_group("train", VOLCANO, min_member=8))  # the same name in the other API group
        server.delete_group(X_K8S, "ml/train")
        events.wait_for(lambda e: isinstance(e, GroupDeleted))
        events.wait_for(lambda e: isinstance(e, GroupUpserted) and e.api == VOLCANO.group)
    finally:
        source.stop()
    seen = [(type(e).__name__, e.api, e.key, e.uid) for e in events.groups()]
    assert seen[0] == ("GroupUpserted", X_K8S.group, "ml/train", "uid-scheduling.x-k8s.io-ml-train")
    assert ("GroupDeleted", X_K8S.group, "ml/train", "uid-scheduling.x-k8s.io-ml-train") in seen
    assert ("GroupUpserted", VOLCANO.group, "ml/train", "uid-scheduling.volcano.sh-ml-train") in seen
    assert len(seen) == 3
    for kind in POD_GROUP_KINDS:
        assert source.resource_version(source_kind(kind)) == server.last_version[source_kind(kind)]


def test_a_relist_deletes_the_groups_that_vanished_while_the_watch_was_down() -> None:
    server = GroupApiServer([make_node("gpu-1")])
    server.put_group(make_group("a", VOLCANO))
    server.put_group(make_group("b", VOLCANO))
    events = Events()
    source = running(server, events)
    try:
        assert source.wait_synced(5)
        events.wait_for(lambda e: isinstance(e, GroupUpserted) and e.key == "ml/b")
        server.pause()
        server.delete_group(VOLCANO, "ml/a")
        server.compact()  # the re-watch gets 410: the source relists
        server.resume()
        gone = events.wait_for(lambda e: isinstance(e, GroupDeleted))
    finally:
        source.stop()
    assert gone == GroupDeleted("ml/a", "uid-scheduling.volcano.sh-ml-a", VOLCANO.group)


def test_a_missing_crd_does_not_block_synced_and_is_picked_up_once_installed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=SOURCE_LOGGER)
    server = GroupApiServer([make_node("gpu-1")], [make_pod("train")], served={VOLCANO.group})
    events = Events()
    source = running(server, events)
    try:
        assert source.wait_synced(5)
        deadline = time.monotonic() + 5
        while server.refused[source_kind(X_K8S)] < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.refused[source_kind(X_K8S)] >= 4  # retried with the backoff
        server.served.add(X_K8S.group)  # the CRD is installed
        server.put_group(make_group("late", X_K8S))
        late = events.wait_for(lambda e: isinstance(e, GroupUpserted) and e.key == "ml/late")
    finally:
        source.stop()
    assert isinstance(late, GroupUpserted) and late.api == X_K8S.group
    assert [type(e) for e in events.events].count(Synced) >= 1
    absent = [r for r in caplog.records if "is not served" in r.getMessage()]
    assert len(absent) == 1 and absent[0].levelno == logging.INFO
    assert source_kind(X_K8S) in absent[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_crd_removed_under_a_watch_is_listed_again_when_it_returns(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=SOURCE_LOGGER)
    server = GroupApiServer([make_node("gpu-1")])
    events = Events()
    source = running(server, events)
    try:
        assert source.wait_synced(5)
        time.sleep(0.05)
        server.served.discard(X_K8S.group)
        server.drop_watches()  # the CRD's deletion ends its watches; the re-watch gets 404
        deadline = time.monotonic() + 5
        while "is not served" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
        server.served.add(X_K8S.group)
        server.put_group(make_group("again", X_K8S))
        events.wait_for(lambda e: isinstance(e, GroupUpserted) and e.key == "ml/again")
    finally:
        source.stop()
    assert caplog.text.count("is not served") == 1
    assert server.list_calls[source_kind(X_K8S)] == 2  # listed again, not only watched again


class _NoGroupsApi(FakeApiServer):
    """An API without PodGroups at all (not a GroupApi)."""


def test_an_api_without_groups_gets_no_group_watches() -> None:
    server = _NoGroupsApi([make_node("gpu-1")])
    assert not isinstance(server, GroupApi)
    events = Events()
    source = KubernetesSource(server, events)
    source.start()
    try:
        assert source.wait_synced(5)
    finally:
        source.stop()
    with pytest.raises(StopIteration):
        source.resource_version(source_kind(X_K8S))


# --- the cluster file ----------------------------------------------------------------------------


def test_a_cluster_file_emits_its_pod_groups_of_both_kinds(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "cluster.yaml"
    bare = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": "job"}}
    other = {"apiVersion": "example.com/v1", "kind": "PodGroup", "metadata": {"name": "x"}}
    path.write_text(yaml.safe_dump([make_node("gpu-1"), make_group("train", X_K8S), bare, other]))
    events = Events()
    ClusterFileSource(path, events).start()
    groups = events.groups()
    assert [(e.api, e.key) for e in groups if isinstance(e, GroupUpserted)] == [
        ("scheduling.x-k8s.io", "ml/train"),
        ("scheduling.volcano.sh", "default/job"),
    ]
    assert all(isinstance(e, GroupUpserted) and e.uid for e in groups)
    assert isinstance(events.events[-1], Synced)
    assert len(load_cluster_objects(path).groups) == 2
    assert "item 3: kind PodGroup ignored (example.com/v1;" in caplog.text


def test_a_cluster_file_may_name_a_group_once_per_kind(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump([make_group("train", X_K8S), make_group("train", VOLCANO)]))
    assert len(load_cluster_objects(path).groups) == 2
    path.write_text(yaml.safe_dump([make_group("train", X_K8S), make_group("train", X_K8S)]))
    with pytest.raises(SourceError, match=r"duplicate PodGroup\.scheduling\.x-k8s\.io ml/train"):
        load_cluster_objects(path)
    nameless = {"apiVersion": X_K8S.api_version, "kind": "PodGroup", "metadata": {}}
    path.write_text(yaml.safe_dump([nameless]))
    with pytest.raises(SourceError, match=r"without metadata\.name"):
        load_cluster_objects(path)


# --- consumers without a use for groups --------------------------------------------------------


def test_the_ledger_and_the_budgets_pass_over_group_events(caplog: pytest.LogCaptureFixture) -> None:
    state = ClusterState(Settings())
    for event in (GroupUpserted(make_group("train")), GroupDeleted("ml/train", "uid", X_K8S.group)):
        state.ledger.apply(event)
        state.budgets.apply(event)
    assert state.ledger.counts() == (0, 0, 0) and len(state.budgets) == 0
    assert "could not" not in caplog.text
