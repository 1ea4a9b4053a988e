"""What a defrag move is for, and the default bound of a plan (`scoring.defrag`; light: the CLI's parser reads it)."""

from __future__ import annotations

from enum import StrEnum

DEFAULT_MAX_EVICTIONS = 8  # per plan: a run evicts at most this many pods


class Goal(StrEnum):
    """What a move is for."""

    PENDING = "schedule-pending-pod"
    FREE_GPU = "free-gpu"
    FREE_NODE = "free-node"


__all__ = ["DEFAULT_MAX_EVICTIONS", "Goal"]
