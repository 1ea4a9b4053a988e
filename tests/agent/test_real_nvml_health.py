"""RealNvml's health calls over a stand-in `pynvml` with NVML's return semantics (no GPU needed):
events through one event set, Timeout as "no event", GPU_IS_LOST per device, static facts kept."""

from __future__ import annotations

import sys
import types
from collections import deque
from types import SimpleNamespace

import pytest

from gpupack.agent.nvml import NvmlError, XidEvent

TIMEOUT, NOT_SUPPORTED, UNKNOWN, GPU_IS_LOST = 10, 3, 999, 15
XID_CRITICAL = 0x8


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__({TIMEOUT: "Timeout", GPU_IS_LOST: "GPU is lost"}.get(value, f"error {value}"))
        self.value = value


def _pynvml(lost: set[int], refuse: set[int], events: deque) -> types.ModuleType:
    def check(handle: int) -> int:
        if handle in lost:
            raise NVMLError(GPU_IS_LOST)
        return handle

    def wait(event_set: object, timeout_ms: int) -> SimpleNamespace:
        if not events:
            raise NVMLError(TIMEOUT)
        item = events.popleft()
        if isinstance(item, int):
            raise NVMLError(item)
        return item

    def register(handle: int, types_: int, event_set: object) -> None:
        assert types_ == XID_CRITICAL
        if handle in refuse:
            raise NVMLError(NOT_SUPPORTED)

    module = types.ModuleType("pynvml")
    module.__dict__.update(
        NVMLError=NVMLError, NVML_ERROR_TIMEOUT=TIMEOUT, NVML_ERROR_GPU_IS_LOST=GPU_IS_LOST,
        nvmlEventTypeXidCriticalError=XID_CRITICAL, nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=f"00000000:{check(h) + 16:02x}:00.0"),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=81559 << 20, used=check(h)),
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3", nvmlDeviceGetUUID=lambda h: f"GPU-{check(h)}",
        nvmlEventSetCreate=lambda: object(), nvmlDeviceRegisterEvents=register, nvmlEventSetWait_v2=wait,
        nvmlDeviceGetIndex=lambda h: h,
    )  # fmt: skip
    return module


def _real(monkeypatch: pytest.MonkeyPatch, events: deque, refuse: frozenset[int] = frozenset()) -> tuple:
    lost: set[int] = set()
    monkeypatch.setitem(sys.modules, "pynvml", _pynvml(lost, set(refuse), events))
    from gpupack.agent.real_nvml import RealNvml

    return RealNvml(), lost


def test_a_lost_gpu_is_seen_by_index_and_its_facts_still_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml, lost = _real(monkeypatch, deque())
    before = nvml.gpus()
    lost.add(1)
    assert nvml.gpus() == before  # before: nvmlDeviceGetPciInfo raised GPU is lost for every caller
    assert (nvml.lost(0), nvml.lost(1)) == (False, True)


def test_xid_events_come_from_the_event_set_and_timeout_is_no_event(monkeypatch: pytest.MonkeyPatch) -> None:
    events: deque = deque([SimpleNamespace(device=1, eventType=XID_CRITICAL, eventData=79), UNKNOWN])
    nvml, _ = _real(monkeypatch, events, refuse=frozenset({0}))
    assert nvml.next_xid(0) is None  # nothing registered yet
    assert nvml.watch_xids() == {0: "error 3"}
    assert nvml.next_xid(0) == XidEvent(1, 79)
    with pytest.raises(NvmlError, match="error 999"):
        nvml.next_xid(0)
    assert nvml.next_xid(0) is None  # NVML_ERROR_TIMEOUT
