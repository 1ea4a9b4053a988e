"""A Lease store that behaves as the API server does for one Lease: create fails when it exists, replace
fails (409) unless at the current resourceVersion, and every write bumps the version."""

from __future__ import annotations

from dataclasses import replace

from gpupack.defrag.lease import LeaseRecord


class FakeLeases:
    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.writes = 0
        self.fail_reads = False

    def read(self) -> LeaseRecord | None:
        if self.fail_reads:
            raise OSError("connection refused")
        return self.record

    def write(self, record: LeaseRecord) -> bool:
        current = self.record.version if self.record is not None else ""
        if record.version != current:
            return False
        self.writes += 1
        self.record = replace(record, version=str(self.writes))
        return True


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
