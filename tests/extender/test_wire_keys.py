"""Wire keys are case-sensitive: a misspelt one is named with the key expected (#18 item 4)."""

from __future__ import annotations

import orjson
import pytest

from gpupack.extender.wire import WireError, parse_binding_args, parse_extender_args

POD = {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {"containers": []}}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"Pod": POD, "nodenames": ["a"]}, "'nodenames' should be 'NodeNames'"),
        ({"pod": POD, "NodeNames": ["a"]}, "'pod' should be 'Pod'"),  # NodeNames last: the fast path
        ({"pod": POD, "nodes": None, "nodenames": ["a"]}, "'pod' should be 'Pod', 'nodes' should be 'Nodes'"),
        ({"Pod": POD, "node_names": ["a"]}, "'node_names' should be 'NodeNames'"),
        ({"Pod": POD, "NODES": {"items": []}}, "'NODES' should be 'Nodes'"),
    ],
)
def test_lowercase_filter_keys_are_named(body: dict, named: str) -> None:
    with pytest.raises(WireError, match="keys are case-sensitive") as err:
        parse_extender_args(orjson.dumps(body))
    assert named in str(err.value)


def test_lowercase_bind_keys_are_named() -> None:
    body = {"podName": "p", "PodNamespace": "default", "PodUid": "u", "node": "n"}
    with pytest.raises(WireError, match="keys are case-sensitive") as err:
        parse_binding_args(orjson.dumps(body))
    assert "'podName' should be 'PodName'" in str(err.value) and "'PodUid' should be 'PodUID'" in str(err.value)


def test_the_right_keys_and_unrelated_extra_keys_still_parse() -> None:
    args = parse_extender_args(orjson.dumps({"Pod": POD, "Nodes": None, "NodeNames": ["a", "b"], "Extra": 1}))
    assert args.candidate_names() == ["a", "b"]
    bind = parse_binding_args(orjson.dumps({"PodName": "p", "PodNamespace": "d", "PodUID": "u", "Node": "n"}))
    assert bind.node == "n"
