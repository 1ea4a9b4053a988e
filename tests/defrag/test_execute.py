"""defrag.execute (#31): the plan's pods evicted in order, only the pod the plan saw, a refusal stops the run,
and each eviction is recorded as an Event on the pod and on the node it left."""

from __future__ import annotations

from typing import Any

from gpupack.defrag.evictions import Refused
from gpupack.defrag.execute import Outcome, carry_out
from gpupack.scoring.defrag import DefragPlan, Eviction, Move
from gpupack.scoring.defrag_goals import Goal
from gpupack.scoring.facts import GpuSlot, Placement


class FakeEvictor:
    """Pods by key with their uid; pods in `guarded` are refused (a PodDisruptionBudget), as the API server does."""

    def __init__(self, pods: dict[str, str], guarded: frozenset[str] = frozenset()) -> None:
        self.pods = dict(pods)
        self.guarded = guarded
        self.evicted: list[str] = []
        self.annotations: dict[str, tuple[str, str]] = {}

    def annotate(self, namespace: str, name: str, uid: str, key: str, value: str) -> bool:
        if self.pods.get(f"{namespace}/{name}") != uid:
            return False
        self.annotations[f"{namespace}/{name}"] = (key, value)
        return True

    def evict(self, namespace: str, name: str, uid: str) -> bool:
        key = f"{namespace}/{name}"
        if key in self.guarded:
            raise Refused(f"pod {key}: Too Many Requests")
        if self.pods.get(key) != uid:
            return False
        del self.pods[key]
        self.evicted.append(key)
        return True


class FakeEvents:
    def __init__(self, fail: bool = False) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []
        self.fail = fail

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        if self.fail:
            raise RuntimeError("forbidden")
        self.created.append((namespace, event))

    def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        raise AssertionError("defrag never patches an Event")


PENDING = {"ml/big": "u-big", "ml/huge": "u-huge"}  # the pods the moves are for, by key, with their uids


def move(target: str, *pods: str) -> Move:
    evictions = tuple(Eviction(p, "n0", Placement("n1", (GpuSlot(0),))) for p in pods)
    return Move(Goal.PENDING, target, evictions, "the pod is placed", 0.0, Placement("n0", (GpuSlot(1),)))


def test_the_planned_pods_are_evicted_in_order_with_an_event_on_each_pod_and_node() -> None:
    plan = DefragPlan([move("ml/big", "ml/a", "ml/b"), move("ml/huge", "ml/c")])
    evictor = FakeEvictor({**PENDING, "ml/a": "ua", "ml/b": "ub", "ml/c": "uc", "ml/other": "uo"})
    events = FakeEvents()
    carried = carry_out(plan, {**PENDING, "ml/a": "ua", "ml/b": "ub", "ml/c": "uc"}, evictor, events)
    hold = ("gpupack.io/defrag-hold", '{"node":"n0","gpus":[{"index":1}]}')
    assert evictor.annotations == {"ml/big": hold, "ml/huge": hold}
    assert evictor.evicted == ["ml/a", "ml/b", "ml/c"] and "ml/other" in evictor.pods
    assert carried.outcomes == [("ml/a", Outcome.EVICTED), ("ml/b", Outcome.EVICTED), ("ml/c", Outcome.EVICTED)]
    assert carried.stopped == "" and carried.events_failed == 0
    kinds = [(namespace, e["regarding"]["kind"], e["regarding"]["name"]) for namespace, e in events.created]
    assert kinds[:2] == [("ml", "Pod", "a"), ("default", "Node", "n0")]
    note = events.created[0][1]["note"]
    assert events.created[0][1]["reason"] == "Defragmented"
    assert "schedule-pending-pod ml/big" in note and "node n1: GPU 0" in note


def test_a_pod_recreated_under_its_name_since_the_plan_is_not_evicted() -> None:
    evictor = FakeEvictor({**PENDING, "ml/a": "new-uid"})
    carried = carry_out(DefragPlan([move("ml/big", "ml/a")]), {**PENDING, "ml/a": "planned-uid"}, evictor, FakeEvents())
    assert evictor.evicted == [] and carried.outcomes == [("ml/a", Outcome.GONE)]


def test_a_refused_eviction_stops_the_run_before_any_later_move() -> None:
    plan = DefragPlan([move("ml/big", "ml/a", "ml/b"), move("ml/huge", "ml/c")])
    evictor = FakeEvictor({**PENDING, "ml/a": "ua", "ml/b": "ub", "ml/c": "uc"}, guarded=frozenset({"ml/b"}))
    carried = carry_out(plan, {**PENDING, "ml/a": "ua", "ml/b": "ub", "ml/c": "uc"}, evictor, FakeEvents())
    assert evictor.evicted == ["ml/a"]
    assert carried.outcomes == [("ml/a", Outcome.EVICTED), ("ml/b", Outcome.REFUSED)]
    assert carried.stopped.startswith("stopped at schedule-pending-pod ml/big: pod ml/b")


def test_an_event_that_cannot_be_written_is_counted_and_the_run_goes_on() -> None:
    evictor = FakeEvictor({**PENDING, "ml/a": "ua", "ml/c": "uc"})
    plan = DefragPlan([move("ml/big", "ml/a"), move("ml/huge", "ml/c")])
    carried = carry_out(plan, {**PENDING, "ml/a": "ua", "ml/c": "uc"}, evictor, FakeEvents(fail=True))
    assert evictor.evicted == ["ml/a", "ml/c"] and carried.events_failed == 4


def test_a_move_whose_pending_pod_is_gone_evicts_nothing() -> None:
    evictor = FakeEvictor({"ml/a": "ua", "ml/c": "uc", "ml/huge": "u-huge"})  # ml/big is gone
    plan = DefragPlan([move("ml/big", "ml/a"), move("ml/huge", "ml/c")])
    carried = carry_out(plan, {**PENDING, "ml/a": "ua", "ml/c": "uc"}, evictor, FakeEvents())
    assert evictor.evicted == ["ml/c"] and carried.targets_gone == ["ml/big"]


def test_a_move_the_loop_does_not_allow_writes_no_hold_and_stops_the_run() -> None:
    evictor = FakeEvictor({"ml/a": "ua", "ml/c": "uc", **PENDING})
    plan = DefragPlan([move("ml/big", "ml/a"), move("ml/huge", "ml/c")])
    asked: list[int] = []

    def may_move(count: int) -> bool:
        asked.append(count)
        return len(asked) == 1  # the first move only

    carried = carry_out(plan, {**PENDING, "ml/a": "ua", "ml/c": "uc"}, evictor, FakeEvents(), may_move=may_move)
    assert evictor.evicted == ["ml/a"] and list(evictor.annotations) == ["ml/big"]
    assert carried.stopped.startswith("stopped before schedule-pending-pod ml/huge")
