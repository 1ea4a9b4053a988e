"""Replay every captured kube-scheduler request (tests/wire_captures.py) against the app, in order.

Each capture folder gets a fresh cluster file holding the captured nodes (gpu-node-a/b/c) and the
captured pods, still pending; binds are applied as they come, so later requests see earlier pods
bound. gpupack's answers differ from the mini extender's (it decides in filter), but their shape
must be the captured one.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from gpupack.extender.app import create_app
from gpupack.extender.settings import Settings
from gpupack.extender.warm_up import warm_up
from tests import wire_captures
from tests.extender_helpers import file_state, write_cluster

FOLDERS = sorted({p.parent for p in wire_captures.request_files()})


def cluster_objects(folder: Path) -> list[dict[str, Any]]:
    """Captured nodes plus every pod the folder's requests carry, unbound."""
    pods: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.request.json")):
        body = wire_captures.load(path)
        if "Pod" in body:
            obj = copy.deepcopy(body["Pod"])
            obj.update(kind="Pod", apiVersion="v1")
            obj["spec"].pop("nodeName", None)
            pods.setdefault(obj["metadata"]["name"], obj)
    nodes = []
    for item in wire_captures.captured_nodes().values():
        obj = copy.deepcopy(item)
        obj.update(kind="Node", apiVersion="v1")
        nodes.append(obj)
    return [*nodes, *pods.values()]


@pytest.mark.parametrize("report_not_chosen", [True, False], ids=["default", "reportNotChosen-false"])
@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_replay_captures_in_order(folder: Path, report_not_chosen: bool, tmp_path: Path) -> None:
    settings = Settings(report_not_chosen=report_not_chosen)
    state, source = file_state(write_cluster(tmp_path / "cluster.yaml", cluster_objects(folder)), settings)
    warm_up(state)
    client = TestClient(create_app(state, settings))
    for path in sorted(folder.glob("*.request.json")):
        verb = path.name.split("-")[1]
        raw = path.read_bytes()
        request = orjson.loads(raw)
        captured = wire_captures.load(wire_captures.response_for(path))
        response = client.post(f"/{verb}", content=raw, headers={"Content-Type": "application/json"})
        assert response.status_code == 200, (path.name, response.text)
        assert response.headers["content-type"] == "application/json"
        body = response.json()
        if verb == "filter":
            check_filter(request, body, captured, report_not_chosen)
        elif verb == "prioritize":
            names = request["NodeNames"] or [n["metadata"]["name"] for n in request["Nodes"]["items"]]
            assert [p["Host"] for p in body] == names
            assert all(set(p) == {"Host", "Score"} and 0 <= p["Score"] <= 10 for p in body)
            assert max(p["Score"] for p in body) == 10
        else:
            assert body == {"Error": ""}, path.name
            assert set(body) == set(captured)
            pod = next(p for p in source.pods if p["metadata"]["name"] == request["PodName"])
            assert pod["spec"]["nodeName"] == request["Node"]
            assert orjson.loads(pod["metadata"]["annotations"]["gpupack.io/assignment"])["node"] == request["Node"]
    # every bind was confirmed by the (in-memory) informer; only never-bound pods stay reserved
    names = [p.name.split("-", 2)[2].removesuffix(".request.json") for p in folder.glob("*.request.json")]
    bound = {n for p, n in zip(folder.glob("*.request.json"), names, strict=True) if "-bind-" in p.name}
    assert state.snapshot().reservations == {"assumed": len(set(names) - bound), "binding": 0}


def check_filter(request: dict[str, Any], body: dict[str, Any], captured: dict[str, Any], every_node: bool) -> None:
    cache_capable = request["NodeNames"] is not None
    candidates = request["NodeNames"] if cache_capable else [n["metadata"]["name"] for n in request["Nodes"]["items"]]
    assert body["Error"] == ""
    assert isinstance(body["FailedNodes"], dict) and isinstance(body["FailedAndUnresolvableNodes"], dict)
    if cache_capable:
        assert "Nodes" not in body and isinstance(body["NodeNames"], list)
        passed = body["NodeNames"]
    else:
        assert "NodeNames" not in body and set(body["Nodes"]) == {"metadata", "items"}
        passed = [item["metadata"]["name"] for item in body["Nodes"]["items"]]
        originals = {n["metadata"]["name"]: n for n in request["Nodes"]["items"]}
        assert all(item == originals[item["metadata"]["name"]] for item in body["Nodes"]["items"])
    # decide in filter: exactly one node passes; the infeasible candidates are named with a reason (here
    # every node fits, so none), and with reportNotChosen every other candidate too
    assert len(passed) == 1
    rejected = set(body["FailedNodes"]) | set(body["FailedAndUnresolvableNodes"])
    assert not rejected & set(passed)
    assert rejected | set(passed) == (set(candidates) if every_node else set(passed))
    assert all(isinstance(reason, str) and reason for reason in body["FailedNodes"].values())
    assert set(captured) >= {"Error"}
