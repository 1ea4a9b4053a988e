"""What a ResourceClaim asks for, in gpupack's terms: whole GPUs or MIG instances of NVIDIA's driver (#30 item 2).

gpupack chooses devices only for requests it understands fully; everything else is left to kube-scheduler's
own allocator (`NotOurs` says why). It reads:
- `spec.devices.requests[]` with `exactly` (v1) or the request itself (v1beta1): `deviceClassName`,
  `allocationMode: ExactCount` (the default) and `count` (default 1), `selectors[].cel.expression`;
- `firstAvailable[]` sub-requests of the same form (the allocation names them `<request>/<sub-request>`);
- CEL selectors, of the class and of the request, made only of clauses joined by `&&`:
  `device.driver == 'gpu.nvidia.com'` and `device.attributes['gpu.nvidia.com'].<type|profile|productName> == '…'`
  (the form NVIDIA's DeviceClasses `gpu.nvidia.com` and `mig.nvidia.com` and its examples use).

Not read, so left to kube-scheduler: `allocationMode: All`, `adminAccess`, request `tolerations` or
`capacity`, claim `constraints`, any other CEL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupack.errors import GpupackError
from gpupack.kube.dra.objects import DRIVER
from gpupack.scoring.geometry import canonical_profile
from gpupack.scoring.request import Kind

_DRIVER_CLAUSE = re.compile(r"device\.driver\s*==\s*['\"]gpu\.nvidia\.com['\"]")
_ATTRIBUTE_CLAUSE = re.compile(
    r"device\.attributes\[\s*['\"]gpu\.nvidia\.com['\"]\s*\]\.(type|profile|productName)\s*==\s*['\"]([^'\"]+)['\"]"
)
_NOT_READ = ("adminAccess", "tolerations", "capacity")


class NotOurs(GpupackError, ValueError):
    """A claim gpupack does not allocate; kube-scheduler's allocator does. The message says why."""


@dataclass(frozen=True)
class DeviceAsk:
    """One way to satisfy a request: `count` devices of one kind (a MIG `profile`, or whole GPUs)."""

    request: str  # the name the allocation result carries: `gpu`, or `gpu/small` for a firstAvailable entry
    device_class: str
    kind: Kind  # Kind.WHOLE or Kind.MIG
    count: int
    profile: str = ""  # MIG only, as nvidia-smi spells it
    product: str = ""  # productName the selectors demand ("" any)


@dataclass(frozen=True)
class RequestAsk:
    """One request of a claim: its alternatives in the claim's order (one unless `firstAvailable`)."""

    name: str
    alternatives: tuple[DeviceAsk, ...]


def claim_asks(claim: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> tuple[RequestAsk, ...]:
    """The requests of a raw ResourceClaim; `classes`: DeviceClass name -> its raw `spec`.
    NotOurs when any part is one gpupack does not allocate."""
    spec = claim.get("spec") or {}
    devices = spec.get("devices") or {} if isinstance(spec, Mapping) else {}
    if not isinstance(devices, Mapping):
        raise NotOurs("spec.devices is not an object")
    if devices.get("constraints"):
        raise NotOurs("the claim has constraints between its requests")
    requests = devices.get("requests") or []
    if not isinstance(requests, list) or not requests:
        raise NotOurs("the claim has no device requests")
    return tuple(_request(r, classes) for r in requests)


def _request(request: object, classes: Mapping[str, Mapping[str, Any]]) -> RequestAsk:
    if not isinstance(request, Mapping) or not isinstance(request.get("name"), str):
        raise NotOurs("a request without a name")
    name = request["name"]
    alternatives = request.get("firstAvailable")
    if alternatives:
        if not isinstance(alternatives, list):
            raise NotOurs(f"request {name}: firstAvailable is not a list")
        asks = [_ask(f"{name}/{sub.get('name')}", sub, classes) for sub in alternatives if isinstance(sub, Mapping)]
        if len(asks) != len(alternatives):
            raise NotOurs(f"request {name}: a firstAvailable entry is not an object")
        return RequestAsk(name, tuple(asks))
    exactly = request.get("exactly")
    return RequestAsk(name, (_ask(name, exactly if isinstance(exactly, Mapping) else request, classes),))


def _ask(name: str, body: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> DeviceAsk:
    class_name = body.get("deviceClassName")
    if not isinstance(class_name, str) or class_name not in classes:
        raise NotOurs(f"request {name}: DeviceClass {class_name!r} is not known")
    if (body.get("allocationMode") or "ExactCount") != "ExactCount":
        raise NotOurs(f"request {name}: allocationMode {body.get('allocationMode')} is left to kube-scheduler")
    unread = [field for field in _NOT_READ if body.get(field)]
    if unread:
        raise NotOurs(f"request {name}: {', '.join(unread)} is left to kube-scheduler")
    count = body.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise NotOurs(f"request {name}: count {count!r} is not a positive integer")
    clauses = _clauses(name, classes[class_name].get("selectors")) + _clauses(name, body.get("selectors"))
    return _device_ask(name, class_name, count, clauses)


def _clauses(name: str, selectors: object) -> list[str]:
    """Every `&&` clause of the CEL selectors, parentheses and blanks trimmed."""
    if selectors is None:
        return []
    if not isinstance(selectors, list):
        raise NotOurs(f"request {name}: selectors is not a list")
    clauses: list[str] = []
    for selector in selectors:
        cel = selector.get("cel") if isinstance(selector, Mapping) else None
        expression = cel.get("expression") if isinstance(cel, Mapping) else None
        if not isinstance(expression, str):
            raise NotOurs(f"request {name}: a selector that is not CEL")
        clauses += [part.strip().strip("()").strip() for part in expression.split("&&")]
    return clauses


def _device_ask(name: str, class_name: str, count: int, clauses: list[str]) -> DeviceAsk:
    """The ask the clauses describe: NVIDIA's driver, a device type, for MIG a profile."""
    wanted: dict[str, str] = {}
    for clause in clauses:
        attribute = _ATTRIBUTE_CLAUSE.fullmatch(clause)
        if _DRIVER_CLAUSE.fullmatch(clause):
            continue
        if attribute is not None and wanted.get(attribute[1], attribute[2]) == attribute[2]:
            wanted[attribute[1]] = attribute[2]
        else:
            raise NotOurs(f"request {name}: selector {clause!r} is not one gpupack reads")
    kind = {"gpu": Kind.WHOLE, "mig": Kind.MIG}.get(wanted.get("type", ""))
    if kind is None:
        raise NotOurs(f"request {name}: not a GPU or MIG device of {DRIVER}")
    if kind == Kind.MIG and not wanted.get("profile"):
        raise NotOurs(f"request {name}: a MIG device of any profile is left to kube-scheduler")
    if kind == Kind.WHOLE and "profile" in wanted:
        raise NotOurs(f"request {name}: a profile on a full GPU")
    profile = canonical_profile(wanted["profile"]) if kind == Kind.MIG else ""
    return DeviceAsk(name, class_name, kind, count, profile, wanted.get("productName", ""))


__all__ = ["DeviceAsk", "NotOurs", "RequestAsk", "claim_asks"]
