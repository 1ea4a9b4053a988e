"""defrag.lease (#31 item 1): one candidate leads; another takes over only when the Lease was not renewed for
its whole duration (by its own clock), or was given up; racing writes leave one leader; the Lease carries the
eviction times of the window."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpupack.defrag.lease import LeaseElector, _evictions
from tests.defrag.fake_leases import Clock, FakeLeases


def elector(leases: FakeLeases, name: str, clock: Clock, duration: int = 30, keep: float = 3600.0) -> LeaseElector:
    return LeaseElector(leases, name, duration, keep_seconds=keep, clock=clock, wall=clock)


def test_the_first_candidate_creates_the_lease_and_leads() -> None:
    leases, clock = FakeLeases(), Clock()
    a = elector(leases, "a", clock)
    assert a.hold() and a.leading
    assert leases.record is not None and leases.record.holder == "a" and leases.record.duration_seconds == 30


def test_a_follower_waits_while_the_leader_renews_and_takes_over_after_a_whole_duration_without() -> None:
    leases, clock = FakeLeases(), Clock()
    a, b = elector(leases, "a", clock), elector(leases, "b", clock)
    assert a.hold()
    for _ in range(10):
        clock.now += 20  # within the duration each time: a renews
        assert not b.hold()
        assert a.hold()
    assert not b.hold()  # b sees a's last renewal now ...
    clock.now += 29
    assert not b.hold()  # ... and 29 s later, by its own clock, it is not expired yet
    clock.now += 1
    assert b.hold()
    assert leases.record is not None and leases.record.holder == "b" and leases.record.transitions == 1
    assert not a.hold()  # a's next renewal finds b holding a fresh Lease


def test_expiry_is_judged_from_when_the_follower_saw_the_renewal_not_from_the_writers_clock() -> None:
    leases, clock = FakeLeases(), Clock()
    a = elector(leases, "a", clock)
    a.hold()
    late = Clock(clock.now + 10_000)  # another host whose clock is far ahead
    b = elector(leases, "b", late)
    assert not b.hold()
    late.now += 29
    assert not b.hold()
    late.now += 1
    assert b.hold()


def test_of_two_followers_racing_for_an_expired_lease_one_wins() -> None:
    leases, clock = FakeLeases(), Clock()
    elector(leases, "a", clock).hold()
    b, c = elector(leases, "b", clock), elector(leases, "c", clock)
    b.hold(), c.hold()
    clock.now += 31
    stale = leases.record
    assert b.hold()
    leases.read = lambda: stale  # type: ignore[method-assign]  # c read before b's write landed: 409 for c
    assert not c.hold()
    assert leases.record is not None and leases.record.holder == "b"


def test_a_lease_given_up_is_taken_at_once() -> None:
    leases, clock = FakeLeases(), Clock()
    a, b = elector(leases, "a", clock), elector(leases, "b", clock)
    a.hold()
    assert not b.hold()
    a.release()
    assert not a.leading
    assert b.hold()


def test_an_api_error_is_not_leading() -> None:
    leases, clock = FakeLeases(), Clock()
    a = elector(leases, "a", clock)
    assert a.hold()
    leases.fail_reads = True
    assert not a.hold() and not a.leading


def test_the_lease_records_the_windows_evictions_for_the_next_leader() -> None:
    leases, clock = FakeLeases(), Clock()
    a, b = elector(leases, "a", clock, keep=100), elector(leases, "b", clock, keep=100)
    a.hold(spend=[clock.now, clock.now])
    clock.now += 60
    a.hold(spend=[clock.now])
    assert a.evictions() == (1000.0, 1000.0, 1060.0)
    assert not b.hold() and b.evictions() == (1000.0, 1000.0, 1060.0)  # a follower reads them too
    clock.now += 50
    a.hold()  # the first two are older than keep_seconds now
    assert leases.record is not None and leases.record.evictions == (1060.0,)


def test_a_release_by_another_holder_changes_nothing() -> None:
    leases, clock = FakeLeases(), Clock()
    a = elector(leases, "a", clock)
    a.hold()
    assert leases.record is not None
    leases.record = replace(leases.record, holder="b")
    a.release()
    assert leases.record.holder == "b"


@pytest.mark.parametrize("text", ["", "not json", '{"a": 1}', '[1, "x"]'])
def test_an_eviction_annotation_that_is_not_a_list_of_times_counts_as_none(text: str) -> None:
    assert _evictions(text) == ()


def test_an_eviction_annotation_is_read() -> None:
    assert _evictions("[1.5, 2]") == (1.5, 2.0)
