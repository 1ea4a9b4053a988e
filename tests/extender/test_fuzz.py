"""Fuzzing the HTTP app: zero 5xx, and the state stays consistent whatever arrives.

hypothesis: random JSON for every verb, the real kube-scheduler captures (tests/data/extender-wire)
mutated at random paths, and random pods (random resources, quantities and annotations) that go
through filter and then bind. Cases generated from the published OpenAPI spec: tests/extender/test_fuzz_openapi.py.

"Consistent": after each test every held placement fits its node with no overlap, and the inventory
holds exactly the committed placements (a fresh inventory fed the same placements is identical), so
nothing leaked and nothing is counted twice. Examples are bounded so that the file runs well under 60 s.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupack.extender.app import create_app
from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.extender.warm_up import warm_up
from gpupack.scoring.inventory import Inventory
from tests.extender_helpers import A100, L4, assert_no_overlap, inventory_by_node, node, state_from
from tests.wire_captures import args_files, bind_files, captured_nodes, load

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
CAPTURED = captured_nodes()


def cluster() -> list[dict[str, Any]]:
    nodes = list(CAPTURED.values())  # the real Node objects of the captures: gpu-node-a, -b, -c
    nodes += [node(f"h100-{i}", mig="dynamic") for i in range(3)]
    nodes += [node(f"a100-{i}", A100, 8, static_mig={"1g.10gb": 7, "3g.40gb": 4}) for i in range(2)]
    return nodes + [node(f"l4-{i}", L4, 4) for i in range(3)]


NODES = cluster()
NAMES = [n["metadata"]["name"] for n in NODES]
CONFIG = Settings(max_body_bytes=256 * 1024, reservation_ttl_seconds=3600)


def warm_state() -> ClusterState:
    state = state_from(NODES, settings=CONFIG)
    warm_up(state)  # /readyz answers 503 until then, by design
    return state


@pytest.fixture(scope="module")
def served() -> tuple[TestClient, ClusterState]:
    state = warm_state()
    return TestClient(create_app(state, CONFIG)), state


def assert_consistent(state: ClusterState) -> None:
    """No overlap, nothing negative, and the inventory holds exactly the committed placements."""
    placements = list(state.placements().values())
    assert_no_overlap(NODES, placements)
    expected = Inventory()
    for obj in NODES:
        facts = state.inventory.facts[state.inventory.index[obj["metadata"]["name"]]]
        assert facts is not None
        expected.add_node(facts)
    for placement in placements:
        expected.commit(placement)
    with state.lock:
        assert inventory_by_node(state.inventory) == inventory_by_node(expected)


def post(client: TestClient, verb: str, body: bytes) -> Any:
    response = client.post(f"/{verb}", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code in (200, 400), (verb, response.status_code, response.text)
    return response.json()


# --- random JSON ------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63, max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=10)
    | st.sampled_from(NAMES),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
wire_keys = st.sampled_from(
    ["Pod", "Nodes", "NodeNames", "PodName", "PodNamespace", "PodUID", "Node", "items",
     "NodeNameToVictims", "NodeNameToMetaVictims", "Pods", "UID", "NumPDBViolations"]
)  # fmt: skip
wire_shaped = st.dictionaries(wire_keys, json_values, max_size=6)


@pytest.mark.slow
@FUZZ
@given(body=json_values | wire_shaped, verb=st.sampled_from(["filter", "prioritize", "preempt", "bind"]))
def test_random_json_never_5xx(served, body: Any, verb: str) -> None:
    client, state = served
    post(client, verb, json.dumps(body).encode())
    assert_consistent(state)


@pytest.mark.slow
@FUZZ
@given(raw=st.binary(max_size=300), verb=st.sampled_from(["filter", "prioritize", "preempt", "bind"]))
def test_random_bytes_never_5xx(served, raw: bytes, verb: str) -> None:
    client, state = served
    post(client, verb, raw)
    assert_consistent(state)


# --- mutated captures --------------------------------------------------------------------------------

CAPTURES = [(p.name.split("-")[1], load(p)) for p in [*args_files(), *bind_files()]]


def mutate(value: Any, rng: random.Random, replacement: Any) -> Any:
    """`value` with one random node of the tree deleted, replaced, retyped or duplicated."""
    value = copy.deepcopy(value)
    path: list[tuple[Any, Any]] = []
    here = value
    while isinstance(here, dict | list) and here and rng.random() < 0.8:
        key = rng.choice(list(here)) if isinstance(here, dict) else rng.randrange(len(here))
        path.append((here, key))
        here = here[key]
    if not path:
        return replacement
    parent, key = path[-1]
    action = rng.choice(["delete", "replace", "stringify", "duplicate", "nullify"])
    if action == "delete":
        del parent[key]
    elif action == "replace":
        parent[key] = replacement
    elif action == "stringify":
        parent[key] = json.dumps(parent[key])
    elif action == "duplicate" and isinstance(parent, list):
        parent.append(copy.deepcopy(parent[key]))
    else:
        parent[key] = None
    return value


@pytest.mark.slow
@FUZZ
@given(
    capture=st.sampled_from(CAPTURES),
    seeds=st.lists(st.integers(0, 2**32), min_size=1, max_size=4),
    replacement=json_values,
    truncate=st.none() | st.integers(0, 4000),
)
def test_mutated_captured_bodies_never_5xx(served, capture, seeds: list[int], replacement: Any, truncate) -> None:
    client, state = served
    verb, body = capture
    for seed in seeds:
        body = mutate(body, random.Random(seed), replacement)
    raw = json.dumps(body).encode()[:truncate]
    post(client, verb, raw)
    assert_consistent(state)


def test_unmutated_captures_are_all_answered_200(served) -> None:
    client, state = served
    for verb, body in CAPTURES:
        response = client.post(f"/{verb}", content=orjson.dumps(body))
        assert response.status_code == 200, (verb, response.text)
    assert_consistent(state)


# --- random pods through filter and bind --------------------------------------------------------------

RESOURCES = [
    "cpu",
    "memory",
    "nvidia.com/gpu",
    "gpupack.io/gpu-milli",
    "nvidia.com/mig-1g.10gb",
    "nvidia.com/mig-3g.40gb",
    "nvidia.com/mig-7g.80gb",
    "nvidia.com/mig-2g.12gb",
    "nvidia.com/mig-9g.99gb",
    "ephemeral-storage",
    "example.com/fpga",
]
quantities = (
    st.sampled_from(["0", "1", "2", "4", "8", "16", "250", "999", "1000", "100m", "1.5", "2Gi", "1e3", "-1", "1Ei"])
    | st.integers(-5, 2000).map(str)
    | st.integers(-5, 20)
    | st.text(max_size=6)
    | st.sampled_from(["99999999999999999999999", "1e400", "NaN", "", None])
)
resource_lists = st.dictionaries(st.sampled_from(RESOURCES), quantities, max_size=4)
containers = st.fixed_dictionaries(
    {"name": st.text(min_size=1, max_size=6)},
    optional={"resources": st.fixed_dictionaries({}, optional={"limits": resource_lists, "requests": resource_lists})},
)
annotation_values = st.text(max_size=12) | st.sampled_from(["true", "false", "TRUE"]) | json_values.map(json.dumps)
pod_annotations = st.dictionaries(  # not `annotations`: that name is the __future__ import's
    st.sampled_from(["gpupack.io/interruptible", "gpupack.io/assignment", "gpupack.io/mig", "other"]),
    annotation_values,
    max_size=3,
)
products = st.sampled_from(["NVIDIA-H100-80GB-HBM3", A100, L4, "ACME-X1"])


@st.composite
def random_pods(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": draw(st.lists(containers, max_size=3))}
    if draw(st.booleans()):
        spec["initContainers"] = draw(st.lists(containers, max_size=2))
    if draw(st.booleans()):
        spec["nodeSelector"] = {"nvidia.com/gpu.product": draw(products)}
    if draw(st.booleans()):
        spec["overhead"] = draw(resource_lists)
    name = draw(st.text(st.characters(codec="ascii", categories=["Ll", "Nd"]), min_size=1, max_size=8))
    return {
        "metadata": {"name": name, "namespace": "fuzz", "uid": f"fuzz-{name}", "annotations": draw(pod_annotations)},
        "spec": spec,
    }


@pytest.mark.slow
@FUZZ
@given(
    obj=random_pods(),
    names=st.lists(st.sampled_from([*NAMES, "ghost"]), max_size=6, unique=True),
    bind_elsewhere=st.booleans(),
    nodes_mode=st.booleans(),
)
def test_random_pods_through_filter_and_bind(served, obj, names, bind_elsewhere: bool, nodes_mode: bool) -> None:
    client, state = served
    by_name = {n["metadata"]["name"]: n for n in NODES}
    nodes = {"items": [by_name.get(n, {"metadata": {"name": n}}) for n in names]}
    args = {"Pod": obj, "Nodes": nodes if nodes_mode else None, "NodeNames": None if nodes_mode else names}
    answer = post(client, "filter", orjson.dumps(args))
    assert set(answer) >= {"FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    passed = [n["metadata"]["name"] for n in answer["Nodes"]["items"]] if nodes_mode else answer["NodeNames"]
    assert len(passed) <= 1 and set(passed) <= set(names)
    scores = post(client, "prioritize", orjson.dumps(args))
    assert [s["Host"] for s in scores] == list(dict.fromkeys(names)) and all(0 <= s["Score"] <= 10 for s in scores)
    if passed:
        target = next((n for n in names if n != passed[0]), passed[0]) if bind_elsewhere else passed[0]
        meta = obj["metadata"]
        bind = {"PodName": meta["name"], "PodNamespace": "fuzz", "PodUID": meta["uid"], "Node": target}
        assert "Error" in post(client, "bind", orjson.dumps(bind))  # no cluster connection: a clear Error
    assert_consistent(state)
