"""The extender verbs as body bytes in, body bytes out: parse (extender.wire), ask the state, serialise.

Raises WireError for a body kube-scheduler would never send (the HTTP layer answers 400); everything
about the pod itself is answered in the verb's own terms (per-node verdicts, or a bind `Error`).

Bounds on one call (#13 item 3): filter and prioritize stop with `Abandoned` between phases (after
parsing, before deciding, before building the answer) once their `Deadline` has passed or their
caller has hung up, before anything is committed; and the HTTP layer lets only
`maxHeavyInFlight` large bodies in at once (`HeavyGate`).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpupack.extender.binder import NOT_SYNCED, BindError
from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.extender.wire import (
    MAX_NAME_CHARS,
    MAX_NAMESPACE_CHARS,
    MAX_UID_CHARS,
    ExtenderBindingResult,
    ExtenderPreemptionResult,
    HostPriority,
    MetaPod,
    MetaVictims,
    WireError,
    filter_error,
    filter_result,
    parse_binding_args,
    parse_extender_args,
    parse_preemption_args,
    priorities_json,
)

T = TypeVar("T")


class Abandoned(Exception):
    """The call's answer is no longer wanted (deadline passed, caller gone); nothing was committed."""

    def __init__(self, reason: str, caller_gone: bool) -> None:
        super().__init__(reason)
        self.caller_gone = caller_gone


@dataclass
class Deadline:
    """When a call's answer stops being useful: at `at` (time.perf_counter), or once `gone` is set."""

    at: float = math.inf
    gone: threading.Event = field(default_factory=threading.Event)  # set by the HTTP layer on disconnect

    def check(self, phase: str) -> None:
        """Abandoned when the answer is no longer wanted; `phase` says what would come next."""
        if self.gone.is_set():
            raise Abandoned(f"the caller left before {phase}", caller_gone=True)
        if time.perf_counter() > self.at:
            raise Abandoned(f"the deadline passed before {phase}", caller_gone=False)


NO_DEADLINE = Deadline()  # never passes and is never set: for callers without a client (tests, warm-up)


class HeavyGate:
    """At most `slots` heavy calls at once (bodies over `heavyBodyBytes`; parsing one costs up to ~20x
    its size). A slot is held until the call's work has stopped, even when the call was answered
    earlier (verbTimeoutSeconds), so abandoned work never piles up. Used on the event loop only."""

    def __init__(self, slots: int) -> None:
        self._free = asyncio.Semaphore(slots)

    async def take(self, seconds: float) -> HeavySlot | None:
        """A slot, or None when none came free within `seconds`."""
        try:
            async with asyncio.timeout(max(seconds, 0.0)):
                await self._free.acquire()
        except TimeoutError:
            return None
        return HeavySlot(self._free)


class HeavySlot:
    """One taken slot of a HeavyGate: released by `close`, or by the work handed to `around` once it ends."""

    def __init__(self, free: asyncio.Semaphore) -> None:
        self._free: asyncio.Semaphore | None = free
        self._work_holds_it = False

    def around(self, work: Awaitable[T]) -> Awaitable[T]:
        """`work`, which keeps the slot until it finishes (`close` then leaves the slot alone)."""
        self._work_holds_it = True
        return self._release_after(work)

    async def _release_after(self, work: Awaitable[T]) -> T:
        try:
            return await work
        finally:
            self._release()

    def close(self) -> None:
        """Give the slot back, unless work handed to `around` holds it."""
        if not self._work_holds_it:
            self._release()

    def _release(self) -> None:
        if self._free is not None:
            self._free.release()
            self._free = None


def filter_body(state: ClusterState, settings: Settings, body: bytes, deadline: Deadline = NO_DEADLINE) -> bytes:
    """Answer `POST /filter`: one chosen node (decideInFilter) or every feasible one.

    Until the state has synced, the answer is an `Error` (kube-scheduler retries with backoff).
    """
    args = parse_extender_args(body, settings.max_candidates)
    check_pod(args.pod)
    deadline.check("deciding")
    if not state.synced:
        return filter_error(NOT_SYNCED).to_json()
    candidates = args.candidates()
    if settings.decide_in_filter:  # the answer is built before the placement is committed

        def answer(chosen: str | None, failed: Mapping[str, str], unresolvable: Mapping[str, str]) -> bytes:
            deadline.check("answering")  # raised here, nothing is committed
            return filter_result(args, [chosen] if chosen else [], failed, unresolvable).to_json()

        return state.decide_for_filter(args.pod, candidates, answer)
    passed, failed, unresolvable = state.feasible_for_filter(args.pod, candidates)
    deadline.check("answering")
    return filter_result(args, passed, failed, unresolvable).to_json()


def prioritize_body(state: ClusterState, body: bytes, deadline: Deadline = NO_DEADLINE) -> bytes:
    """Answer `POST /prioritize`: every candidate with a score 0..10."""
    args = parse_extender_args(body, state.settings.max_candidates)
    check_pod(args.pod)
    deadline.check("scoring")
    scores = state.scores_for_prioritize(args.pod, args.candidate_names())
    deadline.check("answering")
    return priorities_json(HostPriority(host=host, score=score) for host, score in scores)


def preempt_body(state: ClusterState, body: bytes, deadline: Deadline = NO_DEADLINE) -> bytes:
    """Answer `POST /preempt`: per proposed node, the victims gpupack chose by uid; other nodes left out."""
    args = parse_preemption_args(body, state.settings.max_candidates)
    check_pod(args.pod)
    deadline.check("planning")
    plans = state.plan_preemption(args.pod, args.candidate_names(), deadline.check)
    deadline.check("answering")
    return ExtenderPreemptionResult(
        node_name_to_meta_victims={
            node: MetaVictims(
                pods=[MetaPod(uid=victim.uid) for victim in plan.victims],
                num_pdb_violations=sum(victim.breaks_budget for victim in plan.victims),
            )
            for node, plan in plans.items()
        }
    ).to_json()


def bind_body(state: ClusterState, body: bytes) -> bytes:
    """Answer `POST /bind`: `{"Error": ""}` once annotated and bound, else the reason."""
    args = parse_binding_args(body)
    for what, value in (
        ("PodName", args.pod_name),
        ("PodNamespace", args.pod_namespace),
        ("Node", args.node),
    ):
        if not value:
            raise WireError(f"{what} must not be empty")
    try:
        state.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
    except BindError as exc:
        return ExtenderBindingResult(error=exc.reason).to_json()
    return ExtenderBindingResult().to_json()


def check_pod(pod: Mapping[str, Any]) -> None:
    """The few Pod fields gpupack reads must have their API types; WireError otherwise."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, Mapping):
        raise WireError("Pod.metadata must be an object")
    if not isinstance(metadata.get("name"), str) or not metadata["name"]:
        raise WireError("Pod.metadata.name must be a non-empty string")
    for key, longest in (("name", MAX_NAME_CHARS), ("namespace", MAX_NAMESPACE_CHARS), ("uid", MAX_UID_CHARS)):
        value = metadata.get(key)
        if value is not None and not isinstance(value, str):
            raise WireError(f"Pod.metadata.{key} must be a string")
        if value is not None and len(value) > longest:  # kept per pod in the state's `_seen` (#13)
            raise WireError(f"Pod.metadata.{key} of {len(value)} characters exceeds Kubernetes' {longest}")
    for key in ("annotations", "labels"):
        value = metadata.get(key)
        if value is not None and not (isinstance(value, Mapping) and all(isinstance(v, str) for v in value.values())):
            raise WireError(f"Pod.metadata.{key} must map strings to strings")
    spec = pod.get("spec")
    if spec is not None and not isinstance(spec, Mapping):
        raise WireError("Pod.spec must be an object")
    if spec is not None and spec.get("nodeName") is not None and not isinstance(spec["nodeName"], str):
        raise WireError("Pod.spec.nodeName must be a string")
