"""Leader election on a coordination.k8s.io Lease, for the defrag loop (#31): one replica evicts, the others wait.

The Lease also carries the loop's eviction budget: the times of the evictions of the last window, in the
annotation `gpupack.io/defrag-evictions`, so a replica that takes over spends what is left of the window,
not a fresh one.

Expiry is judged on this process's own monotonic clock, from when it last saw the Lease's record change
(as client-go does): two hosts' wall clocks need not agree. Every write replaces the Lease at the
resourceVersion it read, so of two candidates racing for an expired Lease one gets 409 and stays a follower.

Why not `kubernetes.leaderelection` (the official client's): it runs the leader's work in a daemon thread it
cannot stop when the Lease is lost, reads the process-wide default configuration, and has no way to renew
right before an action, which is how the loop makes sure it still leads before each eviction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

logger = logging.getLogger(__name__)

ANNOTATION_EVICTIONS = "gpupack.io/defrag-evictions"
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409


@dataclass(frozen=True)
class LeaseRecord:
    """What a Lease says: who holds it, for how long, and the evictions (Unix seconds) it records."""

    holder: str
    duration_seconds: int
    renewed: datetime | None  # only compared, never against this host's clock (the writer's may differ)
    transitions: int = 0
    evictions: tuple[float, ...] = ()
    version: str = ""  # resourceVersion read; "" for a Lease not created yet


class Leases(Protocol):
    """Reading and writing one Lease."""

    def read(self) -> LeaseRecord | None:
        """The Lease, None when there is none."""

    def write(self, record: LeaseRecord) -> bool:
        """Create (no version) or replace (at `record.version`) the Lease: False when another write won (409)."""


class LeaseElector:
    """Holds the Lease while it can (see the module docstring); `hold` is one acquire-or-renew round."""

    def __init__(
        self,
        leases: Leases,
        identity: str,
        duration_seconds: int = 30,
        keep_seconds: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.leases = leases
        self.identity = identity
        self.duration_seconds = duration_seconds
        self.keep_seconds = keep_seconds  # evictions older than this are dropped from the Lease
        self.clock = clock
        self.wall = wall
        self._seen: tuple[str, datetime | None] | None = None  # (holder, renewed) last read, and when (own clock)
        self._seen_at = 0.0
        self._evictions: tuple[float, ...] = ()
        self.leading = False

    def hold(self, spend: Sequence[float] = ()) -> bool:
        """Acquire or renew the Lease, recording the eviction times `spend` in it; whether this process leads
        now. An API error counts as not leading (logged), so nothing is evicted on a Lease not renewed."""
        try:
            self.leading = self._hold(tuple(spend))
        except (ApiException, OSError) as exc:
            logger.warning("defrag: lease not renewed: %s", exc)
            self.leading = False
        return self.leading

    def evictions(self) -> tuple[float, ...]:
        """The eviction times the Lease recorded when last read."""
        return self._evictions

    def _hold(self, spend: tuple[float, ...]) -> bool:
        current = self.leases.read()
        now = self.clock()
        if current is not None and (current.holder, current.renewed) != self._seen:
            self._seen, self._seen_at = (current.holder, current.renewed), now
        if current is not None and not self._may_take(current, now):
            self._evictions = current.evictions
            return False
        since = self.wall() - self.keep_seconds
        evictions = tuple(t for t in (current.evictions if current is not None else ()) if t > since) + spend
        record = self._record(current, evictions)
        if not self.leases.write(record):
            return False
        self._seen, self._seen_at, self._evictions = (record.holder, record.renewed), now, evictions
        return True

    def _may_take(self, current: LeaseRecord, now: float) -> bool:
        """Ours, released (no holder), or not renewed for its whole duration as seen from here."""
        if current.holder in (self.identity, ""):
            return True
        return now >= self._seen_at + current.duration_seconds

    def _record(self, current: LeaseRecord | None, evictions: tuple[float, ...]) -> LeaseRecord:
        renewed = datetime.fromtimestamp(self.wall(), UTC)
        if current is None:
            return LeaseRecord(self.identity, self.duration_seconds, renewed, 0, evictions)
        transitions = current.transitions + (current.holder != self.identity)
        return replace(
            current,
            holder=self.identity,
            duration_seconds=self.duration_seconds,
            renewed=renewed,
            transitions=transitions,
            evictions=evictions,
        )

    def release(self) -> None:
        """Give the Lease up (on shutdown), so another replica takes over at once instead of after its expiry."""
        if not self.leading:
            return
        self.leading = False
        try:
            current = self.leases.read()
            if current is not None and current.holder == self.identity:
                self.leases.write(replace(current, holder=""))
        except (ApiException, OSError) as exc:
            logger.warning("defrag: lease not released: %s", exc)


class OfficialLeases:
    """`Leases` over the official client: one Lease `name` in `namespace` (RBAC: create, get, update)."""

    def __init__(self, api_client: client.ApiClient, namespace: str, name: str, request_timeout: float = 10.0) -> None:
        self._api = client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = name
        self._timeout = request_timeout

    def read(self) -> LeaseRecord | None:
        """See `Leases.read`."""
        try:
            lease = self._api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                return None
            raise
        spec = lease.spec or client.V1LeaseSpec()
        metadata = lease.metadata or client.V1ObjectMeta()
        annotations = metadata.annotations or {}
        return LeaseRecord(
            spec.holder_identity or "",
            spec.lease_duration_seconds or 0,
            spec.renew_time,
            spec.lease_transitions or 0,
            _evictions(annotations.get(ANNOTATION_EVICTIONS)),
            metadata.resource_version or "",
        )

    def write(self, record: LeaseRecord) -> bool:
        """See `Leases.write`."""
        body = self._body(record)
        try:
            if record.version:
                self._api.replace_namespaced_lease(self.name, self.namespace, body, _request_timeout=self._timeout)
            else:
                self._api.create_namespaced_lease(self.namespace, body, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == HTTP_CONFLICT:
                return False
            raise
        return True

    def _body(self, record: LeaseRecord) -> client.V1Lease:
        annotations = {ANNOTATION_EVICTIONS: orjson.dumps([round(t, 3) for t in record.evictions]).decode()}
        metadata = client.V1ObjectMeta(name=self.name, namespace=self.namespace, annotations=annotations)
        if record.version:
            metadata.resource_version = record.version
        return client.V1Lease(
            metadata=metadata,
            spec=client.V1LeaseSpec(
                holder_identity=record.holder or None,
                lease_duration_seconds=record.duration_seconds,
                renew_time=record.renewed,
                lease_transitions=record.transitions,
            ),
        )


def _evictions(text: str | None) -> tuple[float, ...]:
    """The annotation's eviction times; a value that is not a list of numbers counts as none (logged)."""
    if not text:
        return ()
    try:
        values = orjson.loads(text)
    except orjson.JSONDecodeError:
        values = None
    if not isinstance(values, list) or not all(isinstance(v, int | float) for v in values):
        logger.warning("defrag: lease annotation %s is not a list of times: ignored", ANNOTATION_EVICTIONS)
        return ()
    return tuple(float(v) for v in values)


__all__ = ["ANNOTATION_EVICTIONS", "LeaseElector", "LeaseRecord", "Leases", "OfficialLeases"]
