"""Submission orders: FGD shuffle + tune to 130 %, replay, and the Go simulator's order file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupack.scoring.request import Kind, PodRequest
from gpupack.sim.openb import load_openb_nodes, load_openb_pods
from gpupack.sim.protocol import fgd_order, read_order_file, replay_order
from gpupack.sim.workload import (
    TraceError,
    TracePod,
    gpu_milli_capacity,
    gpu_milli_demand,
    gpu_milli_per_gpu,
    gpu_milli_total,
)
from tests.conftest import OPENB, needs_openb

CAPACITY = 6_212_000  # openb GPU cluster, milli-GPU
MAX_POD_MILLI = 8000  # the largest openb pod: 8 whole GPUs


@pytest.fixture(scope="module")
def default_pods() -> list[TracePod]:
    return load_openb_pods(OPENB / "openb_pod_list_default.csv")


def _pod(name: str, gpus: int = 0, milli: int = 0) -> TracePod:
    if gpus:
        request = PodRequest(cpu_milli=1000, kind=Kind.WHOLE, gpus=gpus)
    elif milli:
        request = PodRequest(cpu_milli=1000, kind=Kind.SHARE, milli=milli)
    else:
        request = PodRequest(cpu_milli=1000)
    return TracePod(name=name, request=request)


def _check_tuned(order: list[TracePod], originals: list[TracePod], n_kept: int) -> None:
    """Originals first (each once), then clones named <name>-tuned-<k>, k = 0, 1, ..."""
    by_name = {pod.name: pod for pod in originals}
    assert sorted(pod.name for pod in order[:n_kept]) == sorted(by_name)
    for k, clone in enumerate(order[n_kept:]):
        base, _, index = clone.name.rpartition("-tuned-")
        assert int(index) == k
        assert by_name[base].request == clone.request


def test_gpu_milli_total() -> None:
    assert gpu_milli_total(_pod("a", gpus=8)) == 8000
    assert gpu_milli_total(_pod("b", milli=250)) == 250
    assert gpu_milli_total(_pod("c")) == 0
    assert gpu_milli_total(PodRequest(kind=Kind.MIG, mig=(("1g.10gb", 2),))) == 0
    assert gpu_milli_per_gpu(_pod("a", gpus=8)) == 1000


@needs_openb
@pytest.mark.parametrize("seed", [42, 43, 44, 45, 51])
def test_inflation_reaches_130_percent(default_pods: list[TracePod], seed: int) -> None:
    target = 1.3 * CAPACITY
    go = fgd_order(default_pods, CAPACITY, seed)
    readme = fgd_order(default_pods, CAPACITY, seed, go_quirk=False)
    for order in (go, readme):
        assert len(order) > len(default_pods)
        _check_tuned(order, default_pods, len(default_pods))
    # Go quirk: stops when demand + the drawn pod's per-GPU milli would pass the target
    assert target - 1000 < gpu_milli_demand(go) <= target + MAX_POD_MILLI - 1000
    # README: demand reaches the target, overshooting by less than the last pod
    demand = gpu_milli_demand(readme)
    assert target <= demand < target + gpu_milli_total(readme[-1])


@needs_openb
def test_go_quirk_lets_a_multi_gpu_clone_overshoot(default_pods: list[TracePod]) -> None:
    overshoots = [
        gpu_milli_demand(fgd_order(default_pods, CAPACITY, seed)) - 1.3 * CAPACITY for seed in range(42, 62)
    ]
    assert any(over > 0 for over in overshoots)  # a 2/4/8-GPU clone appended just below the target
    assert any(over <= 0 for over in overshoots)


@needs_openb
def test_same_seed_same_order_different_seeds_differ(default_pods: list[TracePod]) -> None:
    names = [[pod.name for pod in fgd_order(default_pods, CAPACITY, seed)] for seed in (42, 42, 43)]
    assert names[0] == names[1]
    assert names[0] != names[2]
    assert names[0][: len(default_pods)] != [pod.name for pod in default_pods]  # shuffled


def test_order_does_not_depend_on_file_order() -> None:
    pods = [_pod(f"p{i:03d}", milli=100 + i) for i in range(200)]
    forward = fgd_order(pods, 20_000, seed=7)
    backward = fgd_order(pods[::-1], 20_000, seed=7)
    assert [pod.name for pod in forward] == [pod.name for pod in backward]


def test_removal_when_trace_exceeds_target() -> None:
    pods = [_pod(f"big-{i:04d}", gpus=(1, 2, 4, 8)[i % 4]) for i in range(2000)]
    pods += [_pod(f"cpu-{i:04d}") for i in range(300)]
    capacity = 1_000_000  # 1,000 GPUs; the trace asks for 7,500
    target = 1.3 * capacity
    assert gpu_milli_demand(pods) > target
    for seed in (1, 2, 3):
        order = fgd_order(pods, capacity, seed)
        demand = gpu_milli_demand(order)
        assert target - MAX_POD_MILLI < demand <= target
        assert not any("-tuned-" in pod.name for pod in order)
        names = [pod.name for pod in order]
        assert len(set(names)) == len(names) and set(names) <= {pod.name for pod in pods}
    assert fgd_order(pods, capacity, 1) == fgd_order(pods, capacity, 1)
    assert fgd_order(pods, capacity, 1) != fgd_order(pods, capacity, 2)


def test_cpu_only_trace_is_only_shuffled() -> None:
    pods = [_pod(f"c{i}") for i in range(50)]
    order = fgd_order(pods, 8000, seed=1)
    assert sorted(pod.name for pod in order) == sorted(pod.name for pod in pods)


def test_synthetic_inflation_hits_target() -> None:
    pods = [_pod("s", milli=300), _pod("w", gpus=1), _pod("cpu")]
    order = fgd_order(pods, 10_000, seed=3, ratio=2.0, go_quirk=False)
    assert 20_000 <= gpu_milli_demand(order) < 21_000
    _check_tuned(order, pods, 3)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="ratio"):
        fgd_order([], 1000, seed=1, ratio=0)
    with pytest.raises(ValueError, match="capacity"):
        fgd_order([], -1, seed=1)


@needs_openb
def test_go_order_file_for_seed_42(default_pods: list[TracePod]) -> None:
    order = read_order_file(OPENB / "default_seed42_order.txt", default_pods)
    assert len(order) == 10_866
    assert order[0].name == "openb-pod-0255"
    by_name = {pod.name: pod for pod in default_pods}
    originals = [pod for pod in order if "-tuned-" not in pod.name]
    assert len(originals) == len(default_pods) and {pod.name for pod in originals} == set(by_name)
    assert all(by_name[pod.name] is pod for pod in originals)
    _check_tuned(order, default_pods, len(default_pods))
    capacity = gpu_milli_capacity(load_openb_nodes(OPENB / "openb_node_list_gpu_node.csv"))
    assert capacity == CAPACITY
    assert gpu_milli_demand(order) / capacity == pytest.approx(1.30, abs=0.001)
    assert gpu_milli_demand(order) <= 1.3 * capacity


def test_order_file_errors(tmp_path: Path) -> None:
    pods = [_pod("a", milli=100), _pod("b", gpus=2)]
    good = tmp_path / "order.txt"
    good.write_text("# comment\nb\n\na\r\nb-tuned-0\na-tuned-1")
    assert [pod.name for pod in read_order_file(good, pods)] == ["b", "a", "b-tuned-0", "a-tuned-1"]
    assert read_order_file(good, pods)[2].request == pods[1].request
    for body, line, reason in (
        ("a\nzz\n", 2, "'zz' is not a pod"),
        ("a\nzz-tuned-3\n", 2, "'zz-tuned-3' is not a pod"),
        ("# x\na\na\n", 3, "'a' appears twice"),
    ):
        bad = tmp_path / "bad.txt"
        bad.write_text(body)
        with pytest.raises(TraceError, match=f"bad.txt:{line}: {reason}"):
            read_order_file(bad, pods)


def test_replay_keeps_file_order() -> None:
    pods = [_pod(name, milli=100) for name in ("z", "a", "m")]
    order = replay_order(pods)
    assert order == pods and order is not pods


@needs_openb
def test_replay_keeps_trace_file_order(default_pods: list[TracePod]) -> None:
    order = replay_order(default_pods)
    assert [pod.name for pod in order] == [pod.name for pod in default_pods]
    assert gpu_milli_demand(order) == gpu_milli_demand(default_pods)
