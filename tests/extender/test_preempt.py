"""The preempt verb (#28): ExtenderPreemptionArgs in both forms, gpupack's own victims on each proposed
node by uid, nodes left out where preemption would not help, nothing committed, bad bodies 400."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import pytest
from fastapi.testclient import TestClient

from gpupack.extender.app import create_app
from gpupack.extender.explain import NO_PLAN, explain, render_text
from gpupack.extender.occupants import gpus_held, occupants_on
from gpupack.extender.preemption import PreemptCall, PreemptNode
from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.extender.wire import (
    ExtenderPreemptionResult,
    MetaPod,
    MetaVictims,
    WireError,
    parse_preemption_args,
)
from gpupack.kube.sources import NodeUpserted, PodUpserted
from gpupack.scoring.facts import GpuSlot, Placement
from gpupack.scoring.geometry import FAMILIES
from tests.extender_helpers import node, pod, state_from

NOW = 1_800_000_000.0


# ---------------------------------------------------------------- builders
def ranked(name: str, priority: int | None, *, started: str | None = None, **kw: Any) -> dict[str, Any]:
    """`pod(...)` with spec.priority (None: absent) and status.startTime."""
    obj = pod(name, **kw)
    if priority is not None:
        obj["spec"]["priority"] = priority
    if started is not None:
        obj["status"]["startTime"] = started
    return obj


def whole(name: str, priority: int, gpu: int, node_name: str = "a", **kw: Any) -> dict[str, Any]:
    """A bound 1-GPU pod holding GPU `gpu` of `node_name` by its assignment."""
    assignment = {"node": node_name, "gpus": [{"index": gpu}]}
    return ranked(name, priority, gpus=1, node_name=node_name, assignment=assignment, **kw)


def full_node_state(priorities: Sequence[int], **kw: Any) -> ClusterState:
    """Node `a` (8 GPUs) with one 1-GPU pod `p<i>` of priority priorities[i] on GPU i; node `b` empty of
    room too (8 pods of priority 1000)."""
    pods = [whole(f"p{i}", prio, i) for i, prio in enumerate(priorities)]
    pods += [whole(f"hi{i}", 1000, i, "b") for i in range(8)]
    return state_from([node("a"), node("b")], pods, **kw)


def preemptor(gpus: int = 2, priority: int = 100, **kw: Any) -> dict[str, Any]:
    return ranked("boss", priority, gpus=gpus, **kw)


def meta_args(pod_obj: Any, nodes: Sequence[str], victims: Sequence[str] = ()) -> bytes:
    meta = {name: {"Pods": [{"UID": uid} for uid in victims], "NumPDBViolations": 0} for name in nodes}
    return orjson.dumps({"Pod": pod_obj, "NodeNameToVictims": None, "NodeNameToMetaVictims": meta})


def client_of(state: ClusterState) -> TestClient:
    state.mark_warm()
    return TestClient(create_app(state, state.settings))


def preempt(client: TestClient, body: bytes) -> Any:
    response = client.post("/preempt", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    return response.json()


def victims_of(answer: Any) -> dict[str, list[str]]:
    return {name: [p["UID"] for p in v["Pods"]] for name, v in answer["NodeNameToMetaVictims"].items()}


def inventory_fingerprint(state: ClusterState) -> tuple:
    inv = state.inventory
    arrays = (inv.node_cpu_free, inv.node_mem_free, inv.node_pods_free, inv.gpu_milli_free, inv.gpu_whole)
    return tuple(np.array(a).tobytes() for a in arrays), sorted(state.placements().items(), key=lambda kv: kv[0])


# ---------------------------------------------------------------- wire
def test_both_forms_parse_and_only_node_names_are_read() -> None:
    meta = parse_preemption_args(meta_args(preemptor(), ["a", "b"], ["u1"]))
    assert meta.candidate_names() == ["a", "b"]
    assert meta.node_name_to_meta_victims is not None
    assert meta.node_name_to_meta_victims["a"] is not None
    assert [p.uid for p in meta.node_name_to_meta_victims["a"].pods] == ["u1"]
    full = {"Pod": preemptor(), "NodeNameToVictims": {"b": {"Pods": [whole("x", 0, 0)], "NumPDBViolations": 1},
                                                       "a": None}, "NodeNameToMetaVictims": None}  # fmt: skip
    assert parse_preemption_args(orjson.dumps(full)).candidate_names() == ["b", "a"]


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"[]",
        orjson.dumps({"Pod": preemptor(), "NodeNameToVictims": None, "NodeNameToMetaVictims": None}),
        orjson.dumps({"Pod": preemptor(), "NodeNameToVictims": {}, "NodeNameToMetaVictims": {}}),
        orjson.dumps({"Pod": None, "NodeNameToMetaVictims": {}}),
        orjson.dumps({"Pod": preemptor(), "NodeNameToMetaVictims": {"a": {"Pods": [{"UID": 7}]}}}),
        orjson.dumps({"Pod": preemptor(), "NodeNameToMetaVictims": {"a": {"Pods": [{}]}}}),
        orjson.dumps({"Pod": preemptor(), "NodeNameToMetaVictims": {"a": {"Pods": "x"}}}),
        orjson.dumps({"Pod": preemptor(), "NodeNameToMetaVictims": {"a": {"NumPDBViolations": -1}}}),
        orjson.dumps({"Pod": preemptor(), "NodeNameToMetaVictims": {"": {}}}),
        orjson.dumps({"Pod": preemptor(), "NodeNameToMetaVictims": {"n" * 254: {}}}),
        orjson.dumps({"Pod": preemptor(), "NodeNameToMetaVictims": {"a": {"Pods": [{"UID": "u" * 254}]}}}),
        orjson.dumps({"Pod": preemptor(), "nodeNameToMetaVictims": {}}),
    ],
)
def test_bodies_kube_scheduler_never_sends_are_wire_errors(body: bytes) -> None:
    with pytest.raises(WireError):
        parse_preemption_args(body)


def test_too_many_nodes_is_a_wire_error() -> None:
    with pytest.raises(WireError, match="maxCandidates"):
        parse_preemption_args(meta_args(preemptor(), [f"n{i}" for i in range(11)]), max_candidates=10)


def test_the_result_is_upstream_shape() -> None:
    result = ExtenderPreemptionResult(
        node_name_to_meta_victims={"a": MetaVictims(pods=[MetaPod(uid="u1")], num_pdb_violations=1)}
    )
    assert orjson.loads(result.to_json()) == {
        "NodeNameToMetaVictims": {"a": {"Pods": [{"UID": "u1"}], "NumPDBViolations": 1}}
    }
    assert orjson.loads(ExtenderPreemptionResult().to_json()) == {"NodeNameToMetaVictims": {}}


# ---------------------------------------------------------------- the verb
def test_victims_are_the_cheapest_lower_priority_pods_gpupack_picks_itself() -> None:
    state = full_node_state([5, 1, 50, 2, 200, 300, 100, 7])
    client = client_of(state)
    before = inventory_fingerprint(state)
    # kube-scheduler proposes p7 and p6; gpupack answers its own choice: the two lowest priorities
    answer = preempt(client, meta_args(preemptor(), ["a"], ["uid-default-p7", "uid-default-p6"]))
    assert {name: sorted(uids) for name, uids in victims_of(answer).items()} == {
        "a": ["uid-default-p1", "uid-default-p3"]
    }
    assert answer["NodeNameToMetaVictims"]["a"]["NumPDBViolations"] == 0
    assert inventory_fingerprint(state) == before  # planning commits nothing
    assert state.preemptions.nodes == {PreemptNode.PLANNED: 1}


def test_equal_or_higher_priority_pods_are_never_victims_and_such_nodes_are_left_out() -> None:
    state = full_node_state([100, 100, 150, 100, 100, 100, 100, 99])
    answer = preempt(client_of(state), meta_args(preemptor(gpus=2), ["a", "b"]))
    assert answer == {"NodeNameToMetaVictims": {}}  # one pod below 100 on a, none on b: two GPUs free nowhere
    answer = preempt(client_of(state), meta_args(preemptor(gpus=1), ["a", "b"]))
    assert victims_of(answer) == {"a": ["uid-default-p7"]}
    assert state.preemptions.nodes[PreemptNode.NO_PLAN] == 3


def test_unknown_and_cordoned_nodes_are_left_out() -> None:
    state = full_node_state([1] * 8)
    cordoned = node("c")
    cordoned["spec"]["unschedulable"] = True
    state.apply(NodeUpserted(cordoned))
    answer = preempt(client_of(state), meta_args(preemptor(gpus=1), ["nowhere", "c", "a"]))
    assert list(answer["NodeNameToMetaVictims"]) == ["a"]
    assert state.preemptions.nodes[PreemptNode.UNKNOWN] == 2


def test_the_node_list_form_is_answered_by_uid_too() -> None:
    state = full_node_state([1, 9, 9, 9, 9, 9, 9, 9])
    full = {"Pod": preemptor(gpus=1), "NodeNameToMetaVictims": None,
            "NodeNameToVictims": {"a": {"Pods": [whole("p5", 9, 5)], "NumPDBViolations": 0}}}  # fmt: skip
    assert victims_of(preempt(client_of(state), orjson.dumps(full))) == {"a": ["uid-default-p0"]}


def test_mig_victims_free_a_legal_placement_not_just_enough_slices() -> None:
    """Seven 1g pods, one per start 0..6: a 3g.40gb needs starts 0-3 or 4-7 free, so the victims are the
    pods at 0..3 (or 4..6), never three scattered ones."""
    pods = [
        ranked(f"m{s}", 1 + s, mig="1g.10gb", node_name="m",
               assignment={"node": "m", "gpus": [{"index": 0, "mig": "1g.10gb", "start": s}]})
        for s in range(7)
    ]  # fmt: skip
    state = state_from([node("m", gpus=1, mig="dynamic")], pods)
    answer = preempt(client_of(state), meta_args(ranked("big", 100, mig="3g.40gb"), ["m"]))
    chosen = sorted(victims_of(answer)["m"])
    assert chosen in (sorted(f"uid-default-m{s}" for s in range(4)), sorted(f"uid-default-m{s}" for s in (4, 5, 6)))


def test_terminating_pods_are_no_victims_and_what_they_hold_counts_as_free() -> None:
    state = full_node_state([1, 2, 3, 4, 5, 6, 7, 8])
    leaving = whole("p0", 1, 0)
    leaving["metadata"]["deletionTimestamp"] = "2027-01-01T00:00:00Z"
    state.apply(PodUpserted(leaving))
    client = client_of(state)
    before = inventory_fingerprint(state)
    assert victims_of(preempt(client, meta_args(preemptor(gpus=2), ["a"]))) == {"a": ["uid-default-p1"]}
    assert preempt(client, meta_args(preemptor(gpus=1), ["a"])) == {"NodeNameToMetaVictims": {}}
    assert state.preemptions.nodes[PreemptNode.NO_VICTIMS] == 1  # p0's GPU is enough: nothing to evict
    assert inventory_fingerprint(state) == before


def test_an_unreadable_preemptor_gets_no_node_logged_once_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    state = full_node_state([1] * 8)
    client = client_of(state)
    bad = preemptor(gpus=1)
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = "1"  # mixed kinds
    for _ in range(3):
        assert preempt(client, meta_args(bad, ["a"])) == {"NodeNameToMetaVictims": {}}
    assert state.preemptions.calls[PreemptCall.BAD_REQUEST] == 3
    assert sum("cannot be read" in r.getMessage() for r in caplog.records) == 1


def test_before_sync_nothing_is_preempted() -> None:
    state = ClusterState(Settings())
    state.apply(NodeUpserted(node("a")))
    assert preempt(client_of(state), meta_args(preemptor(), ["a"])) == {"NodeNameToMetaVictims": {}}
    assert state.preemptions.calls == {PreemptCall.NOT_SYNCED: 1}


def test_bad_bodies_get_400_and_failures_an_answer_keeping_no_node(monkeypatch: pytest.MonkeyPatch) -> None:
    state = full_node_state([1] * 8)
    client = client_of(state)
    response = client.post("/preempt", content=b'{"Pod": {}}', headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and "Error" in response.json()

    def boom(*_: Any, **__: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(state.preemptions, "plan", boom)
    assert preempt(client, meta_args(preemptor(), ["a"])) == {"NodeNameToMetaVictims": {}}


def test_metrics_count_calls_and_nodes() -> None:
    state = full_node_state([1] * 8)
    client = client_of(state)
    preempt(client, meta_args(preemptor(gpus=1), ["a", "b", "zz"]))
    text = client.get("/metrics").text
    assert 'gpupack_preempt_calls_total{outcome="answered"} 1.0' in text
    assert 'gpupack_preempt_nodes_total{outcome="planned"} 1.0' in text
    assert 'gpupack_preempt_nodes_total{outcome="unknown-node"} 1.0' in text
    assert 'gpupack_request_duration_seconds_count{code="200",verb="preempt"} 1.0' in text


# ---------------------------------------------------------------- the ledger's occupants
def test_the_ledger_keeps_what_occupants_need_and_follows_updates() -> None:
    a = whole("a0", 3, 0, started="2027-01-01T00:00:00Z", annotations={"gpupack.io/interruptible": "True"})
    a["metadata"]["labels"] = {"app": "train", "n": 3}
    b = whole("b0", None, 1)  # type: ignore[arg-type]
    b["metadata"]["creationTimestamp"] = "2027-01-01T00:00:10Z"
    state = state_from([node("a")], [a, b])
    pods = {p.key: p.life for p in state.bound_pods().values()}
    assert pods["default/a0"].priority == 3 and pods["default/a0"].interruptible
    assert pods["default/a0"].labels == {"app": "train"}  # a label selector matches strings only
    assert pods["default/b0"].priority == 0 and not pods["default/b0"].interruptible
    started = pods["default/a0"].started
    assert started is not None and pods["default/b0"].started == started + 10  # creation when not started
    a["metadata"]["deletionTimestamp"] = "2027-01-01T01:00:00Z"
    state.apply(PodUpserted(a))
    assert {p.key: p.life for p in state.bound_pods().values()}["default/a0"].terminating


def test_occupants_weigh_gpu_seconds_by_what_they_hold() -> None:
    start = "2027-01-01T00:00:00Z"
    pods = [
        whole("w", 1, 0, started=start),
        ranked("s", 1, milli=250, node_name="a", started=start,
               assignment={"node": "a", "gpus": [{"index": 1, "milli": 250}]}),
        ranked("x", 1, gpus=1, node_name="a"),  # no start known: 0 GPU-seconds
    ]  # fmt: skip
    state = state_from([node("a")], pods)
    t0 = state.bound_pods()["uid-default-w"].life.started
    assert t0 is not None
    with state.lock:
        occupants = {o.key: o for o in occupants_on(state.ledger, "a", now=t0 + 100)}
    assert occupants["default/w"].gpu_seconds == pytest.approx(100)
    assert occupants["default/s"].gpu_seconds == pytest.approx(25)
    assert occupants["default/x"].gpu_seconds == 0
    h100 = FAMILIES["H100-80GB"]
    assert gpus_held(Placement("m", (GpuSlot(0, mig="3g.40gb", start=4),)), h100) == pytest.approx(3 / 7)
    assert gpus_held(Placement("m", (GpuSlot(0, mig="1g.6gb", start=0),)), FAMILIES["A30-24GB"]) == 0.25


# ---------------------------------------------------------------- explain
def test_explain_names_the_victims_gpupack_would_pick_on_each_node() -> None:
    """#28: for a pending pod that fits nowhere, explain answers as the preempt verb would, and why."""
    state = full_node_state([5, 1, 50, 2, 200, 300, 100, 7])
    state.mark_warm()
    report = explain(state, preemptor())
    assert report["chosen"] is None
    preempting = report["preemption"]
    assert preempting["priority"] == 100
    (plan,) = preempting["nodes"]
    assert plan["node"] == "a"
    assert sorted(v["pod"] for v in plan["victims"]) == ["default/p1", "default/p3"]  # the two lowest priorities
    assert sorted(v["priority"] for v in plan["victims"]) == [1, 2]
    assert sorted(gpu["index"] for gpu in plan["placement"]["gpus"]) == [1, 3]
    assert preempting["no_plan"] == {"b": NO_PLAN}  # only pods of priority 1000 there
    text = render_text(report)
    assert "if it preempts (priority 100), cheapest node first:" in text
    assert "default/p1 (priority 1," in text and f"b: {NO_PLAN}" in text


def test_explain_of_a_pod_that_fits_says_nothing_of_preemption() -> None:
    state = full_node_state([5, 1, 50, 2, 200, 300, 100])  # GPU 7 of node a is free
    report = explain(state, preemptor(gpus=1))
    assert report["chosen"] == "a" and report["preemption"] is None
    assert "preempts" not in render_text(report)
