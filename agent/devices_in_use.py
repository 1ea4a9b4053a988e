"""`gpupack.io/devices-in-use`: what is really held or blocked on this node beyond the assignments.

Written by the agent on its own Node, read by `gpupack serve` (kube.node_usage). Absent when there
is nothing to tell. Value (slots spelled as in `gpupack.io/assignment`):

    {"pods": {"ml/x": [{"index": 3}]},
     "blocked": [{"index": 0, "mig": "3g.40gb", "start": 4, "reason": "NVML refused ...: Insufficient Resources"}]}

- `pods`: per pod (namespace/name), the slots the kubelet handed it (podresources) that its assignment
  does not name — it has none (another scheduler or device plugin), or names others.
- `blocked`: slots nothing should be placed on: a dynamic-MIG placement NVML refused to create (kept
  `REFUSAL_TTL_S` seconds, or until a create there succeeds: `agent.blocked_slots`), and what the kinds
  report each loop (`DeviceKind.tidy`): a dynamic-MIG instance no pod holds that the agent could not
  destroy; and on a node that is not dynamic MIG, a whole GPU whose MIG mode is on with no instance on it
  (an operator turned MIG on and made none yet): nothing on it can be handed out, and `gpupack serve`
  would otherwise count it a whole GPU.
A whole GPU or MIG slot that a live pod's assignment on this node names is left out of both: `gpupack
serve` already charges it to that pod, and when that pod goes, the annotation changes and serve charges
the rest. A share is kept: another pod's equal share on that GPU is that pod's, not this one's.
- `blocked` also holds each GPU out of service (`excluded`: unhealthy — a critical XID, lost — or named
  by `gpupack.io/cordoned-gpus`) as a whole-GPU slot with a reason starting `unhealthy:` or
  `cordoned:`, kept even while a live pod's assignment names the GPU: serve then places nothing more on
  any part of that GPU, now or when its pods end (kube.node_usage).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from gpupack.agent.agent_metrics import (
    BLOCKED_SLOTS,
    PODS_MISSING_ASSIGNED_DEVICES,
    PODS_WITH_UNASSIGNED_DEVICES,
    UNKNOWN_DEVICES,
)
from gpupack.agent.blocked_slots import Blocked, slot_order
from gpupack.agent.verification import Discrepancy
from gpupack.kube.node_usage import MAX_REASON
from gpupack.scoring.facts import GpuSlot


def devices_in_use(
    discrepancies: Iterable[Discrepancy],
    blocked: Iterable[Blocked],
    named: set[GpuSlot],
    excluded: Iterable[Blocked] = (),
) -> str | None:
    """The annotation's value (compact JSON), None when there is nothing beyond the assignments.

    `excluded`: whole GPUs out of service, listed whatever the pods hold (their reason wins over a block).
    """
    pods = {d.pod: [s for s in d.extra if s.milli or s not in named] for d in discrepancies}
    held = {slot for slots in pods.values() for slot in slots}
    unique = {b.slot: b for b in blocked if b.slot not in named | held} | {b.slot: b for b in excluded}
    value: dict[str, object] = {"pods": {p: [s.to_json() for s in slots] for p, slots in sorted(pods.items()) if slots}}
    value["blocked"] = [  # serve refuses a longer reason, and with it the whole annotation
        {**b.slot.to_json(), "reason": b.reason[:MAX_REASON]}
        for b in sorted(unique.values(), key=lambda b: slot_order(b.slot))
    ]
    value = {key: part for key, part in value.items() if part}
    return json.dumps(value, separators=(",", ":")) if value else None


def observe(discrepancies: Sequence[Discrepancy], blocked: Sequence[Blocked]) -> None:
    """Set the agent's gauges from one verification round."""
    PODS_WITH_UNASSIGNED_DEVICES.set(sum(1 for d in discrepancies if d.extra))
    PODS_MISSING_ASSIGNED_DEVICES.set(sum(1 for d in discrepancies if d.missing))
    UNKNOWN_DEVICES.set(sum(d.unknown for d in discrepancies))
    BLOCKED_SLOTS.set(len(blocked))
