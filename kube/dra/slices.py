"""One ResourceSlice (resource.k8s.io v1, v1beta2 or v1beta1) as the devices gpupack reads from it.

Field shapes by version: v1 and v1beta2 put `attributes`, `capacity`, `consumesCounters` and `taints` on
the device itself; v1beta1 nests them under `basic`. Attribute names are qualified (`gpu.nvidia.com/uuid`)
or bare (`uuid`, in the driver's own domain); both read the same. A capacity is `{value: quantity}`.

What NVIDIA's driver publishes (docs/dra.md): a GPU is a device `type: gpu` named `gpu-<minor>` with
`uuid`, `productName` and capacity `memory`, older releases also `index` and `minor`; a MIG device is
`type: mig` with `profile`, `parentUUID`, older releases `parentIndex`, and a static instance holds its
memory slices as capacities `memorySlice<i>`; a current driver names it
`gpu-<minor>-mig-<profile>-<profile id>-<placement start>`, an earlier one
`gpu-<minor>-mig-<profile id>-<start>-<size>`. With DynamicMIG every profile × placement is
a device that consumes counters (`memory-slice-<i>` among them) of its GPU's shared counter set.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupack.kube.dra.objects import DraError, integer, mapping, object_ref, objects, string
from gpupack.kube.quantity import QuantityError, parse_bytes

_GPU_NAME = re.compile(r"gpu-([0-9]{1,4})")
# gpu-<minor>-mig-<profile>-<GI profile id>-<start>: the profile spelled with letters ("1g10gb")
_MIG_NAME = re.compile(r"gpu-[0-9]{1,4}-mig-[0-9a-z-]*[a-z][0-9a-z-]*-[0-9]+-([0-9])")
# gpu-<minor>-mig-<GI profile id>-<start>-<size>: an earlier release's name
_MIG_NAME_NUMERIC = re.compile(r"gpu-[0-9]{1,4}-mig-[0-9]+-([0-9])-[0-9]")
_MIG_PARENT = re.compile(r"gpu-([0-9]{1,4})-mig-.*")
_SLICE_COUNTER = re.compile(r"memory-slice-([0-9])")
_SLICE_CAPACITY = re.compile(r"memorySlice([0-9])")
_BLOCKING_TAINTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True)
class SliceDevice:
    """One device of a slice, in gpupack's terms; fields the driver did not publish are empty."""

    name: str
    type: str  # "gpu", "mig", or anything else the driver publishes (ignored by gpupack)
    gpu: int  # the GPU's id: its index (else minor); a MIG device's parent's; -1 for other device types
    uuid: str = ""
    product: str = ""  # productName, as NVML spells it ("NVIDIA H100 80GB HBM3")
    memory_bytes: int = 0
    parent_uuid: str = ""
    profile: str = ""  # MIG profile ("3g.40gb", "1g.10gb+me")
    start: int | None = None  # MIG placement start (memory slice), when published
    partitionable: bool = False  # consumes shared counters (DynamicMIG)
    tainted: bool = False  # a NoSchedule or NoExecute taint: nothing new may go there


@dataclass(frozen=True)
class ResourceSliceInfo:
    """What gpupack reads of one ResourceSlice."""

    name: str
    driver: str
    node: str  # spec.nodeName; "" for a slice of allNodes or a nodeSelector (not a node's GPUs)
    pool: str
    generation: int
    slice_count: int
    devices: tuple[SliceDevice, ...]
    counter_sets: tuple[str, ...]  # names of spec.sharedCounters


def read_slice(obj: Mapping[str, Any]) -> ResourceSliceInfo:
    """The devices and pool of a raw ResourceSlice; DraError naming slice and field on garbage."""
    ref = object_ref("ResourceSlice", obj)
    spec = mapping(ref, "spec", obj.get("spec"))
    driver = string(ref, "spec.driver", spec.get("driver"))
    pool = mapping(ref, "spec.pool", spec.get("pool"))
    devices = objects(ref, "spec.devices", spec.get("devices"))
    counters = objects(ref, "spec.sharedCounters", spec.get("sharedCounters"))
    return ResourceSliceInfo(
        name=ref.partition(" ")[2],
        driver=driver,
        node=string(ref, "spec.nodeName", spec.get("nodeName"), required=False),
        pool=string(ref, "spec.pool.name", pool.get("name")),
        generation=integer(ref, "spec.pool.generation", pool.get("generation")),
        slice_count=integer(ref, "spec.pool.resourceSliceCount", pool.get("resourceSliceCount"), default=1),
        devices=tuple(_device(ref, f"spec.devices[{i}]", device, driver) for i, device in enumerate(devices)),
        counter_sets=tuple(
            string(ref, f"spec.sharedCounters[{i}].name", counter.get("name")) for i, counter in enumerate(counters)
        ),
    )


def _device(ref: str, field: str, device: Mapping[str, Any], driver: str) -> SliceDevice:
    name = string(ref, f"{field}.name", device.get("name"))
    if "basic" in device:  # v1beta1
        field = f"{field}.basic"
        device = mapping(ref, field, device["basic"])
    attributes = _attributes(ref, f"{field}.attributes", device.get("attributes"), driver)
    capacity = mapping(ref, f"{field}.capacity", device.get("capacity"))
    consumes = objects(ref, f"{field}.consumesCounters", device.get("consumesCounters"))
    kind = _text(ref, field, attributes, "type")
    return SliceDevice(
        name=name,
        type=kind,
        gpu=_gpu_id(ref, field, name, kind, attributes),
        uuid=_text(ref, field, attributes, "uuid"),
        product=_text(ref, field, attributes, "productName"),
        memory_bytes=_memory(ref, f"{field}.capacity", capacity),
        parent_uuid=_text(ref, field, attributes, "parentUUID"),
        profile=_text(ref, field, attributes, "profile"),
        start=_start(ref, field, name, capacity, consumes) if kind == "mig" else None,
        partitionable=bool(consumes),
        tainted=_tainted(ref, f"{field}.taints", device.get("taints")),
    )


def _attributes(ref: str, field: str, value: object, driver: str) -> dict[str, object]:
    """Attribute name (driver's domain prefix dropped) -> its one value."""
    read: dict[str, object] = {}
    for name, entry in mapping(ref, field, value).items():
        entry = mapping(ref, f"{field}.{name}", entry)
        values = [entry[key] for key in ("string", "int", "bool", "version") if key in entry]
        if len(values) != 1:
            raise DraError(ref, f"{field}.{name}", "must hold exactly one of string, int, bool, version")
        read[name.removeprefix(f"{driver}/")] = values[0]
    return read


def _text(ref: str, field: str, attributes: Mapping[str, object], name: str) -> str:
    value = attributes.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DraError(ref, f"{field}.attributes.{name}", f"{value!r} is not a string")
    return value


def _int_attribute(ref: str, field: str, attributes: Mapping[str, object], *names: str) -> int | None:
    for name in names:
        if name in attributes:
            value = integer(ref, f"{field}.attributes.{name}", attributes[name])
            if value < 0:
                raise DraError(ref, f"{field}.attributes.{name}", f"{value} is negative")
            return value
    return None


def _gpu_id(ref: str, field: str, name: str, kind: str, attributes: Mapping[str, object]) -> int:
    """A GPU's index attribute, else its minor (attribute, else from the name `gpu-<minor>`); a MIG
    device's parent's likewise. -1 for other device types."""
    if kind == "gpu":
        pattern, names = _GPU_NAME, ("index", "minor")
    elif kind == "mig":
        pattern, names = _MIG_PARENT, ("parentIndex", "parentMinor")
    else:
        return -1
    published = _int_attribute(ref, field, attributes, *names)
    if published is not None:
        return published
    match = pattern.fullmatch(name)
    if match is None:
        raise DraError(
            ref, f"{field}.attributes", f"{name}: no {names[0]} attribute and a name without the GPU's minor"
        )
    return int(match[1])


def _memory(ref: str, field: str, capacity: Mapping[str, Any]) -> int:
    if "memory" not in capacity:
        return 0
    entry = capacity["memory"]
    value = entry.get("value") if isinstance(entry, Mapping) else entry  # v1alpha3 wrote the quantity alone
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise DraError(ref, f"{field}.memory", f"{value!r} is not a quantity")
    try:
        return parse_bytes(value)
    except (QuantityError, ValueError, TypeError) as exc:
        raise DraError(ref, f"{field}.memory", str(exc)) from None


def _start(
    ref: str, field: str, name: str, capacity: Mapping[str, Any], consumes: Sequence[Mapping[str, Any]]
) -> int | None:
    """A MIG device's placement start: the lowest memory slice it consumes (DynamicMIG counters) or holds
    (static MIG capacities), else from its name; None when the driver says nothing of it."""
    slices = [int(m[1]) for key in capacity if (m := _SLICE_CAPACITY.fullmatch(key))]
    for i, consumption in enumerate(consumes):
        counters = mapping(ref, f"{field}.consumesCounters[{i}].counters", consumption.get("counters"))
        slices.extend(int(m[1]) for key in counters if (m := _SLICE_COUNTER.fullmatch(key)))
    if slices:
        return min(slices)
    match = _MIG_NAME.fullmatch(name) or _MIG_NAME_NUMERIC.fullmatch(name)
    return int(match[1]) if match is not None else None


def _tainted(ref: str, field: str, value: object) -> bool:
    taints = objects(ref, field, value)
    return any(taint.get("effect") in _BLOCKING_TAINTS for taint in taints)
