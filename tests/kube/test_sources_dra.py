"""ResourceSlices, ResourceClaims and DeviceClasses (#30) from every source: the official client asks for the
newest version the cluster serves (v1 from 1.34, v1beta2/v1beta1 on 1.33), KubernetesSource lists and watches
them without gating ``Synced`` (a cluster without resource.k8s.io answers 404, retried quietly), and a cluster
file carries them."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.kube.objects import make_node as bare_node
from gpupack.kube.sources import (
    DRA_KINDS,
    ClusterFileSource,
    DraApi,
    DraDeleted,
    DraKind,
    DraUpserted,
    JsonObject,
    KubernetesSource,
    ObjectList,
    SourceError,
    Synced,
    load_cluster_objects,
)
from gpupack.kube.sources.events import dra_key
from tests.fake_apiserver import FakeApiServer, WatchStream
from tests.kube.dra_bodies import claim, device_class, h100_full
from tests.kube.test_sources_groups import Events, list_or_watch
from tests.kube.test_sources_helpers import make_node, make_pod
from tests.kube.test_sources_official_api import CannedHttpApiServer, OpenStream, lines, official, strip

SLICES, CLAIMS, CLASSES = DRA_KINDS
SOURCE_LOGGER = "gpupack.kube.sources.kubernetes_source"
NOT_FOUND = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}


class DraApiServer(FakeApiServer):
    """The fake API server with the three DRA kinds; while ``served`` is False every DRA list and watch
    answers 404, as a cluster without resource.k8s.io does."""

    def __init__(self, *args: Any, served: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.served = served
        self.dra: dict[str, dict[str, JsonObject]] = {kind.kind: {} for kind in DRA_KINDS}
        self.list_calls.update(dict.fromkeys(self.dra, 0))
        self.refused = dict.fromkeys(self.dra, 0)

    def put_dra(self, obj: JsonObject) -> None:
        """Create or replace a DRA object."""
        with self.cond:
            objects = self.dra[obj["kind"]]
            event = "MODIFIED" if dra_key(obj) in objects else "ADDED"
            objects[dra_key(obj)] = copy.deepcopy(obj)
            self._record(obj["kind"], event, objects[dra_key(obj)])

    def delete_dra(self, kind: str, key: str) -> None:
        """Delete a DRA object."""
        with self.cond:
            self._record(kind, "DELETED", self.dra[kind].pop(key))

    def list_dra(self, kind: DraKind) -> ObjectList:
        """The DraApi list: 404 unless served."""
        self._served_or_404(kind)
        return self._list(kind.kind, self.dra[kind.kind])

    def watch_dra(self, kind: DraKind, resource_version: str, timeout_seconds: int) -> WatchStream:
        """The DraApi watch: 404 unless served."""
        self._served_or_404(kind)
        return self._watch(kind.kind, resource_version)

    def _served_or_404(self, kind: DraKind) -> None:
        if not self.served:
            with self.cond:
                self.refused[kind.kind] += 1
            raise ApiException(status=404, reason="Not Found")


def running(server: DraApiServer, events: Events) -> KubernetesSource:
    source = KubernetesSource(server, events, backoff_base=0.01, backoff_cap=0.05, sleep=time.sleep)
    source.start()
    return source


def dra_events(events: Events) -> list[DraUpserted | DraDeleted]:
    return [e for e in events.events if isinstance(e, DraUpserted | DraDeleted)]


# --- the official client ----------------------------------------------------------------------


@pytest.fixture
def http() -> Iterator[CannedHttpApiServer]:
    fake = CannedHttpApiServer()
    yield fake
    fake.close()


def test_the_official_api_offers_dra(http: CannedHttpApiServer) -> None:
    assert isinstance(official(http), DraApi)


def test_list_dra_asks_v1_first_and_falls_back_to_what_a_133_cluster_serves(http: CannedHttpApiServer) -> None:
    """Kubernetes 1.33 serves resource.k8s.io v1beta2 and v1beta1, not v1: the list takes the newest served,
    gives its items that apiVersion, and the watch then uses it too."""
    body = h100_full("n1", version="v1beta2")
    http.routes["GET", "/apis/resource.k8s.io/v1/resourceslices"] = (404, NOT_FOUND)
    http.routes["GET", "/apis/resource.k8s.io/v1beta2/resourceslices"] = list_or_watch(
        {"metadata": {"resourceVersion": "40"}, "items": [strip(body)]},
        OpenStream(lines({"type": "DELETED", "object": body})),
    )
    api = official(http)
    listing = api.list_dra(SLICES)
    assert listing.items == [body] and listing.resource_version == "40"
    stream = api.watch_dra(SLICES, "40", 30)
    assert next(iter(stream)) == {"type": "DELETED", "object": body}
    stream.close()  # type: ignore[attr-defined]
    paths = [r["path"] for r in http.requests]
    assert paths == [
        "/apis/resource.k8s.io/v1/resourceslices",
        "/apis/resource.k8s.io/v1beta2/resourceslices",
        "/apis/resource.k8s.io/v1beta2/resourceslices",
    ]
    assert http.requests[-1]["query"]["watch"].lower() == "true"


@pytest.mark.parametrize("kind", DRA_KINDS, ids=lambda kind: kind.kind)
def test_list_dra_reads_v1_of_every_kind(http: CannedHttpApiServer, kind: DraKind) -> None:
    obj = {
        "ResourceSlice": h100_full("n1"),
        "ResourceClaim": claim("c", [("n1", "gpu-0")]),
        "DeviceClass": device_class(),
    }
    item = obj[kind.kind]
    http.routes["GET", f"/apis/resource.k8s.io/v1/{kind.plural}"] = (
        200,
        {"metadata": {"resourceVersion": "7"}, "items": [strip(item)]},
    )
    assert official(http).list_dra(kind).items == [item]


def test_a_cluster_without_resource_k8s_io_is_a_404(http: CannedHttpApiServer) -> None:
    for version in CLAIMS.versions:
        http.routes["GET", f"/apis/resource.k8s.io/{version}/resourceclaims"] = (404, NOT_FOUND)
    with pytest.raises(ApiException) as listed:
        official(http).list_dra(CLAIMS)
    assert listed.value.status == 404
    assert len(http.requests) == 3  # v1, v1beta2, v1beta1


def test_a_denied_list_is_not_taken_for_an_unserved_version(http: CannedHttpApiServer) -> None:
    http.routes["GET", "/apis/resource.k8s.io/v1/deviceclasses"] = (403, {"kind": "Status", "code": 403})
    with pytest.raises(ApiException) as listed:
        official(http).list_dra(CLASSES)
    assert listed.value.status == 403 and len(http.requests) == 1


# --- KubernetesSource: list and watch -----------------------------------------------------------


def test_list_and_watch_of_the_three_kinds_give_dra_events() -> None:
    server = DraApiServer([make_node("n1")])
    server.put_dra(h100_full("n1"))
    server.put_dra(device_class())
    events = Events()
    source = running(server, events)
    try:
        assert source.wait_synced(5)
        events.wait_for(lambda e: isinstance(e, DraUpserted) and e.kind == "DeviceClass")
        events.wait_for(lambda e: isinstance(e, DraUpserted) and e.kind == "ResourceSlice")
        server.put_dra(claim("train", [("n1", "gpu-0")]))
        server.delete_dra("ResourceSlice", "n1-gpu")
        events.wait_for(lambda e: isinstance(e, DraDeleted))
        events.wait_for(lambda e: isinstance(e, DraUpserted) and e.kind == "ResourceClaim")
    finally:
        source.stop()
    seen = {(type(e).__name__, e.kind, e.key, e.uid) for e in dra_events(events)}
    assert seen == {
        ("DraUpserted", "ResourceSlice", "n1-gpu", "uid-slice-n1-gpu"),
        ("DraUpserted", "DeviceClass", "gpu.nvidia.com", "uid-class-gpu.nvidia.com"),
        ("DraUpserted", "ResourceClaim", "ml/train", "uid-claim-train"),
        ("DraDeleted", "ResourceSlice", "n1-gpu", "uid-slice-n1-gpu"),
    }
    for kind in DRA_KINDS:
        assert source.resource_version(kind.kind) == server.last_version[kind.kind]


def test_a_relist_deletes_the_claims_that_vanished_while_the_watch_was_down() -> None:
    server = DraApiServer([make_node("n1")])
    server.put_dra(claim("a", [("n1", "gpu-0")]))
    server.put_dra(claim("b", [("n1", "gpu-1")]))
    events = Events()
    source = running(server, events)
    try:
        assert source.wait_synced(5)
        events.wait_for(lambda e: isinstance(e, DraUpserted) and e.key == "ml/b")
        server.pause()
        server.delete_dra("ResourceClaim", "ml/a")
        server.compact()
        server.resume()
        gone = events.wait_for(lambda e: isinstance(e, DraDeleted))
    finally:
        source.stop()
    assert gone == DraDeleted("ResourceClaim", "ml/a", "uid-claim-a")


def test_a_cluster_without_dra_syncs_and_picks_it_up_once_served(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=SOURCE_LOGGER)
    server = DraApiServer([make_node("n1")], [make_pod("train", node="n1")], served=False)
    events = Events()
    source = running(server, events)
    try:
        assert source.wait_synced(5)
        deadline = time.monotonic() + 5
        while server.refused["ResourceSlice"] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.refused["ResourceSlice"] >= 3  # retried with the backoff
        server.served = True
        server.put_dra(h100_full("n1"))
        late = events.wait_for(lambda e: isinstance(e, DraUpserted) and e.kind == "ResourceSlice")
    finally:
        source.stop()
    assert isinstance(late, DraUpserted) and late.key == "n1-gpu"
    assert [type(e) for e in events.events].count(Synced) >= 1
    for kind in DRA_KINDS:
        told = [r for r in caplog.records if "is not served" in r.getMessage() and r.getMessage().startswith(kind.kind)]
        assert len(told) == 1 and told[0].levelno == logging.INFO
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


# --- the cluster file ----------------------------------------------------------------------------


def test_a_cluster_file_emits_its_dra_objects(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "cluster.yaml"
    bare_claim = claim("train", [("n1", "gpu-0")])
    del bare_claim["metadata"]["namespace"], bare_claim["metadata"]["uid"]
    other = {"apiVersion": "example.com/v1", "kind": "ResourceSlice", "metadata": {"name": "x"}}
    path.write_text(
        yaml.safe_dump([make_node("n1"), h100_full("n1", version="v1beta1"), bare_claim, device_class(), other])
    )
    events = Events()
    ClusterFileSource(path, events).start()
    seen = [(e.kind, e.key) for e in dra_events(events) if isinstance(e, DraUpserted)]
    assert seen == [("ResourceSlice", "n1-gpu"), ("ResourceClaim", "default/train"), ("DeviceClass", "gpu.nvidia.com")]
    assert all(isinstance(e, DraUpserted) and e.uid for e in dra_events(events))
    assert isinstance(events.events[-1], Synced)
    assert len(load_cluster_objects(path).dra) == 3
    assert "item 4: kind ResourceSlice of example.com ignored" in caplog.text


def test_a_cluster_file_names_each_dra_object_once(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump([claim("c", namespace="a"), claim("c", namespace="b")]))
    assert len(load_cluster_objects(path).dra) == 2
    path.write_text(yaml.safe_dump([h100_full("n1"), h100_full("n1")]))
    with pytest.raises(SourceError, match=r"duplicate ResourceSlice n1-gpu"):
        load_cluster_objects(path)
    nameless = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {}}
    path.write_text(yaml.safe_dump([nameless]))
    with pytest.raises(SourceError, match=r"DeviceClass without metadata\.name"):
        load_cluster_objects(path)


def test_a_cluster_file_with_a_dra_node_serves_its_gpus(tmp_path: Path) -> None:
    """Through the whole service state: the file's slices make the node a DRA node with their GPUs, and its
    claim holds two of them."""
    path = tmp_path / "cluster.yaml"
    node = bare_node("n1", product=None)
    path.write_text(yaml.safe_dump([node, h100_full("n1"), claim("c", [("n1", "gpu-0"), ("n1", "gpu-1")])]))
    state = ClusterState(Settings())
    ClusterFileSource(path, state.apply).start()
    assert state.ledger.inventory.gpus_total() == 8
    assert len(state.ledger.inventory.free_slots("n1")) == 6
