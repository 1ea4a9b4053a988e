"""ClusterFileSource: file shapes, events, in-memory writes, and clear errors for malformed files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpupack.kube.sources import (
    ClusterFileSource,
    NodeUpserted,
    PodUpserted,
    SourceError,
    Synced,
    load_cluster_objects,
)
from tests.kube.test_sources_helpers import Mirror, make_node, make_pod

NODES = [make_node("gpu-1"), make_node("gpu-2", gpus=4)]
PODS = [
    make_pod("train", node="gpu-1"),
    make_pod("pending", node=None, namespace="ml"),
    make_pod("finished", phase="Succeeded"),
]
ASSIGNED = {"gpupack.io/assignment": '{"node": "gpu-2", "gpus": [{"index": 0}]}'}


def write(tmp_path: Path, name: str, content: object) -> Path:
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content)
    elif name.endswith(".json"):
        path.write_text(json.dumps(content))
    else:
        path.write_text(yaml.safe_dump(content))
    return path


def started(path: Path) -> tuple[ClusterFileSource, Mirror]:
    mirror = Mirror()
    source = ClusterFileSource(path, mirror)
    source.start()
    return source, mirror


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("list.yaml", [*NODES, *PODS]),
        ("list.json", [*NODES, *PODS]),
        ("kind-list.yaml", {"apiVersion": "v1", "kind": "List", "items": [*NODES, *PODS]}),
        ("kind-list.json", {"apiVersion": "v1", "kind": "List", "items": [*NODES, *PODS]}),
        ("multi.yaml", "\n---\n".join(yaml.safe_dump(obj) for obj in [*NODES, *PODS])),
        ("mixed.yaml", yaml.safe_dump(NODES) + "---\n" + yaml.safe_dump({"kind": "List", "items": PODS})),
    ],
)
def test_file_shapes_give_the_same_picture(tmp_path: Path, name: str, content: object) -> None:
    source, mirror = started(write(tmp_path, name, content))
    assert source.wait_synced(0)
    mirror.assert_equals_fresh_list(NODES, PODS)
    assert mirror.events[-1] == Synced() and mirror.synced_count == 1
    assert [type(e) for e in mirror.events[:2]] == [NodeUpserted, NodeUpserted]


def test_typed_lists_lend_their_kind_to_items(tmp_path: Path) -> None:
    bare_nodes = [{"metadata": node["metadata"], "status": node["status"]} for node in NODES]
    path = write(tmp_path, "typed.yaml", {"kind": "NodeList", "apiVersion": "v1", "items": bare_nodes})
    objects = load_cluster_objects(path)
    assert [node["kind"] for node in objects.nodes] == ["Node", "Node"]


def test_other_kinds_are_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    with caplog.at_level(logging.WARNING):
        _, mirror = started(write(tmp_path, "c.yaml", [NODES[0], config_map]))
    assert list(mirror.nodes) == ["gpu-1"]
    assert "kind ConfigMap ignored" in caplog.text and "item 1" in caplog.text


def test_defaults_namespace_and_stable_uid(tmp_path: Path) -> None:
    bare = {"kind": "Pod", "metadata": {"name": "bare"}, "spec": {"containers": []}}
    first = load_cluster_objects(write(tmp_path, "a.yaml", [bare])).pods[0]
    second = load_cluster_objects(write(tmp_path, "b.yaml", [bare])).pods[0]
    assert first["metadata"]["namespace"] == "default"
    assert first["metadata"]["uid"] and first["metadata"]["uid"] == second["metadata"]["uid"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[a: b\n", "not valid YAML"),
        ("42\n", "expected a list of objects"),
        (yaml.safe_dump([NODES[0], "oops"]), "item 1: expected an object"),
        (yaml.safe_dump([NODES[0], {"metadata": {"name": "x"}}]), "item 1: missing kind"),
        (yaml.safe_dump([{"kind": "Pod", "metadata": {}}]), "item 0: Pod without metadata.name"),
        (yaml.safe_dump([NODES[0], NODES[0]]), "item 1: duplicate Node gpu-1 (first at item 0)"),
        (yaml.safe_dump([{"kind": "Pod", "metadata": {"name": "p"}, "spec": []}]), "spec must be an object"),
        (yaml.safe_dump(NODES[0]) + "---\n" + yaml.safe_dump(["x"]), "document 1, item 0"),
    ],
)
def test_malformed_files_name_file_and_item(tmp_path: Path, content: str, message: str) -> None:
    path = write(tmp_path, "bad.yaml", content)
    with pytest.raises(SourceError) as info:
        ClusterFileSource(path, Mirror())
    assert str(path) in str(info.value)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_bad_json_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="not valid JSON"):
        load_cluster_objects(write(tmp_path, "bad.json", "{"))
    with pytest.raises(SourceError, match="cannot read"):
        load_cluster_objects(tmp_path / "nope.yaml")


def test_create_binding_sets_node_name_and_annotations_and_emits(tmp_path: Path) -> None:
    source, mirror = started(write(tmp_path, "c.yaml", [*NODES, *PODS]))
    held = mirror.pods["ml/pending"]
    source.create_binding("ml", "pending", "uid-pod-ml-pending", "gpu-2", ASSIGNED)
    event = mirror.events[-1]
    assert isinstance(event, PodUpserted) and event.key == "ml/pending"
    assert event.pod["spec"]["nodeName"] == "gpu-2"
    assert event.pod["metadata"]["annotations"] == ASSIGNED
    assert held["metadata"].get("annotations") is None  # what the consumer held was not mutated
    assert mirror.errors == []
    assert [p["spec"].get("nodeName") for p in source.pods if p["metadata"]["name"] == "pending"] == ["gpu-2"]


@pytest.mark.parametrize(
    ("namespace", "name", "uid", "status"),
    [
        ("ml", "ghost", "u", 404),
        ("ml", "pending", "uid-of-someone-else", 409),
        ("default", "train", "uid-pod-default-train", 409),  # already bound to gpu-1
    ],
)
def test_create_binding_fails_like_the_api_server(
    tmp_path: Path, namespace: str, name: str, uid: str, status: int
) -> None:
    source, mirror = started(write(tmp_path, "c.yaml", [*NODES, *PODS]))
    before = len(mirror.events)
    with pytest.raises(ApiException) as info:
        source.create_binding(namespace, name, uid, "gpu-2", ASSIGNED)
    assert info.value.status == status
    assert len(mirror.events) == before
    assert all("gpupack.io/assignment" not in (p["metadata"].get("annotations") or {}) for p in source.pods)


def test_writes_before_start_show_up_in_the_initial_picture(tmp_path: Path) -> None:
    mirror = Mirror()
    source = ClusterFileSource(write(tmp_path, "c.yaml", [*NODES, *PODS]), mirror)
    assert not source.wait_synced(0)
    source.create_binding("ml", "pending", "", "gpu-2", {})
    assert mirror.events == []
    source.start()
    assert mirror.pods["ml/pending"]["spec"]["nodeName"] == "gpu-2"
    source.stop()
