"""What a FailedScheduling event says when gpupack turned the nodes down."""

from __future__ import annotations

from gpupack.scoring.engine import VERDICT_REASONS

# kube-scheduler's FitError starts so, then counts each reason: "0/14 nodes are available: 1 not enough ..."
FIT_ERROR = "nodes are available"
GPUPACK_REASONS = frozenset(VERDICT_REASONS.values())


def carries_gpupack_reason(message: str) -> bool:
    """True when a FailedScheduling message is kube-scheduler's fit error naming a reason of gpupack's verdicts."""
    return FIT_ERROR in message and any(reason in message for reason in GPUPACK_REASONS)
