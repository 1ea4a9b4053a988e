"""List/watch Nodes and Pods of a live cluster and turn them into source events.

Per kind, one thread runs the loop the ``kubernetes`` client's ``watch`` module and client-go's
reflector taught everybody:

1. list, remember the list's resourceVersion, replace the consumer's picture of that kind (Deleted for
   what vanished, Upserted for everything present), emit ``Synced`` once every kind has been listed;
2. watch from the remembered resourceVersion with bookmarks and a server-side timeout, remembering the
   resourceVersion of every event (a BOOKMARK only moves the resourceVersion);
3. stream ended or connection failed: watch again from the remembered resourceVersion (backing off
   when the stream was not healthy); 410 Gone (as an ERROR event or an ``ApiException``): back to 1.

PodDisruptionBudgets are watched too when the API offers them (`BudgetApi`), for preemption (#28); their
list does not gate ``Synced`` (a cluster that refuses them, or an RBAC without them, still schedules:
budgets only weigh the choice of victims). PodGroups of both kinds gangs read (#29) are watched likewise
when the API offers them (`GroupApi`), without gating ``Synced``; where a kind's CRD is not installed its
list gets 404: that is logged once at INFO and the list retried with the backoff, so a CRD installed
later is picked up. ResourceSlices, ResourceClaims and DeviceClasses (#30, the DRA inventory) are watched the
same way when the API offers them (`DraApi`), in the newest version the cluster serves, without gating
``Synced``; a cluster without resource.k8s.io answers 404, retried quietly.
Pods are watched in every namespace because CPU and memory of every pod on a GPU node count; a pod that
turns Succeeded or Failed is reported as deleted since it no longer holds resources.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpupack.errors import GpupackError
from gpupack.kube.pods import pod_is_terminal, pod_key
from gpupack.kube.sources.events import (
    BudgetDeleted,
    BudgetUpserted,
    DraDeleted,
    DraUpserted,
    Event,
    EventHandler,
    GroupDeleted,
    GroupUpserted,
    JsonObject,
    NodeDeleted,
    NodeUpserted,
    PodDeleted,
    PodUpserted,
    Synced,
    dra_key,
    object_name,
    object_uid,
    resource_version,
)
from gpupack.kube.sources.kube_api import (
    DRA_KINDS,
    HTTP_GONE,
    HTTP_NOT_FOUND,
    POD_GROUP_KINDS,
    BudgetApi,
    DraApi,
    DraKind,
    GroupApi,
    KubeApi,
    ObjectList,
    PodGroupKind,
    WatchEvent,
)

logger = logging.getLogger(__name__)


class Backoff:
    """Capped exponential backoff with jitter: the n-th failure waits U(d/2, d), d = min(cap, base·2ⁿ⁻¹)."""

    def __init__(self, base: float = 0.5, cap: float = 30.0, rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        """Count one more failure and return how long to wait before the next attempt."""
        self.failures += 1
        # the exponent stops growing once the cap is reached: 2**n of a long outage would overflow a float
        ceiling = min(self.cap, self.base * 2.0 ** min(self.failures - 1, 64))
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        """Forget past failures after a healthy attempt."""
        self.failures = 0


@dataclass(frozen=True, slots=True)
class KindSpec:
    """How one kind is listed, watched and mapped to events."""

    kind: str
    list: Callable[[], ObjectList]
    watch: Callable[[str, int], Iterator[WatchEvent]]
    key: Callable[[JsonObject], str]
    live: Callable[[JsonObject], bool]
    upserted: Callable[[JsonObject], Event]
    deleted: Callable[[str, str], Event]
    gates_sync: bool = True  # ``Synced`` waits for this kind's list
    optional: bool = False  # a custom resource: 404 means its CRD is not installed (yet), retried quietly


def node_spec(api: KubeApi) -> KindSpec:
    """The Node kind: every node is live; key is the name."""
    return KindSpec(
        kind="Node",
        list=api.list_nodes,
        watch=api.watch_nodes,
        key=object_name,
        live=lambda node: True,
        upserted=NodeUpserted,
        deleted=lambda name, uid: NodeDeleted(name),
    )


def budget_spec(api: BudgetApi) -> KindSpec:
    """The PodDisruptionBudget kind (policy/v1): every budget is live; key is ``namespace/name``."""
    return KindSpec(
        kind="PodDisruptionBudget",
        list=api.list_pdbs,
        watch=api.watch_pdbs,
        key=pod_key,
        live=lambda budget: True,
        upserted=BudgetUpserted,
        deleted=BudgetDeleted,
        gates_sync=False,  # budgets only weigh victims: a cluster that will not list them still schedules
    )


def group_spec(api: GroupApi, kind: PodGroupKind) -> KindSpec:
    """A PodGroup kind (a custom resource, #29): every group is live; key is ``namespace/name``."""
    return KindSpec(
        kind=f"PodGroup.{kind.group}",
        list=partial(api.list_pod_groups, kind),
        watch=partial(api.watch_pod_groups, kind),
        key=pod_key,
        live=lambda group: True,
        upserted=GroupUpserted,
        deleted=lambda key, uid: GroupDeleted(key, uid, kind.group),
        gates_sync=False,  # a cluster without the CRDs still schedules
        optional=True,
    )


def dra_spec(api: DraApi, kind: DraKind) -> KindSpec:
    """A resource.k8s.io kind (#30): every object is live; key is ``namespace/name`` for claims, else the name."""
    return KindSpec(
        kind=kind.kind,
        list=partial(api.list_dra, kind),
        watch=partial(api.watch_dra, kind),
        key=dra_key,
        live=lambda obj: True,
        upserted=DraUpserted,
        deleted=lambda key, uid: DraDeleted(kind.kind, key, uid),
        gates_sync=False,  # a cluster without DRA (or an RBAC without it) still schedules device-plugin GPUs
        optional=True,
    )


def pod_spec(api: KubeApi) -> KindSpec:
    """The Pod kind: live while not terminal; key is ``namespace/name``."""
    return KindSpec(
        kind="Pod",
        list=api.list_pods,
        watch=api.watch_pods,
        key=pod_key,
        live=lambda pod: not pod_is_terminal(pod),
        upserted=PodUpserted,
        deleted=PodDeleted,
    )


class _Gone(Exception):
    """The resourceVersion expired (410): only a relist can continue."""


class _Resync(Exception):
    """The consumer raised while handling an event: relist to give it the whole picture again."""


class WatchError(GpupackError, RuntimeError):
    """The server ended a watch with an ERROR event other than 410."""


class KubernetesSource:
    """Nodes and Pods of a cluster as a stream of source events pushed to ``on_event``.

    ``on_event`` is called from the source's threads, one event at a time (never concurrently), and
    must not block for long. If it raises, the error is logged and the kind is relisted after a backoff.
    The source also forwards the binder's one write (``create_binding``) and the events on pods to the
    API, so the service talks to one object whether it runs on a cluster or on a cluster file.
    """

    def __init__(
        self,
        api: KubeApi,
        on_event: EventHandler,
        *,
        watch_timeout_seconds: int = 300,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        healthy_after: float = 5.0,
        sleep: Callable[[float], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        """Set up (not start) the source.

        A watch counts as healthy, resetting the backoff, when it delivered an event or lasted at least
        ``healthy_after`` seconds; ``sleep`` (default: an interruptible wait), ``clock`` and ``rng``
        are injectable for tests.
        """
        self._api = api
        self._on_event = on_event
        self._watch_timeout = watch_timeout_seconds
        self._backoff_base = backoff_base
        self._backoff_cap = backoff_cap
        self._healthy_after = healthy_after
        self._stopping = threading.Event()
        self._sleep = sleep or self._stopping.wait
        self._clock = clock
        self._rng = rng or random.Random()
        self.emit_lock = threading.RLock()
        """Held while events are delivered: batches (a relist and its Synced) are never interleaved."""
        self._synced = threading.Event()
        self._reflectors = [_Reflector(self, node_spec(api)), _Reflector(self, pod_spec(api))]
        if isinstance(api, BudgetApi):  # PodDisruptionBudgets, for preemption's victims (#28)
            self._reflectors.append(_Reflector(self, budget_spec(api)))
        if isinstance(api, GroupApi):  # PodGroups, for gang placement (#29)
            self._reflectors.extend(_Reflector(self, group_spec(api, kind)) for kind in POD_GROUP_KINDS)
        if isinstance(api, DraApi):  # ResourceSlices, ResourceClaims, DeviceClasses (#30)
            self._reflectors.extend(_Reflector(self, dra_spec(api, kind)) for kind in DRA_KINDS)
        self._listed: set[str] = set()
        self._threads: list[threading.Thread] = []

    @property
    def synced(self) -> bool:
        """True once the initial lists of all kinds have been applied."""
        return self._synced.is_set()

    def listed(self, kinds: Iterable[str]) -> bool:
        """Every one of `kinds` has been listed once (kinds that do not gate Synced, such as DRA's, included)."""
        return set(kinds) <= self._listed

    def start(self) -> None:
        """Start one list/watch thread per kind."""
        if self._threads:
            raise RuntimeError("KubernetesSource already started")
        for reflector in self._reflectors:
            name = f"gpupack-{reflector.kind.lower()}-watch"
            thread = threading.Thread(target=reflector.run, name=name, daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the loops, interrupting pending watches, and wait up to ``timeout`` seconds for them; True
        when every loop has ended."""
        self._stopping.set()
        for reflector in self._reflectors:
            reflector.interrupt()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Wait until the initial lists are applied; False when ``timeout`` passed first."""
        return self._synced.wait(timeout)

    def resource_version(self, kind: str) -> str:
        """The last resourceVersion seen for ``kind`` ("Node", "Pod", "PodDisruptionBudget",
        "PodGroup.<API group>", "ResourceSlice", "ResourceClaim" or "DeviceClass")."""
        return next(r.resource_version for r in self._reflectors if r.kind == kind)

    def create_binding(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        """Forward to ``KubeApi.create_binding``."""
        self._api.create_binding(namespace, name, uid, node, annotations)

    def create_event(self, namespace: str, event: JsonObject) -> None:
        """Forward to ``KubeApi.create_event``."""
        self._api.create_event(namespace, event)

    def patch_event(self, namespace: str, name: str, patch: JsonObject) -> None:
        """Forward to ``KubeApi.patch_event``."""
        self._api.patch_event(namespace, name, patch)

    # -- used by the reflectors -------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """True once ``stop()`` was called."""
        return self._stopping.is_set()

    def watch_window(self) -> tuple[int, float, Callable[[], float]]:
        """Server-side watch timeout, healthy-after seconds and the clock that measures them."""
        return self._watch_timeout, self._healthy_after, self._clock

    def deliver(self, event: Event) -> bool:
        """Hand one event to the consumer; False when it raised (logged). Caller holds the emit lock."""
        try:
            self._on_event(event)
        except Exception:
            logger.exception("source consumer failed on %s", type(event).__name__)
            return False
        return True

    def mark_listed(self, kind: str) -> bool:
        """Record a completed (re)list; emit ``Synced`` when every kind that gates it has been listed
        (the list of a kind that does not gate it emits nothing: ``Synced`` promises fresh nodes and pods)."""
        self._listed.add(kind)
        if not next(r.gates_sync for r in self._reflectors if r.kind == kind):
            return True
        if any(r.gates_sync and r.kind not in self._listed for r in self._reflectors):
            return True
        delivered = self.deliver(Synced())
        self._synced.set()
        return delivered

    def make_backoff(self) -> Backoff:
        """A fresh backoff for one loop, with its own jitter stream."""
        return Backoff(self._backoff_base, self._backoff_cap, random.Random(self._rng.random()))

    def sleep(self, seconds: float) -> None:
        """Wait before the next attempt (returns early, or at once, when stopping)."""
        if seconds > 0 and not self.stopping:
            self._sleep(seconds)


class _Reflector:
    """The list/watch loop of one kind, and what the consumer has been told about it."""

    def __init__(self, source: KubernetesSource, spec: KindSpec) -> None:
        self._source = source
        self._spec = spec
        self.kind = spec.kind
        self.gates_sync = spec.gates_sync
        self.resource_version = ""
        self._known: dict[str, str] = {}  # key -> uid of every object the consumer holds
        self._consumer_failed = False
        self._stream: Iterator[WatchEvent] | None = None
        self._told_absent = False  # the kind's 404 (CRD missing) has been logged

    def run(self) -> None:
        """Loop until the source stops: list, watch, re-watch, relist on 410."""
        backoff = self._source.make_backoff()
        must_list = True
        while not self._source.stopping:
            try:
                if must_list:
                    self._relist()
                    must_list = False
                if self._watch_once():
                    backoff.reset()
                    continue
                failure: Exception = WatchError(f"{self.kind} watch ended without any event")
            except (_Gone, _Resync) as exc:
                must_list = True
                failure = exc
            except Exception as exc:
                failure = exc
            if self._source.stopping:
                break
            if self._absent(failure):
                must_list = True  # the CRD went away under a watch: list again until it is back
            delay = backoff.next_delay()
            if isinstance(failure, _Gone) and backoff.failures == 1:
                delay = 0.0  # the first 410 after a healthy watch relists at once
            self._report(failure, must_list, delay)
            self._source.sleep(delay)

    def _absent(self, failure: Exception) -> bool:
        """Whether ``failure`` says the API does not serve this (optional) kind."""
        return self._spec.optional and isinstance(failure, ApiException) and failure.status == HTTP_NOT_FOUND

    def _report(self, failure: Exception, must_list: bool, delay: float) -> None:
        """Log a failed attempt: a warning, except a missing CRD or API group, told once at INFO until it is served."""
        if self._absent(failure):
            if not self._told_absent:
                self._told_absent = True
                logger.info("%s is not served (CRD or API group not installed?); retrying with backoff", self.kind)
            return
        logger.warning(
            "%s %s: %s; %s in %.2fs",
            self.kind,
            type(failure).__name__,
            failure,
            "relisting" if must_list else "watching again",
            delay,
        )

    def interrupt(self) -> None:
        """Close the pending watch, if any, so that a blocked read returns."""
        close = getattr(self._stream, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # a generator running in the other thread cannot be closed; fine
                logger.debug("could not close %s watch", self.kind, exc_info=True)

    def _relist(self) -> None:
        listing = self._spec.list()
        self._told_absent = False
        spec = self._spec
        with self._source.emit_lock:
            present = {spec.key(obj): obj for obj in listing.items if spec.live(obj)}
            for key, uid in list(self._known.items()):
                obj = present.get(key)
                if obj is None or object_uid(obj) != uid:
                    del self._known[key]
                    self._emit(spec.deleted(key, uid))
            for key, obj in present.items():
                self._known[key] = object_uid(obj)
                self._emit(spec.upserted(obj))
            self.resource_version = listing.resource_version
            if not self._source.mark_listed(self.kind):
                self._consumer_failed = True
        logger.info("%s listed: %d live, resourceVersion %s", self.kind, len(present), self.resource_version)
        self._raise_if_consumer_failed()

    def _watch_once(self) -> bool:
        """Run one watch until it ends; True when it was healthy."""
        timeout_seconds, healthy_after, clock = self._source.watch_window()
        started = clock()
        delivered = False
        try:
            self._stream = self._spec.watch(self.resource_version, timeout_seconds)
            if self._source.stopping:
                return True
            for raw in self._stream:
                if self._source.stopping:
                    return True
                self._handle(raw)
                delivered = True
            if self._source.stopping:
                return True
        except ApiException as exc:
            if exc.status == HTTP_GONE:
                raise _Gone(f"resourceVersion {self.resource_version} expired: {exc.reason}") from exc
            raise
        finally:
            self._stream = None
        return delivered or clock() - started >= healthy_after

    def _handle(self, raw: WatchEvent) -> None:
        kind_of_event = raw.get("type")
        obj = raw.get("object")
        if not isinstance(obj, dict):
            logger.warning("%s watch event %s without an object", self.kind, kind_of_event)
            return
        if kind_of_event == "ERROR":
            message = f"{obj.get('reason')}: {obj.get('message')}"
            if obj.get("code") == HTTP_GONE:
                raise _Gone(f"resourceVersion {self.resource_version} expired: {message}")
            raise WatchError(f"{self.kind} watch error {obj.get('code')}: {message}")
        version = resource_version(obj)
        if version:
            self.resource_version = version
        if kind_of_event == "BOOKMARK":
            return
        if kind_of_event not in ("ADDED", "MODIFIED", "DELETED"):
            logger.warning("%s watch event of unknown type %r ignored", self.kind, kind_of_event)
            return
        with self._source.emit_lock:
            self._apply(obj, deleted=kind_of_event == "DELETED")
        self._raise_if_consumer_failed()

    def _apply(self, obj: JsonObject, *, deleted: bool) -> None:
        if not object_name(obj):
            logger.warning("%s watch object without a name ignored", self.kind)
            return
        spec = self._spec
        key, uid = spec.key(obj), object_uid(obj)
        known_uid = self._known.get(key)
        if deleted or not spec.live(obj):
            if known_uid is not None and (not deleted or known_uid == uid or not uid):
                del self._known[key]
                self._emit(spec.deleted(key, known_uid))
            return
        if known_uid is not None and known_uid != uid:
            self._emit(spec.deleted(key, known_uid))  # recreated under the same name
        self._known[key] = uid
        self._emit(spec.upserted(obj))

    def _emit(self, event: Event) -> None:
        if not self._source.deliver(event):
            self._consumer_failed = True

    def _raise_if_consumer_failed(self) -> None:
        if self._consumer_failed:
            self._consumer_failed = False
            raise _Resync(f"consumer failed on a {self.kind} event")
