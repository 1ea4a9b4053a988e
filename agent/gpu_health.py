"""Per-GPU health as NVML shows it: critical XIDs and lost GPUs (docs/agent.md#gpu-health).

Every round the agent loop asks `GpuHealth.check`: it registers the GPUs for NVML's critical XID events
once (and again after a GPU comes back), takes every event waiting (`nvmlEventSetWait` with no wait),
and asks NVML whether each GPU answers `GPU is lost`. One bad GPU never fails the round: NVML errors are
logged and the GPUs keep their last verdict.

- A lost GPU is unhealthy while NVML says so; it is offered again once NVML answers for it.
- A critical XID (`agent.xid`) marks its GPU unhealthy for as long as the agent runs: NVML tells of no
  reset, so after resetting the GPU the operator restarts the node's agent pod (NVML never delivers
  events from before the agent registered). An application's XID changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from gpupack.agent.agent_metrics import UNHEALTHY_GPUS, XID_EVENTS
from gpupack.agent.blocked_slots import Blocked
from gpupack.agent.nvml import GPU_IS_LOST, GpuInfo, Nvml, NvmlError
from gpupack.agent.xid import XidVerdict, classify, describe
from gpupack.scoring.facts import GpuSlot

log = logging.getLogger(__name__)
MAX_EVENTS_PER_ROUND = 1000  # a GPU spewing XIDs must not hold the round


class Why(StrEnum):
    """Why a GPU is out of service (the label of `gpupack_agent_unhealthy_gpus`)."""

    LOST = "lost"
    XID = "xid"
    CORDONED = "cordoned"


@dataclass(frozen=True)
class OutOfService:
    """A GPU nothing new may be placed on, and why (the reason is published and explained as it is)."""

    gpu: int
    why: Why
    reason: str


@dataclass
class GpuHealth:
    """The XIDs seen and the GPUs lost, per GPU index."""

    nvml: Nvml
    xids: dict[int, str] = field(default_factory=dict)  # GPU -> reason of its first critical XID
    lost: frozenset[int] = frozenset()
    _watching: bool = field(default=False, init=False)
    _last_error: str = field(default="", init=False)  # logged once, not every round

    def check(self, gpus: Sequence[GpuInfo]) -> dict[int, OutOfService]:
        """This round's unhealthy GPUs (XID or lost), by index."""
        self._drain()
        lost = frozenset(gpu.index for gpu in gpus if self._is_lost(gpu.index))
        for gpu in sorted(lost - self.lost):
            log.warning("GPU %d is lost (NVML: %s): its devices are Unhealthy", gpu, GPU_IS_LOST)
        for gpu in sorted(self.lost - lost):
            log.info("GPU %d answers NVML again: offered again", gpu)
        if self.lost - lost or not self._watching:
            self._watch()  # a GPU that came back is registered again
        self.lost = lost
        out = {gpu: OutOfService(gpu, Why.XID, reason) for gpu, reason in self.xids.items()}
        out |= {gpu: OutOfService(gpu, Why.LOST, f"unhealthy: {GPU_IS_LOST} (NVML)") for gpu in lost}
        return out

    def _watch(self) -> None:
        try:
            refused = self.nvml.watch_xids()
        except NvmlError as exc:
            self._warn(f"cannot watch XID events: {exc}")
            return
        self._watching = True
        for gpu, why in sorted(refused.items()):
            log.warning("GPU %d cannot be watched for XID events: %s", gpu, why)

    def _drain(self) -> None:
        for _ in range(MAX_EVENTS_PER_ROUND):
            try:
                event = self.nvml.next_xid(0)
            except NvmlError as exc:  # e.g. GPU is lost: the probe below says which
                self._warn(f"waiting for XID events failed: {exc}")
                return
            if event is None:
                return
            verdict = classify(event.xid)
            XID_EVENTS.labels(verdict.value).inc()
            if verdict != XidVerdict.CRITICAL:
                log.info("GPU %d: %s is not the GPU's fault; nothing changes", event.gpu, describe(event.xid))
                continue
            if event.gpu not in self.xids:
                log.warning("GPU %d: %s: its devices are Unhealthy until it is reset", event.gpu, describe(event.xid))
                self.xids[event.gpu] = f"unhealthy: {describe(event.xid)}"

    def _is_lost(self, gpu: int) -> bool:
        try:
            return self.nvml.lost(gpu)
        except NvmlError as exc:
            self._warn(f"GPU {gpu}: health unknown: {exc}")
            return gpu in self.lost

    def _warn(self, message: str) -> None:
        if message != self._last_error:  # once per distinct error, not every round
            log.warning("%s", message)
        self._last_error = message


def excluded_slots(out_of_service: Mapping[int, OutOfService]) -> list[Blocked]:
    """Each GPU out of service as a whole-GPU slot of `gpupack.io/devices-in-use`'s `blocked` list."""
    return [Blocked(GpuSlot(gpu), out.reason) for gpu, out in sorted(out_of_service.items())]


def observe_health(out_of_service: Mapping[int, OutOfService]) -> None:
    """Set `gpupack_agent_unhealthy_gpus` by why."""
    for why in Why:
        UNHEALTHY_GPUS.labels(why.value).set(sum(1 for out in out_of_service.values() if out.why == why))
