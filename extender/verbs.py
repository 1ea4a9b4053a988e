"""The three extender verbs as body bytes in, body bytes out: parse (extender.wire), ask the state, serialise.

Raises WireError for a body kube-scheduler would never send (the HTTP layer answers 400); everything
about the pod itself is answered in the verb's own terms (per-node verdicts, or a bind `Error`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from extender.settings import Settings
from extender.state import NOT_SYNCED, BindError, ClusterState
from extender.wire import (
    ExtenderBindingResult,
    HostPriority,
    WireError,
    filter_error,
    filter_result,
    parse_binding_args,
    parse_extender_args,
    priorities_json,
)


def filter_body(state: ClusterState, settings: Settings, body: bytes) -> bytes:
    """Answer `POST /filter`: one chosen node (decideInFilter) or every feasible one.

    Until the state has synced, the answer is an `Error` (kube-scheduler retries with backoff).
    """
    args = parse_extender_args(body)
    check_pod(args.pod)
    if not state.synced:
        return filter_error(NOT_SYNCED).to_json()
    candidates = args.candidates()
    if settings.decide_in_filter:  # the answer is built before the placement is committed

        def answer(chosen: str | None, failed: Mapping[str, str], unresolvable: Mapping[str, str]) -> bytes:
            return filter_result(args, [chosen] if chosen else [], failed, unresolvable).to_json()

        return state.decide_for_filter(args.pod, candidates, answer)
    passed, failed, unresolvable = state.feasible_for_filter(args.pod, candidates)
    return filter_result(args, passed, failed, unresolvable).to_json()


def prioritize_body(state: ClusterState, body: bytes) -> bytes:
    """Answer `POST /prioritize`: every candidate with a score 0..10."""
    args = parse_extender_args(body)
    check_pod(args.pod)
    scores = state.scores_for_prioritize(args.pod, args.candidate_names())
    return priorities_json(HostPriority(host=host, score=score) for host, score in scores)


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
    for key in ("namespace", "uid"):
        if metadata.get(key) is not None and not isinstance(metadata[key], str):
            raise WireError(f"Pod.metadata.{key} must be a string")
    for key in ("annotations", "labels"):
        value = metadata.get(key)
        if value is not None and not (isinstance(value, Mapping) and all(isinstance(v, str) for v in value.values())):
            raise WireError(f"Pod.metadata.{key} must map strings to strings")
    spec = pod.get("spec")
    if spec is not None and not isinstance(spec, Mapping):
        raise WireError("Pod.spec must be an object")
    if spec is not None and spec.get("nodeName") is not None and not isinstance(spec["nodeName"], str):
        raise WireError("Pod.spec.nodeName must be a string")
