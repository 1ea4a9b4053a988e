"""PodRequest from a v1.Pod (as a JSON dict), and the placement its `gpupack.io/assignment` records.

Resources (docs/contracts.md#pod-resources), computed as kube-scheduler does for its resource fit:
- per container, cpu and memory come from requests (limits when a request is absent), GPU-type
  resources from limits (requests when a limit is absent; Kubernetes requires them equal anyway);
- containers are summed; init containers follow the max rule — the pod needs
  max(sum of containers, largest init container), where restartable (sidecar) init containers run
  alongside everything started after them and so add to both sides;
- `spec.overhead` adds its cpu and memory.
Any parse problem is a RequestError naming the container and the resource.

GPU product constraint: `nodeSelector` and required node affinity on `nvidia.com/gpu.product`,
expressed as a set of allowed products only when it is a set — every affinity term pins the product
with `In` (less its `NotIn` values); otherwise (`NotIn` / `Exists` / `DoesNotExist` alone, or a term
not mentioning the product) it is None here and kube-scheduler, which enforces node affinity before
calling gpupack, does the rest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupack.errors import GpupackError
from gpupack.kube.keys import (
    ANNOTATION_ASSIGNMENT,
    ANNOTATION_INTERRUPTIBLE,
    LABEL_GPU_PRODUCT,
    RESOURCE_CPU,
    RESOURCE_GPU,
    RESOURCE_GPU_MILLI,
    RESOURCE_MEMORY,
    RESOURCE_MIG_PREFIX,
    decode_json,
)
from gpupack.kube.pods import pod_key
from gpupack.kube.quantity import QuantityError, parse_bytes, parse_count, parse_cpu_milli
from gpupack.scoring.facts import GpuSlot, Placement
from gpupack.scoring.geometry import (
    FAMILIES,
    ME_RESOURCE_SUFFIX,
    ME_SUFFIX,
    canonical_profile,
    resolve_profile,
    resource_profile,
)
from gpupack.scoring.request import MAX_GPUS_PER_NODE, Kind, PodRequest, RequestError

Amounts = dict[str, int]  # resource name -> amount (cpu in millicores, memory in bytes, else a count)

_SLOT_KEYS = ({"index"}, {"index", "milli"}, {"index", "mig", "start"})


class AssignmentError(GpupackError, ValueError):
    """A `gpupack.io/assignment` annotation that is malformed or does not match the pod's request."""


@dataclass(frozen=True)
class UnreadableCharge:
    """What a bound pod whose request gpupack cannot read is charged: never less than it can be using.

    CPU and memory as parsed when they parse, else None: all that is free on its node. `all_gpus`:
    it asks for some GPU resource (or its resources cannot be read at all), so every free GPU of
    its node is charged, since which devices it got is unknown.
    """

    reason: str
    cpu_milli: int | None
    memory_bytes: int | None
    all_gpus: bool


def request_from_pod(pod: Mapping[str, Any]) -> PodRequest:
    """What the pod asks for. Raises RequestError (a ValueError) with a reason on any problem."""
    spec = _mapping(pod.get("spec"), "spec")
    totals = pod_amounts(spec)
    gpus = totals.get(RESOURCE_GPU, 0)
    milli = totals.get(RESOURCE_GPU_MILLI, 0)
    mig = tuple(
        sorted(
            (canonical_profile(name[len(RESOURCE_MIG_PREFIX) :]), count)
            for name, count in totals.items()
            if name.startswith(RESOURCE_MIG_PREFIX) and count > 0
        )
    )
    kind = next(
        (k for k, used in ((Kind.WHOLE, gpus), (Kind.SHARE, milli), (Kind.MIG, mig)) if used), Kind.NONE
    )
    _mapping((pod.get("metadata") or {}).get("annotations"), "metadata.annotations")  # RequestError if not a map
    return PodRequest(
        cpu_milli=totals.get(RESOURCE_CPU, 0),
        memory_bytes=totals.get(RESOURCE_MEMORY, 0),
        kind=kind,
        gpus=gpus,
        milli=milli,
        mig=mig,
        allowed_products=allowed_products(spec),
        interruptible=pod_is_interruptible(pod),
    )


def pod_is_interruptible(pod: Mapping[str, Any]) -> bool:
    """`gpupack.io/interruptible: "true"` (any case) among the pod's annotations (docs/contracts.md)."""
    annotations = (pod.get("metadata") or {}).get("annotations")
    value = annotations.get(ANNOTATION_INTERRUPTIBLE) if isinstance(annotations, Mapping) else None
    return isinstance(value, str) and value.lower() == "true"


def unreadable_charge(pod: Mapping[str, Any], reason: str) -> UnreadableCharge:
    """The conservative charge of a bound pod whose `request_from_pod` raised RequestError `reason`."""
    try:
        totals = pod_amounts(_mapping(pod.get("spec"), "spec"))
    except RequestError:
        return UnreadableCharge(reason, None, None, all_gpus=True)
    gpu_amounts = [amount for name, amount in totals.items() if name not in (RESOURCE_CPU, RESOURCE_MEMORY)]
    return UnreadableCharge(
        reason, totals.get(RESOURCE_CPU, 0), totals.get(RESOURCE_MEMORY, 0), all_gpus=any(gpu_amounts)
    )


def pod_amounts(spec: Mapping[str, Any]) -> Amounts:
    """Effective resources of a pod spec: containers, init containers (max rule) and overhead."""
    total: Amounts = {}
    for container in _containers(spec, "containers"):
        total = _add(total, container_amounts(container, "container"))
    sidecars: Amounts = {}
    init_peak: Amounts = {}
    for container in _containers(spec, "initContainers"):
        amounts = container_amounts(container, "init container")
        if container.get("restartPolicy") == "Always":  # a sidecar keeps running
            sidecars = _add(sidecars, amounts)
            running = sidecars
        else:
            running = _add(amounts, sidecars)
        init_peak = _max(init_peak, running)
    total = _max(_add(total, sidecars), init_peak)
    overhead = _mapping(spec.get("overhead"), "spec.overhead")
    counted = [name for name in (RESOURCE_CPU, RESOURCE_MEMORY) if name in overhead]
    return _add(total, _amounts("spec.overhead", overhead, {}, counted))


def container_amounts(container: Mapping[str, Any], role: str = "container") -> Amounts:
    """The resources gpupack counts for one container, parsed; RequestError names container and resource."""
    where = f'{role} "{container.get("name", "?")}"'
    resources = _mapping(container.get("resources"), f"{where} resources")
    limits = _mapping(resources.get("limits"), f"{where} limits")
    requests = _mapping(resources.get("requests"), f"{where} requests")
    return _amounts(where, limits, requests, dict.fromkeys([*limits, *requests]))


def _amounts(
    where: str, limits: Mapping[str, Any], requests: Mapping[str, Any], names: Iterable[str]
) -> Amounts:
    amounts: Amounts = {}
    for name in names:
        parse = _parser(where, name)
        if parse is None:
            continue  # ephemeral-storage, hugepages, other devices: not gpupack's business
        first, second = (requests, limits) if name in (RESOURCE_CPU, RESOURCE_MEMORY) else (limits, requests)
        try:
            amounts[name] = parse(first[name] if name in first else second[name])
        except QuantityError as exc:
            raise RequestError(f"{where} {name}: {exc}") from None
    return amounts


def _parser(where: str, name: str) -> Callable[[Any], int] | None:
    if name == RESOURCE_CPU:
        return parse_cpu_milli
    if name == RESOURCE_MEMORY:
        return parse_bytes
    if name in (RESOURCE_GPU, RESOURCE_GPU_MILLI):
        return parse_count
    if name.startswith(RESOURCE_MIG_PREFIX):
        profile = name[len(RESOURCE_MIG_PREFIX) :]
        if "+" in profile:
            spelled = RESOURCE_MIG_PREFIX + profile.replace(ME_SUFFIX, ME_RESOURCE_SUFFIX)
            raise RequestError(f"{where} {name}: a Kubernetes resource name cannot hold '+'; ask for {spelled}")
        if not _known_profile(profile):
            raise RequestError(f"{where} {name}: MIG profile {profile!r} exists on no GPU gpupack knows")
        return parse_count
    return None


def _known_profile(profile: str) -> bool:
    for family in FAMILIES.values():
        try:
            resolve_profile(family, profile)
        except KeyError:
            continue
        return True
    return False


def _add(a: Amounts, b: Amounts) -> Amounts:
    return {name: a.get(name, 0) + b.get(name, 0) for name in a | b}


def _max(a: Amounts, b: Amounts) -> Amounts:
    return {name: max(a.get(name, 0), b.get(name, 0)) for name in a | b}


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RequestError(f"{where} must be an object")
    return value


def _containers(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    containers = spec.get(key) or []
    if not isinstance(containers, list) or not all(isinstance(c, Mapping) for c in containers):
        raise RequestError(f"spec.{key} must be a list of objects")
    return containers


def allowed_products(spec: Mapping[str, Any]) -> frozenset[str] | None:
    """GPU products the pod may run on, from nodeSelector and required node affinity (None: any)."""
    selected = _mapping(spec.get("nodeSelector"), "spec.nodeSelector").get(LABEL_GPU_PRODUCT)
    if selected is not None and not isinstance(selected, str):
        raise RequestError(f"spec.nodeSelector[{LABEL_GPU_PRODUCT}] must be a string")
    by_selector = None if selected is None else frozenset([selected])
    by_affinity = _affinity_products(spec)
    if by_selector is None or by_affinity is None:
        return by_selector if by_affinity is None else by_affinity
    return by_selector & by_affinity


def _affinity_products(spec: Mapping[str, Any]) -> frozenset[str] | None:
    where = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    affinity = _mapping(_mapping(spec.get("affinity"), "spec.affinity").get("nodeAffinity"), where)
    selector = _mapping(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"), where)
    terms = selector.get("nodeSelectorTerms") or []
    if not isinstance(terms, list):
        raise RequestError(f"{where}.nodeSelectorTerms must be a list")
    allowed: set[str] = set()
    for term in terms:  # terms are ORed: the union, unless one term admits any product
        products = _term_products(_mapping(term, f"{where}.nodeSelectorTerms[]"))
        if products is None:
            return None
        allowed |= products
    return frozenset(allowed) if terms else None


def _term_products(term: Mapping[str, Any]) -> frozenset[str] | None:
    """Products one term admits when it pins them with In (expressions are ANDed); None otherwise."""
    pinned: frozenset[str] | None = None
    excluded: set[str] = set()
    expressions = term.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise RequestError("node affinity: matchExpressions must be a list")
    for expression in expressions:
        if not isinstance(expression, Mapping) or expression.get("key") != LABEL_GPU_PRODUCT:
            continue
        values = expression.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise RequestError(f"node affinity on {LABEL_GPU_PRODUCT}: values must be a list of strings")
        if expression.get("operator") == "In":
            pinned = frozenset(values) if pinned is None else pinned & frozenset(values)
        elif expression.get("operator") == "NotIn":
            excluded.update(values)
    return None if pinned is None else pinned - excluded


def assignment_from_pod(
    pod: Mapping[str, Any], request: PodRequest | None = None, annotation: str = ANNOTATION_ASSIGNMENT
) -> Placement | None:
    """The placement recorded in the pod's `gpupack.io/assignment` annotation (or another `annotation` of
    the same format, such as `gpupack.io/defrag-hold`), None when absent.

    CPU and memory come from `request` (computed from the pod when not given; RequestError then
    propagates). Raises AssignmentError when the annotation is malformed, names another node than
    the one the pod is bound to, or does not match what the pod asks for.
    """
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(annotation)
    if text is None:
        return None
    if request is None:
        request = request_from_pod(pod)
    try:
        placement = parse_assignment(decode_json(text), request)
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound and bound != placement.node:
            raise ValueError(f"names node {placement.node!r} but the pod is bound to {bound!r}")
    except ValueError as exc:
        raise AssignmentError(f"pod {pod_key(pod)}: {annotation}: {exc}") from None
    return placement


def parse_assignment(data: object, request: PodRequest) -> Placement:
    """A decoded assignment (docs/contracts.md#assignment) as a Placement for `request`; ValueError on garbage."""
    if not isinstance(data, dict) or set(data) != {"node", "gpus"}:
        raise ValueError('must be a JSON object with exactly the keys "node" and "gpus"')
    node, entries = data["node"], data["gpus"]
    if not isinstance(node, str) or not node:
        raise ValueError("node must be a non-empty string")
    if not isinstance(entries, list):
        raise ValueError("gpus must be a list")
    slots = tuple(parse_slot(i, entry) for i, entry in enumerate(entries))
    _check_matches(slots, request)
    return Placement(node, slots, cpu_milli=request.cpu_milli, memory_bytes=request.memory_bytes)


def parse_slot(position: int, entry: object) -> GpuSlot:
    """One entry of an assignment's `gpus` list (at `position`, for the reason) as a GpuSlot; ValueError
    on garbage. The `mig` profile is read in either media-extension spelling."""
    where = f"gpus[{position}]"
    if not isinstance(entry, dict) or set(entry) not in _SLOT_KEYS:
        raise ValueError(
            f'{where}: expected {{"index"}}, {{"index", "milli"}} or {{"index", "mig", "start"}}'
        )
    index = _int_in(entry["index"], 0, MAX_GPUS_PER_NODE - 1, f"{where}.index")
    if "milli" in entry:
        return GpuSlot(index, milli=_int_in(entry["milli"], 1, 999, f"{where}.milli"))
    if "mig" in entry:
        if not isinstance(entry["mig"], str) or not entry["mig"]:
            raise ValueError(f"{where}.mig must be a profile name")
        start = _int_in(entry["start"], 0, 7, f"{where}.start")
        return GpuSlot(index, mig=canonical_profile(entry["mig"]), start=start)
    return GpuSlot(index)


def _int_in(value: object, low: int, high: int, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{where} must be an integer in {low}..{high}, not {value!r}")
    return value


def _check_matches(slots: tuple[GpuSlot, ...], request: PodRequest) -> None:
    """The slots must give exactly what the request asks for."""
    whole = [s.index for s in slots if not s.mig and not s.milli]
    shares = [s.milli for s in slots if s.milli]
    migs = Counter(s.mig for s in slots if s.mig)
    if request.kind == Kind.WHOLE:
        matches = len(whole) == len(slots) == request.gpus and len(set(whole)) == len(whole)
    elif request.kind == Kind.SHARE:
        matches = shares == [request.milli] and len(slots) == 1
    elif request.kind == Kind.MIG:
        matches = len(set(slots)) == len(slots) and migs == Counter(dict(request.mig))
    else:
        matches = not slots
    if not matches:
        raise ValueError(
            f"gpus {[s.to_json() for s in slots]} do not match the pod's request ({_asked(request)})"
        )


def _asked(request: PodRequest) -> str:
    if request.kind == Kind.WHOLE:
        return f"{RESOURCE_GPU}: {request.gpus}"
    if request.kind == Kind.SHARE:
        return f"{RESOURCE_GPU_MILLI}: {request.milli}"
    if request.kind == Kind.MIG:
        return ", ".join(f"{RESOURCE_MIG_PREFIX}{resource_profile(profile)}: {count}" for profile, count in request.mig)
    return "no GPUs"
