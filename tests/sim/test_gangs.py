"""The gang protocol (#29 item 4): gangs never leave a partial job holding GPUs, pod-by-pod does; a job larger
than the cluster never starts; the jobs and runs are reproducible by seed."""

from __future__ import annotations

from gpupack.scoring.facts import NodeFacts
from gpupack.scoring.gang import CLIQUE_LABEL
from gpupack.scoring.request import Kind, PodRequest
from gpupack.sim.gangs import (
    K_SIZES,
    Arm,
    GangConfig,
    GangResult,
    JobSpec,
    gang_jobs,
    nvl72_nodes,
    run_gangs,
    split_member,
)
from gpupack.sim.simulate import make_policy
from gpupack.sim.workload import TracePod

GIB = 1 << 30
POLICY = make_policy("gpupack", [])
CONFIG = GangConfig(load=1.2, warmup=0.0, horizon=10.0)


def _node(name: str, gpus: int = 4) -> NodeFacts:
    return NodeFacts(name, 64_000, 512 * GIB, 110, "V100", gpus)


def _whole(gpus: int) -> PodRequest:
    return PodRequest(1000, GIB, Kind.WHOLE, gpus=gpus)


def _job(index: int, gpus: int, count: int, arrival: float, duration: float) -> JobSpec:
    return JobSpec(index, f"job-{index}", _whole(gpus), count, arrival, duration)


def _both(nodes: list[NodeFacts], jobs: list[JobSpec], config: GangConfig = CONFIG) -> dict[Arm, GangResult]:
    return {arm: run_gangs(nodes, jobs, POLICY, arm, 0, config) for arm in Arm}


def test_a_partial_job_holds_gpus_pod_by_pod_and_nothing_as_a_gang() -> None:
    """Node n0 busy until t=2 with a 4-GPU job; a job of two 4-GPU members arrives at t=0.5. Pod by pod its
    first member takes n1 and holds its 4 GPUs idle for 1.5 h; as a gang it waits holding nothing. Both
    start it at t=2, when n0 frees."""
    nodes = [_node("n0"), _node("n1")]
    jobs = [_job(0, 4, 1, 0.0, 2.0), _job(1, 4, 2, 0.5, 1.0)]
    runs = _both(nodes, jobs)
    assert runs[Arm.GANGS].idle_gpu_hours == 0.0
    assert runs[Arm.POD_BY_POD].idle_gpu_hours == 6.0  # 4 GPUs x (2.0 - 0.5)
    for run in runs.values():
        assert run.jobs_started == 2 and run.jobs_arrived == 2
        assert run.wait_mean == 0.75  # (0 + 1.5) / 2
        assert run.partial_at_end == 0
    # 8 GPUs over 10 h: job 0 holds 4 for 2 h, job 1 holds 8 for 1 h; pod by pod also 4 more for 1.5 h
    assert round(runs[Arm.GANGS].unallocated_pct, 6) == round(100 * (1 - 16 / 80), 6)
    assert round(runs[Arm.POD_BY_POD].unallocated_pct, 6) == round(100 * (1 - 22 / 80), 6)


def test_a_job_larger_than_the_cluster_never_starts_and_holds_nothing_as_a_gang() -> None:
    nodes = [_node("n0"), _node("n1")]
    jobs = [_job(0, 4, 3, 1.0, 1.0), _job(1, 1, 1, 2.0, 1.0)]  # 12 GPUs on 8; then a small job
    runs = _both(nodes, jobs)
    gangs, pods = runs[Arm.GANGS], runs[Arm.POD_BY_POD]
    assert gangs.jobs_started == 1 and pods.jobs_started == 0  # the small job only where nothing is held
    assert gangs.idle_gpu_hours == 0.0 and gangs.partial_at_end == 0
    assert pods.idle_gpu_hours == 8.0 * 9.0 and pods.partial_at_end == 1  # two members from t=1 to 10
    assert gangs.wait_mean == (9.0 + 0.0) / 2  # the big job counts horizon - arrival
    assert pods.wait_mean == (9.0 + 8.0) / 2  # the small one finds no GPU pod by pod


def test_on_nvl72_a_gang_stays_in_one_rack() -> None:
    """Two racks of two trays; one tray busy. A job of two 4-GPU members fits only the other rack whole."""
    nodes = nvl72_nodes(racks=2, trays=2)
    assert {n.labels[CLIQUE_LABEL] for n in nodes} == {"nvl72-rack0", "nvl72-rack1"}
    jobs = [_job(0, 4, 1, 0.0, 5.0), _job(1, 4, 2, 0.5, 1.0)]
    run = run_gangs(nodes, jobs, POLICY, Arm.GANGS, 0, CONFIG)
    assert run.jobs_started == 2 and run.jobs_split == 0 and run.wait_mean == 0.0


def _pods() -> list[TracePod]:
    return [
        TracePod("a-share", PodRequest(1000, GIB, Kind.SHARE, milli=500)),
        TracePod("b-one", _whole(1)),
        TracePod("c-eight", PodRequest(8000, 8 * GIB, Kind.WHOLE, gpus=8)),
        TracePod("d-cpu", PodRequest(1000, GIB)),
    ]


def test_jobs_follow_the_documented_mix_and_split_to_the_node_size() -> None:
    nodes = nvl72_nodes(racks=1, trays=4)
    jobs = gang_jobs(_pods(), nodes, 7, GangConfig(load=1.2, warmup=1.0, horizon=30.0))
    assert jobs and all(j.arrival < 30.0 for j in jobs)
    assert [j.arrival for j in jobs] == sorted(j.arrival for j in jobs)
    for job in jobs:
        if job.request.kind == Kind.SHARE:
            assert job.count == 1
        elif job.request.cpu_milli == 4000:  # the 8-GPU pod, as two 4-GPU members
            assert job.request.gpus == 4 and job.request.memory_bytes == 4 * GIB and job.count // 2 in K_SIZES
        else:
            assert job.request.gpus == 1 and job.count in K_SIZES
    assert {j.request.kind for j in jobs} == {Kind.SHARE, Kind.WHOLE}  # no CPU-only jobs
    assert split_member(_whole(2), 4) == (_whole(2), 1)


def test_runs_are_reproducible_by_seed() -> None:
    nodes = nvl72_nodes(racks=2, trays=3)
    config = GangConfig(warmup=1.0, horizon=3.0)
    jobs = gang_jobs(_pods(), nodes, 42, config)
    assert jobs == gang_jobs(_pods(), nodes, 42, config) != gang_jobs(_pods(), nodes, 43, config)
    for arm in Arm:
        first, again = (run_gangs(nodes, jobs, POLICY, arm, 42, config).to_json() for _ in range(2))
        first.pop("seconds"), again.pop("seconds")
        assert first == again
        assert first["jobs_arrived"] == sum(j.arrival >= 1.0 for j in jobs)
