"""PodDisruptionBudgets in preemption (#28): which pods evicting would break a budget, how the plan
weighs that, and the source that watches budgets."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from gpupack.extender.budgets import DisruptionBudgets, SelectorError, read_selector
from gpupack.extender.pod_records import PodLife, PodRecord
from gpupack.kube.sources import (
    BudgetApi,
    BudgetDeleted,
    BudgetUpserted,
    KubernetesSource,
    ObjectList,
)
from gpupack.scoring.request import PodRequest
from tests.extender.test_preempt import client_of, meta_args, preempt, preemptor, victims_of, whole
from tests.extender_helpers import node, state_from


def budget(name: str, selector: Any, allowed: int = 0, namespace: str = "default", **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-pdb-{name}"},
        "spec": {"selector": selector},
        "status": {"disruptionsAllowed": allowed, **status},
    }


def record(name: str, labels: dict[str, str], namespace: str = "default") -> PodRecord:
    return PodRecord("u", f"{namespace}/{name}", "a", PodRequest(), None, None, life=PodLife(labels=labels))


def test_selectors_read_as_kubernetes_defines_them() -> None:
    selector = {
        "matchLabels": {"app": "db"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "b"]},
            {"key": "canary", "operator": "DoesNotExist"},
            {"key": "zone", "operator": "NotIn", "values": ["x"]},
            {"key": "team", "operator": "Exists"},
        ],
    }
    requirements = read_selector(selector)
    assert all(r.matches({"app": "db", "tier": "a", "team": "t"}) for r in requirements)
    assert not all(r.matches({"app": "db", "tier": "c", "team": "t"}) for r in requirements)
    assert not all(r.matches({"app": "db", "tier": "a", "team": "t", "canary": "1"}) for r in requirements)
    assert read_selector(None) == () and read_selector({}) == ()
    bad_selectors: list[Any] = ["x", {"matchLabels": []}, {"matchExpressions": [{"key": "k", "operator": "Near"}]}]
    for bad in bad_selectors:
        with pytest.raises(SelectorError):
            read_selector(bad)


def test_a_pod_breaks_a_budget_only_when_one_of_its_namespace_selects_it_and_allows_nothing() -> None:
    budgets = DisruptionBudgets()
    db = record("db-0", {"app": "db"})
    assert not budgets.breaks(db)
    budgets.apply(BudgetUpserted(budget("db", {"matchLabels": {"app": "db"}}, allowed=1)))
    assert not budgets.breaks(db)  # one disruption allowed
    budgets.apply(BudgetUpserted(budget("db", {"matchLabels": {"app": "db"}}, allowed=0)))
    assert budgets.breaks(db)
    assert not budgets.breaks(record("db-0", {"app": "db"}, namespace="other"))
    assert not budgets.breaks(record("web-0", {"app": "web"}))
    budgets.apply(BudgetUpserted(budget("db", {"matchLabels": {"app": "db"}}, disruptedPods={"db-0": "t"})))
    assert not budgets.breaks(db)  # already counted as disrupted
    budgets.apply(BudgetUpserted(budget("all", {})))
    assert not budgets.breaks(record("web-0", {"app": "web"}))  # an empty selector selects nothing (upstream)
    budgets.apply(BudgetDeleted("default/db", "uid-pdb-db"))
    assert not budgets.breaks(db) and len(budgets) == 1


def test_an_unreadable_budget_selects_nothing_and_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    budgets = DisruptionBudgets()
    with caplog.at_level(logging.WARNING, logger="gpupack.extender.budgets"):
        for _ in range(3):
            budgets.apply(BudgetUpserted(budget("odd", {"matchExpressions": "x"})))
        budgets.apply(BudgetUpserted({"metadata": "nonsense", "spec": 3}))
    assert len(budgets) == 1  # the nonsense one: a nil selector, selects nothing
    assert sum("odd" in r.getMessage() for r in caplog.records) == 1
    assert not budgets.breaks(record("x", {"app": "db"}))


def protected_state() -> Any:
    """Node a: p0 (priority 1, app=db, under a budget allowing nothing) and p1..p7 (priority 5..11)."""
    pods = [whole("p0", 1, 0), *(whole(f"p{i}", 4 + i, i) for i in range(1, 8))]
    pods[0]["metadata"]["labels"] = {"app": "db"}
    state = state_from([node("a")], pods)
    state.apply(BudgetUpserted(budget("db", {"matchLabels": {"app": "db"}})))
    return state


def test_the_plan_spares_a_protected_pod_and_counts_violations_when_it_must_not() -> None:
    state = protected_state()
    client = client_of(state)
    answer = preempt(client, meta_args(preemptor(gpus=1), ["a"]))
    assert victims_of(answer) == {"a": ["uid-default-p1"]}  # priority 5 rather than p0's budget
    assert answer["NodeNameToMetaVictims"]["a"]["NumPDBViolations"] == 0
    answer = preempt(client, meta_args(preemptor(gpus=8), ["a"]))
    assert len(victims_of(answer)["a"]) == 8
    assert answer["NodeNameToMetaVictims"]["a"]["NumPDBViolations"] == 1


def test_budget_events_pass_through_the_state_without_touching_pods() -> None:
    state = protected_state()
    before = orjson.dumps(sorted((k, str(p)) for k, p in state.placements().items()))
    state.apply(BudgetDeleted("default/db", "uid-pdb-db"))
    assert len(state.budgets) == 0
    assert orjson.dumps(sorted((k, str(p)) for k, p in state.placements().items())) == before


class _Api:
    """A KubeApi with budgets, listing nothing and watching nothing."""

    def list_nodes(self) -> ObjectList:
        return ObjectList()

    def list_pods(self) -> ObjectList:
        return ObjectList()

    def list_pdbs(self) -> ObjectList:
        return ObjectList(items=[budget("db", {"matchLabels": {"app": "db"}})], resource_version="7")

    def _none(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        return iter(())

    watch_nodes = watch_pods = watch_pdbs = _none

    def create_binding(self, *args: Any) -> None: ...

    def create_event(self, *args: Any) -> None: ...

    def patch_event(self, *args: Any) -> None: ...


def test_the_source_lists_budgets_when_its_api_offers_them() -> None:
    api = _Api()
    assert isinstance(api, BudgetApi)
    seen: list[Any] = []
    source = KubernetesSource(api, seen.append, sleep=lambda _: None)
    source.start()
    try:
        assert source.wait_synced(5)
    finally:
        source.stop()
    assert [type(e).__name__ for e in seen].count("Synced") >= 1
    (upserted,) = [e for e in seen if isinstance(e, BudgetUpserted)]
    assert upserted.key == "default/db"
    assert source.resource_version("PodDisruptionBudget") == "7"


class _ForbiddenBudgetsApi(_Api):
    """An API whose budgets cannot be listed (an RBAC without them)."""

    def list_pdbs(self) -> ObjectList:
        raise RuntimeError("403 Forbidden")


def test_a_source_that_cannot_list_budgets_still_syncs_nodes_and_pods() -> None:
    seen: list[Any] = []
    source = KubernetesSource(_ForbiddenBudgetsApi(), seen.append, sleep=lambda _: None, backoff_cap=0.01)
    source.start()
    try:
        assert source.wait_synced(5)
    finally:
        source.stop()
    assert not any(isinstance(e, BudgetUpserted) for e in seen)
