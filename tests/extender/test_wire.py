"""The extender wire format against real kube-scheduler v1.28.4 captures (tests/data/extender-wire)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpupack.extender import wire
from gpupack.extender.wire import (
    ExtenderBindingResult,
    HostPriority,
    WireError,
    filter_error,
    filter_result,
    parse_binding_args,
    parse_extender_args,
    priorities_json,
)
from gpupack.kube.pod_request import request_from_pod
from tests.wire_captures import CAPTURES, args_files, bind_files, load, response_for


def capture_id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def test_captures_are_present() -> None:
    folders = {p.parent.name for p in args_files() + bind_files()}
    assert folders == {"nodeCacheCapable-true", "nodeCacheCapable-false", "nodeCacheCapable-true-errors"}, (
        CAPTURES
    )


@pytest.mark.parametrize("path", args_files(), ids=capture_id)
def test_every_captured_args_body_parses(path: Path) -> None:
    args = parse_extender_args(path.read_bytes())
    body = load(path)
    cache_capable = path.parent.name.startswith("nodeCacheCapable-true")
    assert args.node_cache_capable is cache_capable
    assert args.pod == body["Pod"]
    if cache_capable:
        assert args.nodes is None
        assert args.candidate_names() == body["NodeNames"]
    else:
        assert args.node_names is None
        assert args.nodes is not None and args.nodes.items == body["Nodes"]["items"]
        assert args.candidate_names() == [n["metadata"]["name"] for n in body["Nodes"]["items"]]
    request_from_pod(args.pod)


@pytest.mark.parametrize("path", bind_files(), ids=capture_id)
def test_every_captured_bind_body_parses(path: Path) -> None:
    args = parse_binding_args(path.read_bytes())
    body = load(path)
    assert (args.pod_name, args.pod_namespace, args.pod_uid, args.node) == (
        body["PodName"],
        body["PodNamespace"],
        body["PodUID"],
        body["Node"],
    )


FILTERS = [p for p in args_files() if "-filter-" in p.name]


@pytest.mark.parametrize("path", FILTERS, ids=capture_id)
def test_filter_answers_have_the_captured_shape(path: Path) -> None:
    args = parse_extender_args(path.read_bytes())
    captured = load(response_for(path))
    if captured["Error"]:
        ours = orjson.loads(filter_error(captured["Error"]).to_json())
        # kube-scheduler stops at Error; Go decodes the captured nulls and our empty maps alike
        assert ours == {"FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": captured["Error"]}
        return
    if args.node_cache_capable:
        passed = captured["NodeNames"]
    else:
        passed = [item["metadata"]["name"] for item in captured["Nodes"]["items"]]
    result = filter_result(args, passed, captured["FailedNodes"], captured["FailedAndUnresolvableNodes"])
    assert orjson.loads(result.to_json()) == captured


@pytest.mark.parametrize("path", [p for p in args_files() if "-prioritize-" in p.name], ids=capture_id)
def test_prioritize_answers_have_the_captured_shape(path: Path) -> None:
    captured = load(response_for(path))
    priorities = [HostPriority(host=entry["Host"], score=entry["Score"]) for entry in captured]
    assert orjson.loads(priorities_json(priorities)) == captured


@pytest.mark.parametrize("path", bind_files(), ids=capture_id)
def test_bind_answers_have_the_captured_shape(path: Path) -> None:
    captured = load(response_for(path))
    assert orjson.loads(ExtenderBindingResult(error=captured["Error"]).to_json()) == captured


@pytest.mark.parametrize("path", [p for p in args_files() if "nodeCacheCapable-true" in str(p)], ids=capture_id)
def test_captured_node_names_stay_in_their_bytes(path: Path) -> None:
    args = parse_extender_args(path.read_bytes())
    assert args.name_array is not None and args.node_names is None
    assert args.candidate_names() == load(path)["NodeNames"]


names_st = st.lists(st.one_of(st.sampled_from(["a", "node-1", "x.y", ","]), st.text(max_size=5)), max_size=6)
pods_st = st.one_of(
    st.just({"metadata": {"name": "p"}}),
    st.just({"metadata": {"name": "p", "labels": {"NodeNames": '["z"]}'}}}),  # the key inside the Pod
    st.just(None),
    st.dictionaries(st.text(max_size=4), st.integers(-1000, 1000), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(
    pod=pods_st,
    names=names_st,
    layout=st.sampled_from(["last", "first", "twice", "spaced", "nodes-too", "garbage", "cut", "only"]),
)
def test_the_bytes_path_reads_every_body_as_the_general_path_does(pod: object, names: list[str], layout: str) -> None:
    """parse_extender_args keeps NodeNames in its bytes only when that is exactly what orjson would read."""
    p, n = orjson.dumps(pod), orjson.dumps(names)
    body = {
        "last": b'{"Pod":' + p + b',"Nodes":null,"NodeNames":' + n + b"}",
        "first": b'{"NodeNames":' + n + b',"Pod":' + p + b',"Nodes":null}',
        "twice": b'{"Pod":' + p + b',"NodeNames":["dup"],"Nodes":null,"NodeNames":' + n + b"}",
        "spaced": b'{ "Pod" : ' + p + b' ,\n "Nodes" : null ,\n "NodeNames" :\n ' + n + b" }\n",
        "nodes-too": b'{"Pod":' + p + b',"Nodes":{"items":[]},"NodeNames":' + n + b"}",
        "garbage": b'{"Pod":' + p + b',"Nodes":null,"NodeNames":' + n + b"}x",
        "cut": b'{"Pod":' + p + b',"Nodes":null,"NodeNames":' + n,
        "only": b'{"NodeNames":' + n + b"}",
    }[layout]
    try:
        general = wire._parse(body, wire.ExtenderArgs)
    except WireError:
        general = None
    try:
        args = parse_extender_args(body)
    except WireError:
        args = None
    if general is None or (general.nodes is None) == (general.node_names is None):
        assert args is None
        return
    assert args is not None and args.pod == general.pod and args.nodes == general.nodes
    assert args.candidate_names() == general.candidate_names()


def test_filter_keeps_candidate_order_and_rejects_strangers() -> None:
    args = parse_extender_args(b'{"Pod": {}, "Nodes": null, "NodeNames": ["a", "b", "c"]}')
    assert filter_result(args, ["c", "a"]).node_names == ["a", "c"]
    with pytest.raises(ValueError, match=r"\['z'\] were not candidates"):
        filter_result(args, ["z"])


def test_empty_filter_answer_keeps_its_form() -> None:
    by_name = parse_extender_args(b'{"Pod": {}, "Nodes": null, "NodeNames": ["a"]}')
    assert orjson.loads(filter_result(by_name, []).to_json())["NodeNames"] == []
    by_object = parse_extender_args(
        b'{"Pod": {}, "Nodes": {"metadata": {}, "items": [{"metadata": {"name": "a"}}]}, "NodeNames": null}'
    )
    assert orjson.loads(filter_result(by_object, []).to_json())["Nodes"] == {"metadata": {}, "items": []}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "malformed JSON"),
        (b"{", "malformed JSON"),
        (b"\xff", "malformed JSON"),
        (b"[]", "must be a JSON object, got list"),
        (b"null", "must be a JSON object, got NoneType"),
        (b'{"Nodes": null, "NodeNames": ["a"]}', "Pod: Field required"),
        (b'{"Pod": null, "Nodes": null, "NodeNames": ["a"]}', "Pod: Input should be a valid dictionary"),
        (
            b'{"Pod": {}, "Nodes": null, "NodeNames": null}',
            "exactly one of Nodes and NodeNames .* got neither",
        ),
        (b'{"Pod": {}}', "got neither"),
        (b'{"Pod": {}, "Nodes": {"items": []}, "NodeNames": []}', "got both"),
        (b'{"Pod": {}, "Nodes": null, "NodeNames": [1]}', "NodeNames.0: Input should be a valid string"),
        (
            b'{"Pod": {}, "Nodes": {"items": "x"}, "NodeNames": null}',
            "Nodes.items: Input should be a valid list",
        ),
        (
            b'{"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}, "NodeNames": null}',
            r"Nodes.items\[0\] has no metadata.name",
        ),
    ],
)
def test_bad_args_bodies(body: bytes, reason: str) -> None:
    with pytest.raises(WireError, match=reason):
        parse_extender_args(body)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"PodName": "p", "PodNamespace": "ns", "PodUID": "u"}', "Node: Field required"),
        (
            b'{"PodName": 3, "PodNamespace": "ns", "PodUID": "u", "Node": "n"}',
            "PodName: Input should be a valid string",
        ),
        (b"{}", r"PodName: Field required; .* \(and 1 more\)"),
        (b"nope", "malformed JSON"),
    ],
)
def test_bad_bind_bodies(body: bytes, reason: str) -> None:
    with pytest.raises(WireError, match=reason):
        parse_binding_args(body)


@pytest.mark.parametrize("score", [-1, 11])
def test_scores_stay_in_the_extender_range(score: int) -> None:
    with pytest.raises(ValidationError):
        HostPriority(host="a", score=score)
