"""`gpupack topology`: reading `nvidia-smi topo -m` (real captures and hand-made variants)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from gpupack.agent.topology import Topology, TopologyTextError, parse_topo_matrix
from gpupack.cli import main
from gpupack.kube.node_facts import parse_topology

DATA = Path(__file__).resolve().parents[1] / "data"
NVSWITCH4 = [[0, 18, 18, 18], [18, 0, 18, 18], [18, 18, 0, 18], [18, 18, 18, 0]]


def _read(name: str) -> Topology:
    return parse_topo_matrix((DATA / name).read_bytes().decode())


@pytest.mark.parametrize("name", ["h100x4-topo-m.txt", "h200x4-topo-m.txt"])
def test_real_nvswitch_captures_read_as_nv18_everywhere(name: str) -> None:
    topology = _read(name)
    assert topology.to_json() == {"nvlink": NVSWITCH4, "numa": [0, 0, 0, 0]}
    # what the agent writes is what `gpupack serve` reads back
    assert parse_topology(orjson.loads(topology.to_annotation()), 4) == (
        tuple(map(tuple, NVSWITCH4)),
        (0, 0, 0, 0),
    )


def test_nic_columns_and_rows_and_mixed_links() -> None:
    topology = _read("mixed-nic-topo-m.txt")
    assert topology.nvlink == ((0, 4, 0, 0), (4, 0, 0, 2), (0, 0, 0, 12), (0, 2, 12, 0))
    assert topology.numa == (0, 0, 1, 1)


def test_pcie_only_with_na_numa_and_crlf() -> None:
    topology = _read("pcie-na-numa-topo-m.txt")
    assert topology.to_json() == {"nvlink": [[0, 0], [0, 0]], "numa": [-1, -1]}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no header row"),
        ("hello\nworld\n", "no header row"),
        ("\tGPU0\tGPU2\tNUMA Affinity\nGPU0\t X \tSYS\t0\nGPU2\tSYS\t X \t0\n", "GPU0..GPU1"),
        ("\tGPU0\tGPU1\tNUMA Affinity\nGPU0\t X \tNV4\t0\n\n", "expected rows GPU0..GPU1"),
        ("\tGPU0\tGPU1\tNUMA Affinity\nGPU0\t X \tNV4\t0\nGPU1\tNV2\t X \t0\n", "disagree"),
        ("\tGPU0\tGPU1\tNUMA Affinity\nGPU0\t X \tNV4\t0\nGPU1\tNV4\n", "cells"),
        ("\tGPU0\tNUMA Affinity\nGPU0\t X \tzero\n", "NUMA Affinity 'zero'"),
    ],
)
def test_unreadable_text_is_refused_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(TopologyTextError, match=reason):
        parse_topo_matrix(text)


def test_cli_prints_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", str(DATA / "h100x4-topo-m.txt")]) == 0
    assert orjson.loads(capsys.readouterr().out) == {"nvlink": NVSWITCH4, "numa": [0, 0, 0, 0]}


def test_cli_reads_standard_input_and_exits_2_on_garbage(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"not a matrix\n")))
    assert main(["topology"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no header row" in captured.err


def test_cli_missing_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["topology", str(tmp_path / "absent.txt")]) == 2
    assert "absent.txt" in capsys.readouterr().err


def test_console_script_reads_raw_bytes_from_a_pipe() -> None:
    raw = (DATA / "h200x4-topo-m.txt").read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "gpupack.cli", "topology"], input=raw, capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout)["nvlink"] == NVSWITCH4
