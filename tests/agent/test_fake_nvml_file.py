"""The fake node file (`gpupack agent --fake-nvml`): read, MIG state written back, errors, selection."""

from __future__ import annotations

import argparse
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from gpupack.agent import main as agent_main
from gpupack.agent.fake_nvml import FakeNvml
from gpupack.agent.fake_nvml_file import FakeNvmlFileError, FileNvml
from gpupack.agent.main import FAKE_NVML_ENV, select_nvml
from gpupack.agent.nvml import NvmlError
from gpupack.agent.nvml_topology import read_topology
from gpupack.cli import build_parser

H100 = "NVIDIA H100 80GB HBM3"
NODE: dict[str, Any] = {
    "gpus": [{"name": H100, "mig": False}, {"name": H100, "mig": False}, {"name": H100, "mig": True}],
    "nvlink": [[0, 18, 0], [18, 0, 4], [0, 4, 0]],
    "numa": [0, 1, None],
    "instances": [{"gpu": 2, "profile": "3g.40gb", "start": 4}, {"gpu": 2, "profile": "1g.10gb.me", "start": 0}],
}


def write(path: Path, document: object) -> Path:
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


@pytest.fixture
def node_file(tmp_path: Path) -> Path:
    return write(tmp_path / "node.json", NODE)


def test_file_reads_as_the_fake_it_describes(node_file: Path) -> None:
    nvml = FileNvml.open(node_file)
    built = FakeNvml.build(H100, 3, nvlink=NODE["nvlink"], numa=NODE["numa"])
    assert nvml.gpus() == built.gpus()  # same UUIDs, bus IDs and memory as FakeNvml.build
    assert read_topology(nvml) == read_topology(built)
    assert [nvml.mig_enabled(i) for i in range(3)] == [False, False, True]
    assert [(i.profile, i.start) for i in nvml.mig_instances(2)] == [("1g.10gb+me", 0), ("3g.40gb", 4)]


def test_round_trip_and_uuids_stable_across_reads(node_file: Path) -> None:
    first = FileNvml.open(node_file)
    again = FileNvml.open(node_file)
    assert first.gpus() == again.gpus()
    assert first.mig_instances(2) == again.mig_instances(2)
    first.save()  # written back: same fake, now with the instances' UUIDs in the file
    saved = json.loads(node_file.read_text())
    assert saved["gpus"] == NODE["gpus"] and saved["nvlink"] == NODE["nvlink"]
    assert {i["uuid"] for i in saved["instances"]} == {i.uuid for i in first.mig_instances(2)}
    reread = FileNvml.open(node_file)
    assert reread.gpus() == first.gpus() and reread.mig_instances(2) == first.mig_instances(2)


def test_given_uuids_are_kept(tmp_path: Path) -> None:
    document = {
        "gpus": [{"name": "NVIDIA-A100-SXM4-40GB", "mig": True, "uuid": "GPU-node-b-0"}],
        "instances": [{"gpu": 0, "profile": "7g.40gb", "start": 0, "uuid": "MIG-node-b-0"}],
    }
    nvml = FileNvml.open(write(tmp_path / "n.json", document))
    assert nvml.gpus()[0].uuid == "GPU-node-b-0" and nvml.gpus()[0].memory_mib == 40960
    assert nvml.mig_instances(0)[0].uuid == "MIG-node-b-0"


def test_created_instance_outlives_an_agent_restart(node_file: Path) -> None:
    agent = FileNvml.open(node_file)
    made = agent.create_mig(2, "1g.10gb", 1)
    restarted = FileNvml.open(node_file)  # a fresh reader: the agent after a restart, or the e2e test
    assert made in restarted.mig_instances(2)
    assert restarted.mig_instances(2) == agent.mig_instances(2)
    assert not list(node_file.parent.glob(".*.tmp"))  # the temporary file became the file


def test_destroy_is_persisted_and_a_recreated_instance_gets_a_new_uuid(node_file: Path) -> None:
    agent = FileNvml.open(node_file)
    first = agent.create_mig(2, "1g.10gb", 1)
    agent.destroy_mig(2, 1)
    agent.destroy_mig(2, 4)
    restarted = FileNvml.open(node_file)
    assert [(i.profile, i.start) for i in restarted.mig_instances(2)] == [("1g.10gb+me", 0)]
    again = restarted.create_mig(2, "1g.10gb", 1)
    assert again.uuid != first.uuid  # as on real hardware (the serial is in the file)
    assert again in FileNvml.open(node_file).mig_instances(2)


def test_refused_create_changes_nothing(node_file: Path) -> None:
    before = node_file.read_text()
    agent = FileNvml.open(node_file)
    with pytest.raises(NvmlError, match="Insufficient Resources"):
        agent.create_mig(2, "1g.10gb", 5)  # inside 3g.40gb@4
    with pytest.raises(NvmlError, match="MIG mode is disabled"):
        agent.create_mig(0, "1g.10gb", 0)
    assert node_file.read_text() == before


def test_failed_write_undoes_the_create(node_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = FileNvml.open(node_file)

    def full_disk(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("gpupack.agent.fake_nvml_file._write_atomic", full_disk)
    with pytest.raises(NvmlError, match="could not write"):
        agent.create_mig(2, "1g.10gb", 1)
    assert [i.start for i in agent.mig_instances(2)] == [0, 4]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("{not json", "not JSON: Expecting property name"),
        ([1, 2], "must be a JSON object"),
        ({"gpus": []}, '"gpus" must be a non-empty list'),
        ({"gpus": [{"name": "NVIDIA Q9000"}]}, r"gpus\[0\]: unknown GPU 'NVIDIA Q9000'"),
        ({"gpus": [{"name": "NVIDIA L4", "mig": True}]}, r'gpus\[0\]: NVIDIA L4 has no MIG, so "mig" cannot be true'),
        ({"gpus": [{"name": H100}], "nvlinks": []}, "unknown key.*'nvlinks' in the top level"),
        ({"gpus": [{"name": H100}] * 2, "nvlink": [[0, 1], [2, 0]]}, '"nvlink" must be symmetric'),
        ({"gpus": [{"name": H100}], "numa": [0, 1]}, '"numa" must list 1 NUMA nodes'),
        (
            {"gpus": [{"name": H100}], "instances": [{"gpu": 0, "profile": "1g.10gb", "start": 0}]},
            r'instances\[0\]: GPU 0 \(NVIDIA H100 80GB HBM3\) has MIG off; a MIG instance needs "mig": true',
        ),
        (
            {
                "gpus": [{"name": H100, "mig": True}],
                "instances": [
                    {"gpu": 0, "profile": "4g.40gb", "start": 0},
                    {"gpu": 0, "profile": "2g.20gb", "start": 2},
                ],
            },
            r"instances\[1\]: 2g.20gb@2 cannot exist on GPU 0: Insufficient Resources: slices .* are in use",
        ),
        (
            {"gpus": [{"name": H100, "mig": True}], "instances": [{"gpu": 0, "profile": "5g.50gb", "start": 0}]},
            r"instances\[0\]: 5g.50gb@0 cannot exist on GPU 0: Not Supported: no GPU instance profile",
        ),
        (
            {"gpus": [{"name": H100, "mig": True}], "instances": [{"gpu": 1, "profile": "1g.10gb", "start": 0}]},
            r'instances\[0\]: "gpu" must be a GPU index 0..0, not 1',
        ),
    ],
)
def test_bad_file_says_which_file_and_what_is_wrong(tmp_path: Path, document: object, message: str) -> None:
    path = write(tmp_path / "bad.json", document)
    with pytest.raises(FakeNvmlFileError, match=f"^fake NVML file {re.escape(str(path))}: {message}"):
        FileNvml.open(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FakeNvmlFileError, match="cannot read it: No such file"):
        FileNvml.open(tmp_path / "absent.json")


def test_flag_or_env_selects_the_fake_and_warns(
    node_file: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    other = write(tmp_path / "other.json", {"gpus": [{"name": H100}]})
    args = build_parser().parse_args(["agent", "--fake-nvml", str(node_file)])
    with caplog.at_level(logging.WARNING, "gpupack.agent"):
        by_flag = select_nvml(args.fake_nvml, {FAKE_NVML_ENV: str(other)})  # the flag wins
        by_env = select_nvml(None, {FAKE_NVML_ENV: str(other)})
    assert isinstance(by_flag, FileNvml) and by_flag.path == node_file and len(by_flag.gpus()) == 3
    assert isinstance(by_env, FileNvml) and by_env.path == other
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert f"FAKE NVML from {node_file} (--fake-nvml)" in warnings[0]
    assert f"FAKE NVML from {other} (${FAKE_NVML_ENV})" in warnings[1]


def test_without_flag_or_env_the_real_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    class Real:
        pass

    monkeypatch.setattr("gpupack.agent.real_nvml.RealNvml", Real)
    assert build_parser().parse_args(["agent"]).fake_nvml is None
    assert isinstance(select_nvml(None, {}), Real)


def test_malformed_file_is_exit_code_2_with_a_message(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = write(tmp_path / "bad.json", {"gpus": [{"name": "NVIDIA Q9000"}]})
    args = argparse.Namespace(node="n1", kubeconfig=None, plugin_dir=str(tmp_path), fake_nvml=str(bad))
    with caplog.at_level(logging.ERROR, "gpupack.agent"):
        assert agent_main.run(args) == 2
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        f"fake NVML file {bad}: gpus[0]: unknown GPU 'NVIDIA Q9000': not a product gpupack knows "
        '(scoring/gpu_models.py), named as NVML names it, e.g. "NVIDIA H100 80GB HBM3"'
    ]
