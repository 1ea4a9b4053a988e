"""ReservationBook's deadlines: only ASSUMED reservations expire, each at its own deadline, once."""

from __future__ import annotations

from gpupack.extender.reservations import Ended, ReservationBook, ReservationState
from gpupack.scoring.facts import GpuSlot, Placement
from gpupack.scoring.request import Kind, PodRequest
from tests.extender_helpers import FakeClock

REQUEST = PodRequest(1000, 1 << 30, Kind.WHOLE, gpus=1)


def hold(book: ReservationBook, uid: str) -> None:
    book.assume(uid, f"default/{uid}", Placement("n", (GpuSlot(0),), 1000, 1 << 30), REQUEST)


def test_each_assumed_reservation_expires_at_its_own_deadline_and_only_once() -> None:
    clock = FakeClock(0.0)
    book = ReservationBook(30.0, clock)
    hold(book, "a")
    clock.advance(10)
    hold(book, "b")
    hold(book, "binding")
    book.start_bind("binding")  # no TTL while the writes are in flight
    clock.advance(10)
    hold(book, "gone")
    book.forget("gone", Ended.POD_DELETED)
    hold(book, "gone")  # the same uid again: only this reservation's deadline counts

    assert book.expire_due(now=29.9) == []
    assert [r.uid for r in book.expire_due(now=30.0)] == ["a"]
    assert book.expire_due(now=30.0) == []
    assert [r.uid for r in book.expire_due(now=45.0)] == ["b"]
    expired = book.expire_due(now=1000.0)
    assert [r.uid for r in expired] == ["gone"] and expired[0].state == ReservationState.FORGOTTEN
    assert [r.uid for r in book.live()] == ["binding"]
    assert book.ended == {"expired": 3, "pod deleted": 1}
