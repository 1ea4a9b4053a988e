"""Carrying a defrag plan out (#31): its moves in order, each pod through the Eviction API, each eviction an Event.

- A move for a pending pod first writes `gpupack.io/defrag-hold` on that pod (the placement the move frees
  for it, only if it is still the pod the plan saw): gpupack's extender then holds what the evictions free
  for it alone (`extender.nominations`), so the evicted pods' replacements cannot take it. A pending pod gone
  meanwhile is not moved for.
- A move's pods are evicted one after another, each only if it is still the pod the plan saw (its uid).
  An eviction the API server refuses (a PodDisruptionBudget that allows no disruption now: it changed since
  the plan was made) stops the run there, since every later move was planned on the state after this one.
  A pod that is gone already counts as moved: nothing of it is left to evict.
- Before a move, `may_move(n)` (the loop's: it still leads and its window has n evictions left) must agree,
  else the run stops there, before the hold is written.
- Each evicted pod gets a Normal Event `Defragmented` with the move's goal, target and simulated gain and
  where the simulation placed the pod again; the node it left gets one as well. An Event that cannot be
  written is counted in the result, and the run goes on.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

from gpupack.defrag.evictions import Evictor, Refused
from gpupack.extender.pod_events import NAME_LIMIT, NOTE_LIMIT, assignment_note, micro_time
from gpupack.kube.keys import ANNOTATION_DEFRAG_HOLD
from gpupack.kube.sources.kube_api import EventWriter
from gpupack.scoring.defrag import DefragPlan, Eviction, Move

logger = logging.getLogger(__name__)

REPORTING_CONTROLLER = "gpupack.io/defrag"
REASON = "Defragmented"


class Outcome(StrEnum):
    """What became of one planned eviction."""

    EVICTED = "evicted"
    GONE = "gone"  # gone already, or another pod by that name now: nothing evicted
    REFUSED = "refused"  # the API server refused it (a PodDisruptionBudget): the run stopped


@dataclass
class Carried:
    """The planned evictions tried, in order, with their outcomes; why the run stopped early ("" : it did not)."""

    outcomes: list[tuple[str, Outcome]] = field(default_factory=list)
    targets_gone: list[str] = field(default_factory=list)  # pending pods gone before their move: not moved for
    stopped: str = ""
    events_failed: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "evictions": [{"pod": pod, "outcome": outcome.value} for pod, outcome in self.outcomes],
            "targets_gone": self.targets_gone,
            "stopped": self.stopped,
            "events_failed": self.events_failed,
        }


def carry_out(
    plan: DefragPlan,
    uids: Mapping[str, str],
    evictor: Evictor,
    events: EventWriter | None,
    clock: Callable[[], float] = time.time,
    may_move: Callable[[int], bool] = lambda count: True,
) -> Carried:
    """Evict the plan's pods, move by move (module docstring); `uids`: pod key -> the uid the plan saw."""
    carried = Carried()
    for move in plan.moves:
        if not may_move(len(move.evictions)):
            carried.stopped = f"stopped before {move.goal.value} {move.target}: not leading, or no budget left"
            logger.warning("defrag: %s", carried.stopped)
            return carried
        if not _hold(move, uids, evictor):
            carried.targets_gone.append(move.target)
            continue
        for eviction in move.evictions:
            namespace, _, name = eviction.pod.partition("/")
            try:
                evicted = evictor.evict(namespace, name, uids.get(eviction.pod, ""))
            except Refused as exc:
                carried.outcomes.append((eviction.pod, Outcome.REFUSED))
                carried.stopped = f"stopped at {move.goal.value} {move.target}: {exc}"
                logger.warning("defrag: %s", carried.stopped)
                return carried
            carried.outcomes.append((eviction.pod, Outcome.EVICTED if evicted else Outcome.GONE))
            if evicted and events is not None:
                carried.events_failed += _record(events, move, eviction, clock())
    return carried


def _hold(move: Move, uids: Mapping[str, str], evictor: Evictor) -> bool:
    """Before a pending pod's move: the hold on it, so that what the evictions free waits for it (False: the
    pod is gone, the move is pointless). Other goals hold nothing."""
    if move.placement is None:
        return True
    namespace, _, name = move.target.partition("/")
    value = orjson.dumps(move.placement.to_assignment()).decode()
    return evictor.annotate(namespace, name, uids.get(move.target, ""), ANNOTATION_DEFRAG_HOLD, value)


def _record(events: EventWriter, move: Move, eviction: Eviction, now: float) -> int:
    """The Events of one eviction, on the pod and on the node it left; how many could not be written."""
    namespace, _, name = eviction.pod.partition("/")
    note = (
        f"evicted for {move.goal.value} {move.target} ({move.gain}); simulated to go to {assignment_note(eviction.to)}"
    )
    failed = 0
    for where, regarding in (
        (namespace, {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name}),
        ("default", {"apiVersion": "v1", "kind": "Node", "name": eviction.node}),
    ):
        try:
            events.create_event(where, _event(where, regarding, f"{eviction.pod}: {note}"[:NOTE_LIMIT], now))
        except Exception as exc:  # an Event is a record, never a reason to stop moving
            logger.warning("defrag: cannot write the Event of %s on %s: %s", eviction.pod, regarding["kind"], exc)
            failed += 1
    return failed


def _event(namespace: str, regarding: Mapping[str, str], note: str, now: float) -> dict[str, Any]:
    """An events.k8s.io/v1 Event about `regarding`."""
    suffix = f".{time.time_ns():x}"
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": regarding["name"][: NAME_LIMIT - len(suffix)] + suffix, "namespace": namespace},
        "eventTime": micro_time(now),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": socket.gethostname(),
        "action": "Evicting",
        "reason": REASON,
        "type": "Normal",
        "note": note,
        "regarding": dict(regarding),
    }


__all__ = ["Carried", "Outcome", "carry_out"]
