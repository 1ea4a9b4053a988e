"""The device kinds this agent serves, in one place (docs/adding-a-device-kind.md).

A new kind is one module with a `DeviceKind` subclass and one line: its entry in `KINDS`, or a
`register(kind)` call (a test's, a plugin's). Devices, claims, Allocate, verification and the loop
ask the kinds registered now, in order: where kinds overlap, the first one a resource is a name of
deals its claims (`kind_named`), and the first one to read a device ID back takes it (`read_held`).
"""

from __future__ import annotations

from gpupack.agent.device_kind import DeviceKind
from gpupack.agent.kind_dynamic_mig import DynamicMig
from gpupack.agent.kind_share import Share
from gpupack.agent.kind_static_mig import StaticMig
from gpupack.agent.kind_whole_gpu import WholeGpu

KINDS: tuple[DeviceKind, ...] = (WholeGpu(), Share(), StaticMig(), DynamicMig())

_registered: list[DeviceKind] = list(KINDS)


def register(kind: DeviceKind) -> None:
    """Serve `kind` too, after the kinds registered before it."""
    if kind in _registered:
        raise ValueError(f"device kind {kind.name or kind!r} is registered already")
    _registered.append(kind)


def unregister(kind: DeviceKind) -> None:
    """Stop serving `kind` (ValueError when it is not registered)."""
    _registered.remove(kind)


def registered() -> tuple[DeviceKind, ...]:
    """The kinds the agent serves now, in registration order."""
    return tuple(_registered)


def kind_named(resource: str) -> DeviceKind | None:
    """The first registered kind that `resource` is a name of; None when no kind serves it."""
    return next((kind for kind in _registered if kind.owns(resource)), None)
