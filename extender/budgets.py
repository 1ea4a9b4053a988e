"""PodDisruptionBudgets as preemption weighs them (#28): would evicting this pod now break one?

A pod breaks a budget when a policy/v1 PodDisruptionBudget of its namespace selects it and allows no
disruption now (`status.disruptionsAllowed` 0 or less), unless the budget already counts the pod as
disrupted (`status.disruptedPods`). As kube-scheduler's own preemption reads budgets, a nil or empty
selector selects nothing, and a selector gpupack cannot read selects nothing either (logged once).
Budgets come from the source (`BudgetUpserted` / `BudgetDeleted`); a cluster file has none.

Not thread-safe on its own: the state applies events and plans preemption under its lock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupack.errors import GpupackError
from gpupack.extender.pod_records import PodRecord
from gpupack.kube.sources.events import BudgetDeleted, BudgetUpserted, Event

logger = logging.getLogger(__name__)


class SelectorError(GpupackError, ValueError):
    """A label selector gpupack cannot read."""


@dataclass(frozen=True)
class Requirement:
    """One requirement of a label selector: `key` `operator` `values`."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether `labels` satisfy it."""
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return labels.get(self.key) not in self.values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels  # DoesNotExist


def read_selector(selector: Any) -> tuple[Requirement, ...]:
    """The requirements of a metav1.LabelSelector; () for a nil or empty one (it selects nothing here)."""
    if selector is None:
        return ()
    if not isinstance(selector, Mapping):
        raise SelectorError("selector is not an object")
    requirements = []
    match_labels = selector.get("matchLabels")
    match_labels = {} if match_labels is None else match_labels
    if not isinstance(match_labels, Mapping):
        raise SelectorError("matchLabels is not an object")
    for key, value in match_labels.items():
        if not isinstance(value, str):
            raise SelectorError(f"matchLabels[{key!r}] is not a string")
        requirements.append(Requirement(str(key), "In", frozenset({value})))
    expressions = selector.get("matchExpressions")
    expressions = [] if expressions is None else expressions
    if not isinstance(expressions, Sequence) or isinstance(expressions, str):
        raise SelectorError("matchExpressions is not a list")
    for expression in expressions:
        if not isinstance(expression, Mapping):
            raise SelectorError("a matchExpressions entry is not an object")
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        if not isinstance(key, str) or operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise SelectorError(f"matchExpressions entry {dict(expression)!r} is not readable")
        if not isinstance(values, Sequence) or not all(isinstance(v, str) for v in values):
            raise SelectorError(f"matchExpressions values of {key!r} are not strings")
        requirements.append(Requirement(key, operator, frozenset(values)))
    return tuple(requirements)


@dataclass(frozen=True)
class Budget:
    """What preemption reads of one PodDisruptionBudget."""

    namespace: str
    selector: tuple[Requirement, ...]  # () selects nothing
    allowed: int  # status.disruptionsAllowed
    disrupted: frozenset[str]  # names in status.disruptedPods

    def selects(self, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        """Whether the budget covers the pod (and does not count it disrupted already)."""
        return (
            bool(self.selector)
            and namespace == self.namespace
            and name not in self.disrupted
            and all(requirement.matches(labels) for requirement in self.selector)
        )


def read_budget(obj: Mapping[str, Any]) -> Budget:
    """A Budget from a PodDisruptionBudget object; SelectorError when its selector cannot be read."""
    metadata, spec, status = (_mapping(obj.get(part)) for part in ("metadata", "spec", "status"))
    allowed = status.get("disruptionsAllowed", 0)
    disrupted = status.get("disruptedPods") or {}
    return Budget(
        namespace=str(metadata.get("namespace") or "default"),
        selector=read_selector(spec.get("selector")),
        allowed=allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0,
        disrupted=frozenset(disrupted) if isinstance(disrupted, Mapping) else frozenset(),
    )


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


class DisruptionBudgets:
    """The cluster's PodDisruptionBudgets, by namespace/name, from source events."""

    def __init__(self) -> None:
        self._budgets: dict[str, Budget] = {}
        self._unreadable: set[str] = set()

    def __len__(self) -> int:
        return len(self._budgets)

    def apply(self, event: Event) -> None:
        """Follow one source event (only budget events matter here)."""
        if isinstance(event, BudgetUpserted):
            metadata = _mapping(event.budget.get("metadata"))
            key = f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or ''}"
            try:
                self._budgets[key] = read_budget(event.budget)
                self._unreadable.discard(key)
            except SelectorError as exc:
                self._budgets.pop(key, None)
                if key not in self._unreadable:
                    self._unreadable.add(key)
                    logger.warning("PodDisruptionBudget %s: %s; it is taken to select no pod", key, exc)
        elif isinstance(event, BudgetDeleted):
            self._budgets.pop(event.key, None)
            self._unreadable.discard(event.key)

    def breaks(self, record: PodRecord) -> bool:
        """Whether evicting the pod now would break a budget that allows no disruption."""
        if not self._budgets:
            return False
        namespace, _, name = record.key.partition("/")
        return any(
            budget.allowed <= 0 and budget.selects(namespace, name, record.life.labels)
            for budget in self._budgets.values()
        )
