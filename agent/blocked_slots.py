"""Slots nothing should be placed on (`Blocked`), and the NVML refusals Allocate met (`Refusals`).

Both end up in the `blocked` list of `gpupack.io/devices-in-use` (agent.devices_in_use).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpupack.scoring.facts import GpuSlot

REFUSAL_TTL_S = 600.0


@dataclass(frozen=True)
class Blocked:
    """A slot nothing should be placed on, and why."""

    slot: GpuSlot
    reason: str


@dataclass
class Refusals:
    """NVML refusals to create an assigned dynamic-MIG instance (recorded by Allocate, thread-safe)."""

    ttl_s: float = REFUSAL_TTL_S
    clock: Callable[[], float] = time.monotonic
    _seen: dict[GpuSlot, tuple[str, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, slot: GpuSlot, reason: str) -> None:
        """NVML refused to create `slot`."""
        with self._lock:
            self._seen[slot] = (reason, self.clock())

    def created(self, slot: GpuSlot) -> None:
        """A create at `slot` succeeded: it is not blocked any more."""
        with self._lock:
            self._seen.pop(slot, None)

    def freed(self, gpu: int) -> None:
        """An instance on `gpu` was destroyed: what NVML refused there may fit now (the next Allocate tells)."""
        with self._lock:
            self._seen = {s: seen for s, seen in self._seen.items() if s.index != gpu}

    def current(self) -> list[Blocked]:
        """Refusals younger than the TTL (older ones are forgotten)."""
        now = self.clock()
        with self._lock:
            self._seen = {s: (r, t) for s, (r, t) in self._seen.items() if now - t < self.ttl_s}
            seen = sorted(self._seen.items(), key=lambda item: slot_order(item[0]))
            return [Blocked(slot, reason) for slot, (reason, _) in seen]


def slot_order(slot: GpuSlot) -> tuple[int, int, str]:
    """Slots in GPU order, then by MIG placement."""
    return (slot.index, slot.start, slot.mig)
