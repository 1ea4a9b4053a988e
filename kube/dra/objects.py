"""Reading fields of raw resource.k8s.io objects, with errors that name the object and the field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpupack.errors import GpupackError

API_GROUP = "resource.k8s.io"
DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver for GPUs (kubernetes-sigs/dra-driver-nvidia-gpu)


class DraError(GpupackError, ValueError):
    """A ResourceSlice, ResourceClaim or DeviceClass gpupack cannot read; names the object and the field."""

    def __init__(self, obj: str, field: str, reason: str) -> None:
        self.obj = obj
        self.field = field
        self.reason = reason
        super().__init__(f"{obj}: {field}: {reason}")


def object_ref(kind: str, obj: object) -> str:
    """`ResourceSlice name` or `ResourceClaim namespace/name`, for messages; raises DraError without a name."""
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        raise DraError(f"{kind} <unnamed>", "metadata.name", "missing")
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return f"{kind} {namespace}/{name}" if isinstance(namespace, str) and namespace else f"{kind} {name}"


def mapping(ref: str, field: str, value: object) -> Mapping[str, Any]:
    """`value` as an object ({} when absent)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DraError(ref, field, f"must be an object, not {type(value).__name__}")
    return value


def objects(ref: str, field: str, value: object) -> Sequence[Mapping[str, Any]]:
    """`value` as a list of objects ([] when absent)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        raise DraError(ref, field, "must be a list of objects")
    return value


def string(ref: str, field: str, value: object, *, required: bool = True) -> str:
    """`value` as a string; "" when absent and not required."""
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise DraError(ref, field, "must be a non-empty string" if required else "must be a string")
    return value


def integer(ref: str, field: str, value: object, *, default: int = 0) -> int:
    """`value` as an integer (`default` when absent); booleans are not integers."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise DraError(ref, field, f"{value!r} is not an integer")
    return value
