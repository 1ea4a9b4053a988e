"""openb CSV loaders: every published file, the default trace's composition, and strict validation."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpupack.scoring.facts import MigMode
from gpupack.scoring.request import Kind
from gpupack.sim.load import load_nodes, load_pods
from gpupack.sim.openb import load_openb_nodes, load_openb_pods
from gpupack.sim.workload import Trace, TraceError, gpu_milli_demand, gpu_milli_total
from tests.conftest import OPENB, needs_openb

POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
    "scheduled_time"
)

ROWS = {
    "openb_node_list_gpu_node.csv": 1213,
    "openb_node_list_all_node.csv": 1523,
    "openb_pod_list_default.csv": 8152,
    "openb_pod_list_cpu050.csv": 7439,
    "openb_pod_list_gpushare40.csv": 8152,
    "openb_pod_list_gpuspec10.csv": 8152,
    "openb_pod_list_multigpu20.csv": 8324,
}


@needs_openb
@pytest.mark.parametrize("name", sorted(ROWS))
def test_every_file_loads_with_readme_row_count(name: str) -> None:
    path = OPENB / name
    loader = load_openb_nodes if "node_list" in name else load_openb_pods
    rows = loader(path)
    assert len(rows) == ROWS[name]
    # the extension dispatcher gives the same thing
    assert (load_nodes if "node_list" in name else load_pods)(path) == rows


@needs_openb
def test_gpu_node_list() -> None:
    nodes = load_openb_nodes(OPENB / "openb_node_list_gpu_node.csv")
    assert len(nodes) == 1213
    assert sum(node.gpu_count for node in nodes) == 6212
    assert Trace(nodes=nodes, pods=[]).gpu_milli_capacity == 6_212_000
    shapes = Counter((node.gpu_product, node.gpu_count) for node in nodes)
    assert shapes[("G2", 8)] == 549
    assert shapes[("T4", 2)] == 387 and shapes[("T4", 4)] == 17
    assert shapes[("V100M16", 1)] == 19 and shapes[("A10", 1)] == 2
    first = nodes[0]
    assert (first.name, first.cpu_milli, first.memory_bytes) == ("openb-node-0000", 64000, 262144 << 20)
    assert (first.gpu_product, first.gpu_count, first.pods, first.mig_mode) == ("P100", 2, 1001, MigMode.NONE)


@needs_openb
def test_all_node_list_has_cpu_nodes() -> None:
    nodes = load_openb_nodes(OPENB / "openb_node_list_all_node.csv")
    cpu_nodes = [node for node in nodes if node.gpu_count == 0]
    assert len(cpu_nodes) == 310
    assert all(node.gpu_product == "" for node in cpu_nodes)
    assert sum(node.gpu_count for node in nodes) == 6212


def _shape(kind: Kind, gpus: int) -> str:
    return {Kind.NONE: "cpu", Kind.SHARE: "share"}.get(kind, f"{gpus}-gpu")


@needs_openb
def test_default_trace_composition() -> None:
    pods = load_openb_pods(OPENB / "openb_pod_list_default.csv")
    counts = Counter(_shape(pod.request.kind, pod.request.gpus) for pod in pods)
    assert counts == {"cpu": 1088, "share": 3078, "1-gpu": 3911, "2-gpu": 16, "4-gpu": 15, "8-gpu": 44}
    demand = gpu_milli_demand(pods)
    assert demand / 6_212_000 == pytest.approx(0.980, abs=0.0005)
    shared = sum(gpu_milli_total(pod) for pod in pods if pod.request.kind == Kind.SHARE)
    assert shared / demand == pytest.approx(0.285, abs=0.0005)
    assert all(pod.request.allowed_products is None for pod in pods)
    first, second = pods[0], pods[1]
    assert first.name == "openb-pod-0000" and first.qos == "LS"
    assert (first.request.kind, first.request.gpus, first.request.cpu_milli) == (Kind.WHOLE, 1, 12000)
    assert first.request.memory_bytes == 16384 << 20 and not first.request.interruptible
    assert (second.request.kind, second.request.milli) == (Kind.SHARE, 460)
    be = [pod for pod in pods if pod.qos == "BE"]
    assert be and all(pod.request.interruptible for pod in be)
    assert all(not pod.request.interruptible for pod in pods if pod.qos != "BE")


@needs_openb
def test_gpuspec_constraints() -> None:
    pods = load_openb_pods(OPENB / "openb_pod_list_gpuspec10.csv")
    constrained = [pod for pod in pods if pod.request.allowed_products is not None]
    assert 700 <= len(constrained) <= 800
    products = {product for pod in constrained for product in pod.request.allowed_products or ()}
    assert products == {"A10", "G2", "G3", "P100", "T4", "V100M16", "V100M32"}
    # "V100M16|V100M32|V100M32": repeats collapse
    assert any(pod.request.allowed_products == frozenset({"V100M16", "V100M32"}) for pod in constrained)


@needs_openb
def test_multigpu_five_column_schema() -> None:
    pods = load_openb_pods(OPENB / "openb_pod_list_multigpu20.csv")
    counts = Counter(_shape(pod.request.kind, pod.request.gpus) for pod in pods)
    assert counts == {"cpu": 1088, "share": 3078, "1-gpu": 3911, "2-gpu": 54, "4-gpu": 52, "8-gpu": 141}
    assert all(pod.qos == "" and pod.request.allowed_products is None for pod in pods)


# ---------------------------------------------------------------- malformed and unusual files


def _write(tmp_path: Path, text: str, name: str = "pods.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode())
    return path


GOOD_ROW = "p0,1000,1024,1,500,,BE,Running,0,1,0"


def test_crlf_and_no_trailing_newline(tmp_path: Path) -> None:
    path = _write(tmp_path, f"{POD_HEADER}\r\n{GOOD_ROW}\r\np1,2000,0,2,1000,T4|T4,LS,Running,0,1,0")
    pods = load_openb_pods(path)
    assert [pod.name for pod in pods] == ["p0", "p1"]
    assert pods[0].request.kind == Kind.SHARE and pods[0].request.milli == 500
    assert pods[0].request.interruptible
    assert pods[1].request.kind == Kind.WHOLE and pods[1].request.gpus == 2
    assert pods[1].request.allowed_products == frozenset({"T4"})
    nodes = load_openb_nodes(_write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model\r\nn0,1000,2,0,", "n.csv"))
    assert nodes[0].memory_bytes == 2 << 20 and nodes[0].gpu_product == "" and nodes[0].gpu_count == 0


@pytest.mark.parametrize(
    ("row", "line", "reason"),
    [
        ("p1,1000,1024,1,500,,BE", 3, "7 columns, expected 11"),
        ("p1,1k,1024,1,500,,BE,Running,0,1,0", 3, "cpu_milli is not an integer"),
        ("p1,1000,-5,1,500,,BE,Running,0,1,0", 3, "memory_mib is negative"),
        ("p1,1000,1024,17,1000,,BE,Running,0,1,0", 3, "num_gpu 17 is out of range"),
        ("p1,1000,1024,1,1001,,BE,Running,0,1,0", 3, "gpu_milli 1001 is out of range"),
        ("p1,1000,1024,2,500,,BE,Running,0,1,0", 3, "needs gpu_milli 1000"),
        ("p1,1000,1024,0,500,,BE,Running,0,1,0", 3, "num_gpu is 0 but gpu_milli is 500"),
        ("p1,1000,1024,1,0,,BE,Running,0,1,0", 3, "num_gpu is 1 but gpu_milli is 0"),
        ("p1,1000,1024,1,2.5,,BE,Running,0,1,0", 3, "gpu_milli is not an integer"),
        ("p0,1000,1024,1,500,,BE,Running,0,1,0", 3, "duplicate name 'p0'"),
        (",1000,1024,1,500,,BE,Running,0,1,0", 3, "name is empty"),
    ],
)
def test_malformed_pod_rows(tmp_path: Path, row: str, line: int, reason: str) -> None:
    path = _write(tmp_path, f"{POD_HEADER}\n{GOOD_ROW}\n{row}\n")
    with pytest.raises(TraceError) as info:
        load_openb_pods(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}:")
    assert reason in message


def test_wrong_header(tmp_path: Path) -> None:
    path = _write(tmp_path, "name,cpu,memory_mib,num_gpu,gpu_milli\np0,1,1,0,0\n")
    with pytest.raises(TraceError, match=r"pods\.csv:1: wrong header"):
        load_openb_pods(path)
    with pytest.raises(TraceError, match=r":1: wrong header"):
        load_openb_nodes(_write(tmp_path, f"{POD_HEADER}\n", "n.csv"))
    with pytest.raises(TraceError, match="empty file"):
        load_openb_pods(_write(tmp_path, "", "empty.csv"))


def test_line_numbers_count_blank_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, f"{POD_HEADER}\n\n{GOOD_ROW}\n\np2,1,1,3,999,,LS,Running,0,1,0\n")
    with pytest.raises(TraceError, match=r":5: num_gpu 3 > 1 needs gpu_milli 1000"):
        load_openb_pods(path)


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("n1,1000,1024,2", "4 columns, expected 5"),
        ("n1,1000,1024,20,G2", "gpu 20 is out of range"),
        ("n1,x,1024,2,G2", "cpu_milli is not an integer"),
        ("n0,1000,1024,2,G2", "duplicate sn 'n0'"),
    ],
)
def test_malformed_node_rows(tmp_path: Path, row: str, reason: str) -> None:
    path = _write(tmp_path, f"sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1024,8,G2\n{row}\n", "nodes.csv")
    with pytest.raises(TraceError) as info:
        load_openb_nodes(path)
    assert str(info.value).startswith(f"{path}:3:")
    assert reason in str(info.value)


def test_unknown_extension(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="unknown file type"):
        load_pods(_write(tmp_path, "x", "pods.txt"))
