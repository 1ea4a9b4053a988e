"""The kube-scheduler extender v1 wire format (`k8s.io/kube-scheduler/extender/v1`).

What gpupack reads and answers of it: docs/contracts.md#extender-http-api.

Go's structs there have no json tags, so the keys are the capitalised field names. Python code uses
snake_case attributes; aliases carry the Go names on the wire. Pods and nodes stay plain dicts:
gpupack reads only a few of their fields (see `pod_request`, `node_facts`).

Filter and prioritize receive ExtenderArgs. With `nodeCacheCapable: true` kube-scheduler sends
`"Nodes": null` and the candidate `NodeNames`; with false, `"NodeNames": null` and a NodeList of the
candidate Node objects. The filter answer uses the same form the request did.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from gpupack.errors import GpupackError
from gpupack.scoring.names import NameArray, RowReasons

MAX_EXTENDER_PRIORITY = 10  # extenderv1.MaxExtenderPriority
# Identifier lengths (#13 item 3): Kubernetes' own limits, so a body kube-scheduler sends always fits,
# and what gpupack keeps per pod (extender.state's `_seen`) and echoes per node stays small.
MAX_NAME_CHARS = 253  # pod and node names: DNS subdomains (RFC 1123)
MAX_NAMESPACE_CHARS = 63  # namespaces: DNS labels
MAX_UID_CHARS = 253  # the API server's uids are 36-character UUIDs; hand-written ones get a name's room
MAX_REASON_CHARS = 256  # a per-node reason in an answer; longer ones (quoting the pod) are cut
DEFAULT_MAX_CANDIDATES = 20_000  # Settings.max_candidates

_M = TypeVar("_M", bound=BaseModel)


class WireError(GpupackError, ValueError):
    """A request body that is not what kube-scheduler sends; the reason is safe to return as HTTP 400."""


class _Wire(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class NodeList(_Wire):
    """v1.NodeList as kube-scheduler sends it: `metadata` (empty) and `items` (Node objects)."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    items: list[dict[str, Any]] = Field(default_factory=list)


class ExtenderArgs(_Wire):
    """Body of `POST /filter` and `POST /prioritize`."""

    pod: dict[str, Any] = Field(alias="Pod")
    nodes: NodeList | None = Field(default=None, alias="Nodes")
    node_names: list[str] | None = Field(default=None, alias="NodeNames")
    _name_array: NameArray | None = PrivateAttr(default=None)
    _names: tuple[str, ...] | None = PrivateAttr(default=None)

    @property
    def node_cache_capable(self) -> bool:
        """True when kube-scheduler sent node names only (`nodeCacheCapable: true`)."""
        return self.node_names is not None or self._name_array is not None

    @property
    def name_array(self) -> NameArray | None:
        """`NodeNames` still in its wire bytes, when the body came in kube-scheduler's own layout."""
        return self._name_array

    def candidate_names(self) -> list[str]:
        """Names of the candidate nodes, in the order kube-scheduler sent them (for `Nodes`, one per item)."""
        if self._names is None:  # read once: filter needs them again for its answer
            if self._name_array is not None:
                self._names = tuple(self._name_array.names())
            elif self.node_names is not None:
                self._names = tuple(self.node_names)
            else:
                self._names = tuple(_item_name(item) for item in self.nodes.items) if self.nodes else ()
        return list(self._names)

    def candidates(self) -> NameArray | list[str]:
        """The candidates in the cheapest form at hand: the wire bytes of `NodeNames`, else names."""
        return self._name_array if self._name_array is not None else self.candidate_names()


class ExtenderFilterResult(_Wire):
    """Answer to `POST /filter`: the nodes that pass, and why the others fail."""

    nodes: NodeList | None = Field(default=None, alias="Nodes")
    node_names: list[str] | None = Field(default=None, alias="NodeNames")
    failed_nodes: Mapping[str, str] = Field(default_factory=dict, alias="FailedNodes")
    failed_and_unresolvable_nodes: Mapping[str, str] = Field(
        default_factory=dict, alias="FailedAndUnresolvableNodes"
    )
    error: str = Field(default="", alias="Error")

    def to_json(self) -> bytes:
        """The body: the node form that was set (`Nodes` or `NodeNames`), both maps, and `Error`.

        Written out by hand rather than through model_dump: at 5,000 candidates the maps hold
        thousands of entries, and copying them through pydantic cost more than deciding.
        """
        parts = [b"{"]  # joined once at the end: FailedNodes alone can be 200 KiB
        if self.nodes is not None:
            parts += [b'"Nodes":', _node_list_json(self.nodes), b","]
        if self.node_names is not None:
            parts += [b'"NodeNames":', orjson.dumps(self.node_names), b","]
        parts += [b'"FailedNodes":', *_map_json(self.failed_nodes)]
        parts += [b',"FailedAndUnresolvableNodes":', *_map_json(self.failed_and_unresolvable_nodes)]
        parts += [b',"Error":', orjson.dumps(self.error), b"}"]
        return b"".join(parts)


def _node_list_json(nodes: NodeList) -> bytes:
    """The passing Node objects as sent; WireError for one orjson cannot write (nested too deeply)."""
    try:
        return orjson.dumps({"metadata": nodes.metadata, "items": nodes.items})
    except orjson.JSONEncodeError as exc:
        raise WireError(f"Nodes: a Node object gpupack cannot send back ({exc}: nested too deeply?)") from None


def _map_json(reasons: Mapping[str, str]) -> tuple[bytes, ...]:
    if isinstance(reasons, RowReasons):
        return b"{", reasons.members_json(), b"}"  # gpupack's own short reason texts
    if any(len(reason) > MAX_REASON_CHARS for reason in reasons.values()):
        reasons = {name: clip(reason) for name, reason in reasons.items()}  # one reason per node: keep each small
    return (orjson.dumps(reasons),)  # a dict: pydantic makes one, filter_result's _plain too


def clip(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """`text`, cut to `limit` characters with a mark when longer (a reason may quote the pod's own values)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class HostPriority(_Wire):
    """One node's score in the answer to `POST /prioritize` (0..10, best = 10)."""

    host: str = Field(alias="Host")
    score: int = Field(alias="Score", ge=0, le=MAX_EXTENDER_PRIORITY)


class ExtenderBindingArgs(_Wire):
    """Body of `POST /bind`."""

    pod_name: str = Field(alias="PodName", max_length=MAX_NAME_CHARS)
    pod_namespace: str = Field(alias="PodNamespace", max_length=MAX_NAMESPACE_CHARS)
    pod_uid: str = Field(alias="PodUID", max_length=MAX_UID_CHARS)
    node: str = Field(alias="Node", max_length=MAX_NAME_CHARS)


class ExtenderBindingResult(_Wire):
    """Answer to `POST /bind`: `Error` is "" on success."""

    error: str = Field(default="", alias="Error")

    def to_json(self) -> bytes:
        """The body, `{"Error": ...}`."""
        return orjson.dumps(self.model_dump(by_alias=True))


MAX_VICTIMS_PER_NODE = 10_000  # pods named as victims on one node (kubelet's own limit is far lower)


class MetaPod(_Wire):
    """A pod named by its uid (nodeCacheCapable: kube-scheduler and gpupack both know the pods)."""

    uid: str = Field(alias="UID", max_length=MAX_UID_CHARS)


class MetaVictims(_Wire):
    """The victims proposed or chosen on one node, by uid, and how many PodDisruptionBudgets they break."""

    pods: list[MetaPod] = Field(default_factory=list, alias="Pods", max_length=MAX_VICTIMS_PER_NODE)
    num_pdb_violations: int = Field(default=0, alias="NumPDBViolations", ge=0)


class Victims(_Wire):
    """The victims kube-scheduler proposes on one node, as whole Pod objects (nodeCacheCapable: false)."""

    pods: list[dict[str, Any]] = Field(default_factory=list, alias="Pods", max_length=MAX_VICTIMS_PER_NODE)
    num_pdb_violations: int = Field(default=0, alias="NumPDBViolations", ge=0)


class ExtenderPreemptionArgs(_Wire):
    """Body of `POST /preempt`: the preemptor and the candidate nodes with kube-scheduler's own victims.

    kube-scheduler sends `NodeNameToMetaVictims` (uids) with `nodeCacheCapable: true`, else
    `NodeNameToVictims` (Pod objects); the other key is null. gpupack reads only the node names:
    it chooses its own victims (extender.preemption).
    """

    pod: dict[str, Any] = Field(alias="Pod")
    node_name_to_victims: dict[str, Victims | None] | None = Field(default=None, alias="NodeNameToVictims")
    node_name_to_meta_victims: dict[str, MetaVictims | None] | None = Field(
        default=None, alias="NodeNameToMetaVictims"
    )

    def candidate_names(self) -> list[str]:
        """The nodes kube-scheduler proposes, in the order it sent them."""
        return list(self.node_name_to_meta_victims or self.node_name_to_victims or {})


class ExtenderPreemptionResult(_Wire):
    """Answer to `POST /preempt`: per node kept, the victims gpupack chose (by uid). A node left out is
    one where gpupack would not preempt; an empty map lets no preemption happen."""

    node_name_to_meta_victims: dict[str, MetaVictims] = Field(default_factory=dict, alias="NodeNameToMetaVictims")

    def to_json(self) -> bytes:
        """The body, `{"NodeNameToMetaVictims": {node: {"Pods": [{"UID": ...}], "NumPDBViolations": n}}}`."""
        return orjson.dumps(self.model_dump(by_alias=True))


def parse_preemption_args(body: bytes, max_candidates: int = DEFAULT_MAX_CANDIDATES) -> ExtenderPreemptionArgs:
    """Parse a preempt body. Raises WireError unless exactly one of NodeNameToVictims /
    NodeNameToMetaVictims is non-null, or when it names more than `max_candidates` nodes or a node
    name longer than MAX_NAME_CHARS."""
    args = _parse(body, ExtenderPreemptionArgs)
    meta, full = args.node_name_to_meta_victims, args.node_name_to_victims
    if (meta is None) == (full is None):
        given = "both" if meta is not None else "neither"
        raise WireError(f"exactly one of NodeNameToVictims and NodeNameToMetaVictims must be non-null, got {given}")
    field, nodes = ("NodeNameToMetaVictims", meta) if meta is not None else ("NodeNameToVictims", full or {})
    if "" in nodes:
        raise WireError(f"{field}: an empty node name")
    _check_candidates(field, len(nodes), max(map(len, nodes), default=0), max_candidates)
    return args


def preemption_error() -> ExtenderPreemptionResult:
    """The preempt answer that lets no preemption happen (no node kept): for failures and timeouts."""
    return ExtenderPreemptionResult()


def parse_extender_args(body: bytes, max_candidates: int = DEFAULT_MAX_CANDIDATES) -> ExtenderArgs:
    """Parse a filter/prioritize body. Raises WireError unless exactly one of Nodes / NodeNames is set,
    or when it names more than `max_candidates` nodes or a node name longer than MAX_NAME_CHARS.

    A body laid out as kube-scheduler writes it with nodeCacheCapable (`NodeNames` last, plain names)
    keeps the names in their bytes (`ExtenderArgs.name_array`); any other body is parsed whole.
    """
    fast = _names_last(body)
    if fast is not None:
        rest, names = fast
        if rest.get("Nodes") is not None:
            raise WireError("exactly one of Nodes and NodeNames must be non-null, got both")
        lengths = names.spans[: len(names), 1] - names.spans[: len(names), 0]  # bytes: names are ASCII
        _check_candidates("NodeNames", len(names), int(lengths.max(initial=0)), max_candidates)
        args = _validate(rest, ExtenderArgs)
        args._name_array = names
        return args
    args = _parse(body, ExtenderArgs)
    if (args.nodes is None) == (args.node_names is None):
        given = "both" if args.nodes is not None else "neither"
        raise WireError(f"exactly one of Nodes and NodeNames must be non-null, got {given}")
    if args.nodes is not None:
        item_names = tuple(_item_name(item) for item in args.nodes.items)
        if not all(item_names):
            raise WireError(f"Nodes.items[{item_names.index('')}] has no metadata.name")
        _check_candidates("Nodes.items", len(item_names), max(map(len, item_names), default=0), max_candidates)
        args._names = item_names
    elif args.node_names is not None:
        _check_candidates("NodeNames", len(args.node_names), max(map(len, args.node_names), default=0), max_candidates)
    return args


def _check_candidates(field: str, count: int, longest: int, max_candidates: int) -> None:
    """WireError past `max_candidates` names or a name past MAX_NAME_CHARS (#13 item 3): the work and
    the answer of a call grow with both."""
    if count > max_candidates:
        raise WireError(f"{field}: {count} nodes exceed the limit of {max_candidates} per call (maxCandidates)")
    if longest > MAX_NAME_CHARS:
        raise WireError(f"{field}: a node name of {longest} characters exceeds Kubernetes' {MAX_NAME_CHARS}")


def parse_binding_args(body: bytes) -> ExtenderBindingArgs:
    """Parse a bind body. Raises WireError with a reason."""
    return _parse(body, ExtenderBindingArgs)


def filter_result(
    args: ExtenderArgs,
    passed: Iterable[str],
    failed: Mapping[str, str] | None = None,
    unresolvable: Mapping[str, str] | None = None,
) -> ExtenderFilterResult:
    """The filter answer in the form of `args`: NodeNames, or Nodes with the passing Node objects.

    Nodes keep the order kube-scheduler sent them in. Raises ValueError if `passed` names a node
    that was not a candidate. The maps are gpupack's own, so they are taken as they are (no copy,
    no validation).
    """
    keep = set(passed)
    if len(keep) == 1:
        chosen = keep.pop()  # decide in filter: one node, so no pass over every candidate to keep order
        if chosen not in args.candidates():
            raise ValueError(f"nodes {[chosen]} were not candidates")
        ordered = [chosen]
    else:
        ordered = [name for name in args.candidate_names() if name in keep]
        unknown = keep.difference(ordered)
        if unknown:
            raise ValueError(f"nodes {sorted(unknown)} were not candidates")
    result = ExtenderFilterResult.model_construct(
        failed_nodes=_plain(failed), failed_and_unresolvable_nodes=_plain(unresolvable)
    )
    if args.node_cache_capable:
        result.node_names = ordered
    else:
        items = args.nodes.items if args.nodes else []
        kept = set(ordered)
        chosen_items = [item for item, name in zip(items, args.candidate_names(), strict=True) if name in kept]
        result.nodes = NodeList.model_construct(metadata={}, items=chosen_items)
    return result


def _plain(reasons: Mapping[str, str] | None) -> Mapping[str, str]:
    if reasons is None:
        return {}
    return reasons if isinstance(reasons, (dict, RowReasons)) else dict(reasons)


def filter_error(error: str) -> ExtenderFilterResult:
    """A filter answer carrying only an error (kube-scheduler then ignores the rest)."""
    return ExtenderFilterResult(error=error)


def priorities_json(priorities: Iterable[HostPriority]) -> bytes:
    """The prioritize body: `[{"Host": ..., "Score": ...}, ...]`."""
    return orjson.dumps([p.model_dump(by_alias=True) for p in priorities])


_NAMES_KEY = b'"NodeNames"'


def _names_last(body: bytes) -> tuple[dict[str, Any], NameArray] | None:
    """(the other members, NodeNames) of `{..., "NodeNames": [plain strings]}`, else None.

    Exact, not a guess: if the body minus its last member still parses as an object with members
    and without `NodeNames`, and what follows is `"NodeNames": <strict array> }`, the whole body is
    that object plus NodeNames (orjson would read it the same way).
    """
    key = body.find(_NAMES_KEY)
    if key < 0:
        return None
    colon = key + len(_NAMES_KEY)
    while colon < len(body) and body[colon] in b" \t\r\n":
        colon += 1
    if body[colon : colon + 1] != b":":
        return None
    names = NameArray.read(body, colon + 1, closing=True)
    if names is None:
        return None
    head = body[:key].rstrip()
    if not head.endswith(b","):
        return None
    try:
        rest = orjson.loads(head[:-1] + b"}")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(rest, dict) or not rest or "NodeNames" in rest:
        return None
    return rest, names


def _parse(body: bytes, model: type[_M]) -> _M:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise WireError(f"the body must be a JSON object, got {type(data).__name__}")
    return _validate(data, model)


def _validate(data: dict[str, Any], model: type[_M]) -> _M:
    _check_key_case(data, model)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise WireError(_describe(exc)) from None


def _check_key_case(data: dict[str, Any], model: type[BaseModel]) -> None:
    """WireError for a key that is one of the model's wire keys in another spelling (`nodenames`,
    `pod`, `node_names`). The keys are case-sensitive here (docs/contracts.md names them); without this
    the error would be about the key found missing instead of the one misspelt."""
    by_folded = _wire_keys(model)
    wrong = [(key, by_folded[_fold(key)]) for key in data if _fold(key) in by_folded and by_folded[_fold(key)] != key]
    if wrong:
        named = ", ".join(f"{key!r} should be {alias!r}" for key, alias in wrong[:3])
        raise WireError(f"keys are case-sensitive: {clip(named)}")


@functools.cache
def _wire_keys(model: type[BaseModel]) -> dict[str, str]:
    """The model's wire keys by their folded spelling (`nodenames` -> `NodeNames`)."""
    return {_fold(field.alias): field.alias for field in model.model_fields.values() if field.alias}


def _fold(key: str) -> str:
    return key.replace("_", "").lower()


def _describe(exc: ValidationError) -> str:
    problems = [  # a location may hold the body's own keys: clipped, so a reason stays short
        clip(f"{'.'.join(str(part) for part in error['loc']) or 'body'}: {error['msg']}")
        for error in exc.errors(include_url=False)
    ]
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


def _item_name(item: Mapping[str, Any]) -> str:
    metadata = item.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict | Mapping) else None  # dict first: no ABC check
    return name if isinstance(name, str) else ""
