"""`gpupack.io/devices-in-use`: what is really held or blocked on this node beyond the assignments.

Written by the agent on its own Node, read by `gpupack serve` (kube.node_usage). Absent when there
is nothing to tell. Value (slots spelled as in `gpupack.io/assignment`):

    {"pods": {"ml/x": [{"index": 3}]},
     "blocked": [{"index": 0, "mig": "3g.40gb", "start": 4, "reason": "NVML refused ...: Insufficient Resources"}]}

- `pods`: per pod (namespace/name), the slots the kubelet handed it (podresources) that its assignment
  does not name — it has none (another scheduler or device plugin), or names others.
- `blocked`: slots nothing should be placed on: a dynamic-MIG placement NVML refused to create (kept
  `REFUSAL_TTL_S` seconds, or until a create there succeeds), and a dynamic-MIG instance no pod holds
  that the agent could not destroy; and on a node that is not dynamic MIG, a whole GPU whose MIG mode
  is on with no instance on it (an operator turned MIG on and made none yet): nothing on it can be handed
  out, and `gpupack serve` would otherwise count it a whole GPU.
A slot that a live pod's assignment on this node names is left out of both: `gpupack serve` already
charges it to that pod, and when that pod goes, the annotation changes and serve charges the rest.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpupack.agent.devices import NodeGpus
from gpupack.agent.verification import Discrepancy
from gpupack.kube.node_usage import MAX_REASON
from gpupack.scoring.facts import GpuSlot

REFUSAL_TTL_S = 600.0


@dataclass(frozen=True)
class Blocked:
    """A slot nothing should be placed on, and why."""

    slot: GpuSlot
    reason: str


EMPTY_MIG_GPU = "MIG mode is on and the GPU holds no MIG instance: nothing on it can be handed out"


def empty_mig_gpus(gpus: NodeGpus) -> list[Blocked]:
    """Whole-GPU blocks for the MIG-enabled GPUs without instances of a static (not dynamic-MIG) node."""
    if gpus.dynamic_mig:
        return []
    return [
        Blocked(GpuSlot(gpu.index), EMPTY_MIG_GPU)
        for gpu in gpus.gpus
        if gpus.mig_enabled[gpu.index] and not gpus.instances[gpu.index]
    ]


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

    def current(self) -> list[Blocked]:
        """Refusals younger than the TTL (older ones are forgotten)."""
        now = self.clock()
        with self._lock:
            self._seen = {s: (r, t) for s, (r, t) in self._seen.items() if now - t < self.ttl_s}
            return [Blocked(slot, reason) for slot, (reason, _) in sorted(self._seen.items(), key=_order)]


def devices_in_use(discrepancies: Iterable[Discrepancy], blocked: Iterable[Blocked], named: set[GpuSlot]) -> str | None:
    """The annotation's value (compact JSON), None when there is nothing beyond the assignments."""
    pods = {d.pod: [s for s in d.extra if s not in named] for d in discrepancies}
    held = {slot for slots in pods.values() for slot in slots}
    unique = {b.slot: b for b in blocked if b.slot not in named | held}
    value: dict[str, object] = {"pods": {p: [s.to_json() for s in slots] for p, slots in sorted(pods.items()) if slots}}
    value["blocked"] = [  # serve refuses a longer reason, and with it the whole annotation
        {**b.slot.to_json(), "reason": b.reason[:MAX_REASON]} for b in sorted(unique.values(), key=_order_blocked)
    ]
    value = {key: part for key, part in value.items() if part}
    return json.dumps(value, separators=(",", ":")) if value else None


def _order(item: tuple[GpuSlot, Any]) -> tuple[int, int, str]:
    slot = item[0]
    return (slot.index, slot.start, slot.mig)


def _order_blocked(blocked: Blocked) -> tuple[int, int, str]:
    return _order((blocked.slot, None))
