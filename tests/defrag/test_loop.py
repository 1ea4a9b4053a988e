"""defrag.loop (#31 items 1 and 2): only the leader plans; a dry run evicts nothing; a round plans no more than
the window's budget allows and records each move's evictions in the Lease before carrying it out; a leader
that lost its Lease stops; a pending pod already moved for settles first; a failed round is counted."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from types import SimpleNamespace
from typing import Any, cast

from gpupack.defrag.execute import Carried, Outcome
from gpupack.defrag.lease import LeaseElector
from gpupack.defrag.loop import DefragLoop, LoopSettings, budget_left
from gpupack.kube.keys import ANNOTATION_DEFRAG_HOLD
from gpupack.report.snapshot import ClusterSnapshot
from gpupack.scoring.defrag import DefragPlan, Eviction, Move
from gpupack.scoring.defrag_goals import Goal
from gpupack.scoring.facts import GpuSlot, Placement
from tests.defrag.fake_leases import Clock, FakeLeases


def move(target: str, *pods: str) -> Move:
    evictions = tuple(Eviction(p, "n0", Placement("n1", (GpuSlot(0),))) for p in pods)
    return Move(Goal.PENDING, target, evictions, "the pod is placed", 100.0 * len(pods), Placement("n0", (GpuSlot(1),)))


def pending_pod(key: str, hold: str | None = None) -> dict[str, Any]:
    namespace, _, name = key.partition("/")
    annotations = {ANNOTATION_DEFRAG_HOLD: hold} if hold is not None else {}
    return {"metadata": {"namespace": namespace, "name": name, "annotations": annotations}, "spec": {}}


class Cluster:
    """What the loop reads, plans and carries out, recorded: the plan is the moves given, cut at the budget."""

    def __init__(self, moves: list[Move], pods: list[dict[str, Any]] | None = None) -> None:
        self.moves = moves
        self.pods = pods or []
        self.planned: list[tuple[int, set[str]]] = []  # (max evictions, not for) of each plan
        self.carried: list[str] = []
        self.fail_read = False

    def read(self) -> ClusterSnapshot:
        if self.fail_read:
            raise OSError("the API server is unreachable")
        pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in self.pods}
        return cast(ClusterSnapshot, SimpleNamespace(pods=pods))

    def plan(self, snapshot: ClusterSnapshot, most: int, not_for: Collection[str]) -> DefragPlan:
        self.planned.append((most, set(not_for)))
        kept: list[Move] = []
        for m in self.moves:
            if m.target not in not_for and sum(len(k.evictions) for k in kept) + len(m.evictions) <= most:
                kept.append(m)
        return DefragPlan(kept)

    def carry(self, snapshot: ClusterSnapshot, plan: DefragPlan, may_move: Callable[[int], bool]) -> Carried:
        carried = Carried()
        for m in plan.moves:
            if not may_move(len(m.evictions)):
                carried.stopped = "stopped"
                return carried
            for e in m.evictions:
                self.carried.append(e.pod)
                carried.outcomes.append((e.pod, Outcome.EVICTED))
        return carried


def make_loop(cluster: Cluster, leases: FakeLeases, clock: Clock, name: str = "a", **settings: Any) -> DefragLoop:
    elector = LeaseElector(leases, name, 30, keep_seconds=3600, clock=clock, wall=clock)
    elector.hold()
    return DefragLoop(
        LoopSettings(**settings), elector, cluster.read, cluster.plan, cluster.carry, clock=clock, wall=clock
    )


def sample(loop: DefragLoop, name: str, **labels: str) -> float:
    value = loop.metrics.registry.get_sample_value(name, labels or None)
    return value or 0.0


def test_a_dry_run_round_plans_and_counts_but_evicts_nothing() -> None:
    cluster, clock = Cluster([move("ml/big", "ml/a")]), Clock()
    loop = make_loop(cluster, FakeLeases(), clock)
    assert loop.round() == "dry-run"
    assert cluster.carried == []
    assert sample(loop, "gpupack_defrag_moves_planned_total", goal="schedule-pending-pod") == 1
    assert sample(loop, "gpupack_defrag_rounds_total", outcome="dry-run") == 1


def test_an_executing_round_records_each_moves_evictions_in_the_lease_first() -> None:
    cluster, leases, clock = Cluster([move("ml/big", "ml/a"), move("ml/huge", "ml/b", "ml/c")]), FakeLeases(), Clock()
    loop = make_loop(cluster, leases, clock, execute=True)
    assert loop.round() == "executed"
    assert cluster.carried == ["ml/a", "ml/b", "ml/c"]
    assert leases.record is not None and leases.record.evictions == (clock.now,) * 3
    assert sample(loop, "gpupack_defrag_evictions_total", outcome="evicted") == 3
    assert sample(loop, "gpupack_defrag_gpu_seconds_lost_total") == 300
    assert sample(loop, "gpupack_defrag_eviction_budget_left") == 5


def test_a_round_plans_no_more_than_the_window_allows_and_none_when_it_is_spent() -> None:
    moves = [move(f"ml/p{i}", f"ml/v{i}") for i in range(5)]
    cluster, leases, clock = Cluster(moves), FakeLeases(), Clock()
    loop = make_loop(cluster, leases, clock, execute=True, window_evictions=3, window_seconds=600, round_evictions=2)
    loop.round()
    loop.round()
    assert [most for most, _ in cluster.planned] == [2, 1]  # 2 a round at most, then the 1 left of 3
    assert len(cluster.carried) == 3
    assert loop.round() == "budget-spent" and len(cluster.planned) == 2  # the cluster is not even read
    clock.now += 601
    loop.round()
    assert cluster.planned[-1][0] == 2


def test_a_replica_taking_over_spends_the_same_window() -> None:
    cluster, leases, clock = Cluster([move("ml/big", "ml/a", "ml/b")]), FakeLeases(), Clock()
    first = make_loop(cluster, leases, clock, execute=True, window_evictions=2)
    first.round()
    first.elector.release()
    second = make_loop(Cluster([move("ml/huge", "ml/c")]), leases, clock, name="b", execute=True, window_evictions=2)
    assert second.elector.leading
    assert second.round() == "budget-spent"


def test_a_leader_that_lost_the_lease_stops_before_the_next_move() -> None:
    cluster, leases, clock = Cluster([move("ml/big", "ml/a"), move("ml/huge", "ml/b")]), FakeLeases(), Clock()
    loop = make_loop(cluster, leases, clock, execute=True)
    thief = LeaseElector(leases, "b", 30, clock=clock, wall=clock)
    original = cluster.carry

    def carry_while_losing(snapshot: ClusterSnapshot, plan: DefragPlan, may_move: Callable[[int], bool]) -> Carried:
        def may(count: int) -> bool:
            if cluster.carried:  # after the first move: a pause longer than the Lease, and b took it
                thief.hold()
                clock.now += 31
                assert thief.hold()
            return may_move(count)

        return original(snapshot, plan, may)

    loop.carry = carry_while_losing
    assert loop.round() == "stopped"
    assert cluster.carried == ["ml/a"]
    assert sample(loop, "gpupack_defrag_leader") == 0


def test_a_pending_pod_moved_for_settles_before_it_is_planned_for_again() -> None:
    cluster, clock = Cluster([], [pending_pod("ml/big", hold='{"node": "n0"}'), pending_pod("ml/other")]), Clock()
    loop = make_loop(cluster, FakeLeases(), clock, settle_seconds=300)
    loop.round()
    clock.now += 299
    loop.round()
    clock.now += 1
    loop.round()
    assert [not_for for _, not_for in cluster.planned] == [{"ml/big"}, {"ml/big"}, set()]
    cluster.pods[0]["metadata"]["annotations"][ANNOTATION_DEFRAG_HOLD] = '{"node": "n1"}'  # moved for again
    loop.round()
    assert cluster.planned[-1][1] == {"ml/big"}


def test_a_failed_round_is_counted_and_the_next_one_runs() -> None:
    cluster, clock = Cluster([move("ml/big", "ml/a")]), Clock()
    loop = make_loop(cluster, FakeLeases(), clock)
    cluster.fail_read = True
    assert loop.round() == "error"
    cluster.fail_read = False
    assert loop.round() == "dry-run"
    assert sample(loop, "gpupack_defrag_rounds_total", outcome="error") == 1


class Ticks(threading.Event):
    """A stop event whose waits move the clock; set after `count` waits."""

    def __init__(self, clock: Clock, count: int) -> None:
        super().__init__()
        self.clock, self.count = clock, count

    def wait(self, timeout: float | None = None) -> bool:
        self.clock.now += timeout or 0
        self.count -= 1
        if self.count <= 0:
            self.set()
        return self.is_set()


def test_of_two_replicas_only_the_leader_plans_and_rounds_come_every_period() -> None:
    leases, clock = FakeLeases(), Clock()
    a_cluster, b_cluster = Cluster([move("ml/big", "ml/a")]), Cluster([move("ml/big", "ml/a")])
    a = make_loop(a_cluster, leases, clock, every_seconds=60, retry_seconds=5)
    b = make_loop(b_cluster, leases, clock, name="b", every_seconds=60, retry_seconds=5)
    for _ in range(3):  # interleaved: each runs 12 ticks (60 s) at a time
        a.run(Ticks(clock, 12))
        b.run(Ticks(clock, 12))
    assert len(a_cluster.planned) + len(b_cluster.planned) >= 3
    assert leases.record is not None and leases.record.holder == ""  # each gave the Lease up when stopped


def test_a_follower_never_plans() -> None:
    leases, clock = FakeLeases(), Clock()
    leader = LeaseElector(leases, "a", 30, clock=clock, wall=clock)
    leader.hold()
    cluster = Cluster([move("ml/big", "ml/a")])
    follower = make_loop(cluster, leases, clock, name="b", retry_seconds=5)
    stop = Ticks(clock, 5)  # 25 s: the leader's Lease has not expired
    follower.run(stop)
    assert cluster.planned == []
    assert sample(follower, "gpupack_defrag_leader") == 0


def test_budget_left_counts_only_the_window() -> None:
    assert budget_left([10.0, 50.0, 99.0], now=100.0, window_seconds=60.0, limit=4) == 2
    assert budget_left([10.0] * 9, now=20.0, window_seconds=60.0, limit=8) == 0
