"""Kubernetes Events on pods (#18 item 2): what gpupack did with a pod, in one line a human reads.

- `Assigned` (Normal) when a bind succeeded: the node, the GPU indices and, per GPU, the MIG
  instance (profile@start) or the share, as in `gpupack.io/assignment` (docs/contracts.md#assignment), e.g.
  `node gpu-node-7: GPU 3 MIG 3g.40gb@4`.
- `FailedAssignment` (Warning) when a pod keeps failing: at its `REPEATED_FAILURES`-th failed filter or
  bind since it was created or last bound, with the reason; then at most once every
  `WARNING_INTERVAL_SECONDS` while it keeps failing. The same note again is counted on the event
  already written (its `series`, a merge patch, as client-go's event recorder does); another note is
  a new event. The failure count of at most `TRACKED_PODS` pods is kept; a bind or the pod's deletion
  forgets it. When that many are tracked, a pod that has not failed for `STALE_SECONDS` makes room,
  else the new pod's failure is not counted (gpupack_event_failures{reason="untracked"}, logged once):
  dropping the least recently failed instead would, with more pods failing in turn than are tracked,
  forget each before its next failure, and no pod would ever be warned.

Events are events.k8s.io/v1 objects written through the cluster writer (a cluster file only logs
them). They never block or fail a bind and are never written under the decision lock: an event is
put on a queue of at most `QUEUE_LIMIT` (never waiting) that one thread of this module writes out.
An event dropped because the queue is full, or whose write the API server refused, is not retried:
it is counted (`counts()`, gpupack_event_failures) and logged at debug level.
"""

from __future__ import annotations

import itertools
import logging
import queue
import socket
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from gpupack.kube.sources.kube_api import EventWriter
from gpupack.scoring.facts import GpuSlot, Placement

logger = logging.getLogger(__name__)

REPORTING_CONTROLLER = "gpupack.io/extender"
REPEATED_FAILURES = 3  # failed filters or binds in a row before a Warning
WARNING_INTERVAL_SECONDS = 60.0  # at most one Warning per pod this often
QUEUE_LIMIT = 1000  # events waiting to be written
TRACKED_PODS = 10_000  # pods whose failures are counted
STALE_SECONDS = 900.0  # kube-scheduler retries an unschedulable pod at least every 5 minutes
NOTE_LIMIT = 1024  # bytes: the API server refuses a longer note
NAME_LIMIT = 253  # an Event's name is a DNS subdomain
TOP_REASONS = 3  # reasons named in a FailedAssignment note
IDLE_SECONDS = 5.0  # the writer thread ends after this long without work (a new event starts it)


class EventReason(StrEnum):
    """The `reason` of gpupack's events (the label of gpupack_events)."""

    ASSIGNED = "Assigned"
    FAILED = "FailedAssignment"
    CLAIMS_ALLOCATED = "AllocatedClaims"  # DRA (#30): gpupack allocated a gated pod's claims
    CLAIMS_LEFT = "ClaimsLeftToScheduler"  # DRA: ungated without an allocation, with why


class EventFailure(StrEnum):
    """Why an event was not written (the label of gpupack_event_failures)."""

    QUEUE_FULL = "queue-full"  # more events waiting than QUEUE_LIMIT: dropped
    WRITE = "write"  # the API server refused or failed the write
    UNTRACKED = "untracked"  # a failure of a pod beyond TRACKED_PODS: not counted towards a Warning


@dataclass(frozen=True)
class PodRef:
    """The pod an event is about."""

    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodRef:
        """The reference of a Pod object as kube-scheduler sends it."""
        metadata = pod.get("metadata") or {}
        namespace, name, uid = (metadata.get(key) for key in ("namespace", "name", "uid"))
        return cls(str(namespace or "default"), str(name or ""), str(uid or ""))

    @property
    def ident(self) -> str:
        """How the state tracks the pod: its uid, or namespace/name without one."""
        return self.uid or f"{self.namespace}/{self.name}"


def slot_text(slot: GpuSlot) -> str:
    """One GPU slot as a person reads it: `GPU 3`, `GPU 3 MIG 3g.40gb@4`, `GPU 2 share 250/1000`."""
    if slot.mig:
        return f"GPU {slot.index} MIG {slot.mig}@{slot.start}"
    if slot.milli:
        return f"GPU {slot.index} share {slot.milli}/1000"
    return f"GPU {slot.index}"


def assignment_note(placement: Placement) -> str:
    """The `Assigned` note: `node n: GPUs 0, 1`, `node n: GPU 3 MIG 3g.40gb@4`, `node n: no GPU`."""
    slots = placement.slots
    if not slots:
        gpus = "no GPU"
    elif all(not slot.mig and not slot.milli for slot in slots):
        gpus = f"GPU{'s' if len(slots) > 1 else ''} {', '.join(str(slot.index) for slot in slots)}"
    else:
        gpus = ", ".join(slot_text(slot) for slot in slots)
    return _clip(f"node {placement.node}: {gpus}")


def no_node_note(failed: Mapping[str, str], unresolvable: Mapping[str, str]) -> str:
    """A `FailedAssignment` note for a filter that found no node: the commonest reasons with their counts."""
    counts = Counter(failed.values())
    counts.update(unresolvable.values())
    if not counts:
        return "no node fits: no candidate nodes"
    ranked = counts.most_common()
    parts = [f"{n} node{'s' if n > 1 else ''}: {reason}" for reason, n in ranked[:TOP_REASONS]]
    if len(ranked) > TOP_REASONS:
        parts.append(f"{sum(n for _, n in ranked[TOP_REASONS:])} more with other reasons")
    return _clip(f"no node fits: {'; '.join(parts)}")


def _clip(note: str) -> str:
    """At most NOTE_LIMIT bytes of UTF-8, cut with an ellipsis."""
    data = note.encode()
    if len(data) <= NOTE_LIMIT:
        return note
    return data[: NOTE_LIMIT - 3].decode(errors="ignore") + "…"


def micro_time(seconds: float) -> str:
    """A Kubernetes MicroTime: RFC 3339 in UTC with exactly six fractional digits."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class _Failing:
    """One pod's failures since it was created or last bound, and its last Warning."""

    failures: int = 0
    last_failed: float = 0.0
    reported_at: float | None = None
    note: str = ""
    event: str = ""  # name of the Warning event that holds `note`
    count: int = 0  # how often `note` was reported in that event


@dataclass(frozen=True)
class _Write:
    """One write for the writer thread: create `body`, or patch the event `patch_of` (creating
    `body` instead when the API server no longer has it)."""

    namespace: str
    body: dict[str, Any]
    patch_of: str = ""
    patch: dict[str, Any] = field(default_factory=dict)


class PodEvents:
    """Events on pods, written off the caller's thread; `sink()` gives the writer (None: nothing to write to)."""

    def __init__(
        self,
        sink: Callable[[], EventWriter | None],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        instance: str | None = None,
    ) -> None:
        self._sink = sink
        self._clock = clock
        self._wall = wall
        self.instance = (instance or f"gpupack-extender-{socket.gethostname()}")[:128]
        self._lock = threading.Lock()  # a leaf lock: nothing is called while it is held
        self._failing: OrderedDict[str, _Failing] = OrderedDict()
        self._queue: queue.Queue[_Write] = queue.Queue(QUEUE_LIMIT)
        self._worker: threading.Thread | None = None
        self._names = itertools.count()
        self.written: Counter[EventReason] = Counter()
        self.failures: Counter[EventFailure] = Counter()

    # ------------------------------------------------------------------ what happened to a pod
    def assigned(self, pod: PodRef, placement: Placement) -> None:
        """The pod was bound to `placement`: an `Assigned` event, and its failures are forgotten."""
        with self._lock:
            self._failing.pop(pod.ident, None)
        self._put(_Write(pod.namespace, self._event(pod, EventReason.ASSIGNED, assignment_note(placement))))

    def note(self, pod: PodRef, note: str, *, warning: bool = False) -> None:
        """A DRA allocation for the pod (`AllocatedClaims`), or why it was left to kube-scheduler (a Warning)."""
        reason = EventReason.CLAIMS_LEFT if warning else EventReason.CLAIMS_ALLOCATED
        self._put(_Write(pod.namespace, self._event(pod, reason, _clip(note))))

    def failed(self, pod: PodRef, why: Callable[[], str]) -> None:
        """A filter or bind of the pod failed; `why()` (called only when a Warning is due) gives the note."""
        with self._lock:
            now = self._clock()
            track = self._failing.pop(pod.ident, None) or self._room(now)
            if track is None:
                self._untracked()
                return
            self._failing[pod.ident] = track  # the most recent last
            track.failures += 1
            track.last_failed = now
            due = track.failures >= REPEATED_FAILURES and (
                track.reported_at is None or now - track.reported_at >= WARNING_INTERVAL_SECONDS
            )
            if not due:
                return
            track.reported_at = now
        note = _clip(why())  # outside the lock: it may walk every candidate's reason
        with self._lock:
            if note == track.note and track.event:
                track.count += 1
                series = {"count": track.count, "lastObservedTime": micro_time(self._wall())}
                body = self._event(pod, EventReason.FAILED, note, name=track.event)
                write = _Write(pod.namespace, body, track.event, {"series": series})
            else:
                body = self._event(pod, EventReason.FAILED, note)
                track.note, track.event, track.count = note, body["metadata"]["name"], 1
                write = _Write(pod.namespace, body)
        self._put(write)

    def _room(self, now: float) -> _Failing | None:
        """A new pod's track: None when `TRACKED_PODS` are tracked and none is stale (under the lock)."""
        if len(self._failing) >= TRACKED_PODS:
            oldest = next(iter(self._failing.values()))
            if now - oldest.last_failed < STALE_SECONDS:
                return None
            self._failing.popitem(last=False)
        return _Failing()

    def _untracked(self) -> None:
        if not self.failures[EventFailure.UNTRACKED]:
            logger.warning("more than %d pods keep failing: the failures of the others are not counted", TRACKED_PODS)
        self.failures[EventFailure.UNTRACKED] += 1

    def forget(self, ident: str) -> None:
        """The pod is gone: its failures are no longer counted."""
        with self._lock:
            self._failing.pop(ident, None)

    # ------------------------------------------------------------------ read-outs
    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """(events written by reason, events not written by why), for /metrics."""
        with self._lock:
            return {str(k): n for k, n in self.written.items()}, {str(k): n for k, n in self.failures.items()}

    def failing(self) -> dict[str, int]:
        """Failures in a row by pod identity, of the pods being counted."""
        with self._lock:
            return {ident: track.failures for ident, track in self._failing.items()}

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued event has been written or has failed; False when `timeout` passed first."""
        deadline = time.monotonic() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        return True

    # ------------------------------------------------------------------ writing
    def _event(self, pod: PodRef, reason: EventReason, note: str, name: str = "") -> dict[str, Any]:
        """The events.k8s.io/v1 Event; named `<pod>.<hex>` as client-go names its events."""
        wall = self._wall()
        if not name:
            suffix = f".{time.time_ns():x}{next(self._names):x}"
            name = pod.name[: NAME_LIMIT - len(suffix)] + suffix
        regarding = {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name}
        if pod.uid:
            regarding["uid"] = pod.uid
        failed = reason in (EventReason.FAILED, EventReason.CLAIMS_LEFT)
        return {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": pod.namespace},
            "eventTime": micro_time(wall),
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": self.instance,
            "action": "Scheduling" if failed else "Binding",
            "reason": str(reason),
            "type": "Warning" if failed else "Normal",
            "note": note,
            "regarding": regarding,
        }

    def _put(self, write: _Write) -> None:
        """Queue a write without waiting; start the writer thread if it is not running."""
        if self._sink() is None:
            return  # no cluster to write to (explain, tests without a writer)
        with self._lock:
            try:
                self._queue.put_nowait(write)
            except queue.Full:
                self.failures[EventFailure.QUEUE_FULL] += 1
                logger.debug("event queue full; dropped %s on pod %s", write.body["reason"], write.body["regarding"])
                return
            if self._worker is None:
                self._worker = threading.Thread(target=self._drain, name="gpupack-pod-events", daemon=True)
                self._worker.start()

    def _drain(self) -> None:
        """The writer thread: write queued events one by one; end when idle."""
        while True:
            try:
                write = self._queue.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._worker = None
                        return
                continue
            try:
                self._write(write)
            finally:
                self._queue.task_done()

    def _write(self, write: _Write) -> None:
        reason = EventReason(write.body["reason"])
        try:
            sink = self._sink()
            if sink is None:
                raise RuntimeError("no cluster writer")
            if write.patch_of:
                try:
                    sink.patch_event(write.namespace, write.patch_of, write.patch)
                except Exception as exc:
                    if getattr(exc, "status", None) != 404:
                        raise
                    sink.create_event(write.namespace, write.body)  # its first write was lost: write it anew
            else:
                sink.create_event(write.namespace, write.body)
        except Exception as exc:
            with self._lock:
                self.failures[EventFailure.WRITE] += 1
            logger.debug("could not write event %s on pod %s: %s", reason, write.body["regarding"], exc)
            return
        with self._lock:
            self.written[reason] += 1
