"""Which XIDs mark a GPU unhealthy, after NVIDIA's published catalogue (docs/agent.md#gpu-health).

NVML reports every XID the driver logs as an `nvmlEventTypeXidCriticalError` event; what one means is in
NVIDIA's "Xid Errors" catalogue (docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Errors with the Xid
Catalog": each code's Resolution Bucket) and, for memory errors, "NVIDIA GPU Memory Error Management"
(docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt). Three kinds:

- the application's own fault (`APPLICATION`): the catalogue's immediate action is to restart the
  application, the GPU is fine — the same codes NVIDIA's own device plugin skips by default;
- reported and handled by the GPU itself (`HANDLED`): a row remap recorded, a correctable-error rate, an
  uncorrectable error that was contained (only the process that met it is ended; other work and new work
  run on, no reset needed);
- everything else marks the GPU unhealthy until it is reset (`CRITICAL` names the common ones; an XID in
  none of the lists counts as critical too, as in NVIDIA's device plugin: an unknown fault is not trusted).
"""

from __future__ import annotations

from enum import StrEnum

APPLICATION: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing (the application's channel)",
    45: "preemptive cleanup after an earlier error",
    68: "video processor exception",
    109: "context switch timeout",
}
HANDLED: dict[int, str] = {
    63: "row remapping recorded (applied at the next reset)",
    92: "high single-bit ECC error rate",
    94: "contained uncorrectable ECC error",
}
CRITICAL: dict[int, str] = {
    48: "double-bit ECC error",
    64: "row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    95: "uncontained uncorrectable ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


class XidVerdict(StrEnum):
    """What an XID does to its GPU."""

    APPLICATION = "application"  # nothing: the application's own fault
    HANDLED = "handled"  # nothing: the GPU recovered by itself
    CRITICAL = "critical"  # the GPU is unhealthy until it is reset


def classify(xid: int) -> XidVerdict:
    """The verdict on one XID (unknown codes are critical)."""
    if xid in APPLICATION:
        return XidVerdict.APPLICATION
    if xid in HANDLED:
        return XidVerdict.HANDLED
    return XidVerdict.CRITICAL


def describe(xid: int) -> str:
    """`XID 79 (GPU has fallen off the bus)`, or `XID 200` for a code without a description here."""
    text = CRITICAL.get(xid) or APPLICATION.get(xid) or HANDLED.get(xid)
    return f"XID {xid} ({text})" if text else f"XID {xid}"
