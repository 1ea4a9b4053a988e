"""`gpupack defrag --loop`: the leader-elected defrag loop of the deployment (#31 item 1; off by default).

Every `retry_seconds` the loop renews (or tries to take) its Lease (`defrag.lease`); the replica that
holds it runs a round every `every_seconds`:

1. What is left of the eviction budget: at most `window_evictions` evictions in any `window_seconds`,
   counted from the times the Lease records, so a replica taking over spends the same window. None left:
   no round.
2. The cluster read once and planned as `gpupack defrag` plans it, at most min(budget left,
   `round_evictions`) evictions. A pending pod that carries a `gpupack.io/defrag-hold` is not planned for
   until `settle_seconds` after the loop first saw that hold: its move is under way (its evicted pods
   terminating, the extender holding what they free), and planning again would evict more for it.
3. Dry run (the default): the plan is logged and counted, nothing is evicted. With `execute`: carried out
   (`defrag.execute`), and before each move the Lease is renewed with the move's evictions recorded in
   it; a replica that cannot renew it, or a window with too few evictions left, stops the round there.

A round that fails (the API unreachable, a cluster it cannot read) is logged and counted, and the loop goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from gpupack.defrag.execute import Carried, Outcome
from gpupack.defrag.lease import LeaseElector
from gpupack.defrag.loop_metrics import LoopMetrics
from gpupack.kube.keys import ANNOTATION_DEFRAG_HOLD
from gpupack.kube.pods import pod_key
from gpupack.report.snapshot import ClusterSnapshot
from gpupack.scoring.defrag import DefragPlan
from gpupack.scoring.defrag_goals import DEFAULT_MAX_EVICTIONS

logger = logging.getLogger(__name__)

ReadCluster = Callable[[], ClusterSnapshot]
PlanCluster = Callable[[ClusterSnapshot, int, Collection[str]], DefragPlan]  # (snapshot, max evictions, not for)
CarryOut = Callable[[ClusterSnapshot, DefragPlan, Callable[[int], bool]], Carried]  # ..., may_move(evictions)


@dataclass(frozen=True)
class LoopSettings:
    """How often the loop acts and how much it may evict (module docstring)."""

    every_seconds: float = 300.0
    window_seconds: float = 3600.0
    window_evictions: int = 8
    round_evictions: int = DEFAULT_MAX_EVICTIONS
    settle_seconds: float = 300.0
    retry_seconds: float = 5.0
    execute: bool = False


def budget_left(evictions: Collection[float], now: float, window_seconds: float, limit: int) -> int:
    """Evictions still allowed at `now`: `limit` less those of the last `window_seconds`."""
    return max(0, limit - sum(1 for t in evictions if now - window_seconds < t <= now))


@dataclass
class DefragLoop:
    """The loop of the module docstring; `run` until `stop` is set, `round` once (what `run` does as leader)."""

    settings: LoopSettings
    elector: LeaseElector
    read: ReadCluster
    plan: PlanCluster
    carry: CarryOut
    metrics: LoopMetrics = field(default_factory=LoopMetrics)
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    _holds_seen: dict[str, tuple[str, float]] = field(default_factory=dict)  # pod -> (hold, first seen)

    def run(self, stop: threading.Event) -> None:
        """Lead when possible and run a round every `every_seconds` while leading; give the Lease up at the end."""
        due = self.clock()
        try:
            while not stop.is_set():
                leading = self.elector.hold()
                self.metrics.leader.set(int(leading))
                if leading and self.clock() >= due:
                    self.round()
                    due = self.clock() + self.settings.every_seconds
                stop.wait(self.settings.retry_seconds)
        finally:
            self.elector.release()
            self.metrics.leader.set(0)

    def round(self) -> str:
        """One round (module docstring); its outcome, as counted in `gpupack_defrag_rounds`."""
        started = self.clock()
        try:
            outcome = self._round()
        except Exception:  # a round is retried next time; the loop itself must not die of one
            logger.exception("defrag: round failed")
            outcome = "error"
        self.metrics.rounds.labels(outcome).inc()
        self.metrics.round_seconds.observe(self.clock() - started)
        self.metrics.last_round.set(self.wall())
        return outcome

    def _round(self) -> str:
        left = self._left()
        if left == 0:
            return "budget-spent"
        snapshot = self.read()
        plan = self.plan(snapshot, min(left, self.settings.round_evictions), self._settling(snapshot))
        for move in plan.moves:
            self.metrics.moves.labels(move.goal.value).inc()
        if not plan.moves:
            return "nothing-to-move"
        logger.info("defrag: planned %d moves, %d evictions: %s", len(plan.moves), plan.evictions, _summary(plan))
        if not self.settings.execute:
            return "dry-run"
        carried = self.carry(snapshot, plan, self._may_move)
        self._count(plan, carried)
        return "stopped" if carried.stopped else "executed"

    def _left(self) -> int:
        settings = self.settings
        left = budget_left(self.elector.evictions(), self.wall(), settings.window_seconds, settings.window_evictions)
        self.metrics.budget_left.set(left)
        return left

    def _may_move(self, evictions: int) -> bool:
        """Before a move: the window has room for its evictions, and the Lease is renewed with them recorded."""
        if self._left() < evictions:
            return False
        now = self.wall()
        if not self.elector.hold(spend=[now] * evictions):
            self.metrics.leader.set(0)
            return False
        self._left()
        return True

    def _settling(self, snapshot: ClusterSnapshot) -> set[str]:
        """Pending pods whose defrag hold was first seen less than `settle_seconds` ago (module docstring)."""
        now = self.clock()
        seen: dict[str, tuple[str, float]] = {}
        for pod in snapshot.pods.values():
            hold = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_DEFRAG_HOLD)
            if isinstance(hold, str) and not (pod.get("spec") or {}).get("nodeName"):
                key = pod_key(pod)
                earlier = self._holds_seen.get(key)
                seen[key] = earlier if earlier is not None and earlier[0] == hold else (hold, now)
        self._holds_seen = seen
        return {key for key, (_, first) in seen.items() if now - first < self.settings.settle_seconds}

    def _count(self, plan: DefragPlan, carried: Carried) -> None:
        """Evictions by outcome; the GPU-seconds a move loses, shared evenly by the pods it evicted."""
        lost = {e.pod: move.gpu_seconds / max(1, len(move.evictions)) for move in plan.moves for e in move.evictions}
        for pod, outcome in carried.outcomes:
            self.metrics.evictions.labels(outcome.value).inc()
            if outcome is Outcome.EVICTED:
                self.metrics.gpu_seconds_lost.inc(lost.get(pod, 0.0))


def _summary(plan: DefragPlan) -> str:
    return "; ".join(f"{m.goal.value} {m.target}: evict {', '.join(e.pod for e in m.evictions)}" for m in plan.moves)


__all__ = ["DefragLoop", "LoopSettings", "budget_left"]
