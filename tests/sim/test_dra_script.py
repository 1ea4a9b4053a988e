"""The real-scheduler comparison's MIG churn script (#30) and its replay in the simulator."""

from __future__ import annotations

import pytest

from gpupack.sim.dra_script import SLICES, TARGET, Rig, churn_events, replay, tally

SMALL = Rig(2, 4)


@pytest.mark.parametrize("seed", range(5))
def test_the_script_holds_under_the_target_and_departs_only_what_it_holds(seed: int) -> None:
    live: dict[int, str] = {}
    for event in churn_events(seed, 150, SMALL):
        if event.departs:
            assert live.pop(event.arrival) == event.profile
        else:
            assert event.arrival not in live
            live[event.arrival] = event.profile
        assert sum(SLICES[p] for p in live.values()) <= TARGET * SMALL.compute_slices


def test_the_script_is_the_seeds_alone_and_grows_with_the_rig() -> None:
    assert churn_events(3, 100, SMALL) == churn_events(3, 100, SMALL)
    assert churn_events(3, 100, SMALL) != churn_events(4, 100, SMALL)
    fills = [next(i for i, e in enumerate(churn_events(3, 300, rig)) if e.departs) for rig in (SMALL, Rig(4, 8))]
    assert fills[0] < fills[1]


def test_a_replay_is_deterministic_for_gpupack_and_per_draw_for_upstream() -> None:
    script = churn_events(7, 150, SMALL)
    assert replay("gpupack", script, SMALL) == replay("gpupack", script, SMALL)
    assert replay("upstream", script, SMALL, draw=1) == replay("upstream", script, SMALL, draw=1)
    with pytest.raises(ValueError, match="arm must be"):
        replay("best-fit", script, SMALL)


def test_gpupack_rejects_fewer_claims_than_first_fit_over_a_few_seeds() -> None:
    result = tally(SMALL, 100, range(6), draws=2)
    assert result.wins + result.ties + result.losses == 12
    assert result.gpupack < result.upstream
    assert result.wins > result.losses


def test_an_empty_rig_rejects_nothing_that_fits_one_gpu() -> None:
    script = churn_events(0, 6, Rig(1, 8))
    assert all(not e.departs for e in script)
    assert replay("gpupack", script, Rig(1, 8)) == 0 == replay("upstream", script, Rig(1, 8))
