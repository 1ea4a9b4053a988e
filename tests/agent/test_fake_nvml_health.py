"""The fake node file's health keys (#26 item 8): `lost` and `xid_events`, read again while the agent runs,
with NVML's semantics (events only after registration, each once; a lost GPU answers `GPU is lost`)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from gpupack.agent.fake_nvml_file import FakeNvmlFileError, FileNvml
from gpupack.agent.nvml import NvmlError, XidEvent

H100 = "NVIDIA H100 80GB HBM3"


def _write(path: Path, **extra: object) -> None:
    document = {"gpus": [{"name": H100}, {"name": H100, "mig": True}], **extra}
    path.write_text(json.dumps(document))


def _edit(path: Path, change) -> None:
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


def test_xid_events_are_delivered_once_and_only_after_registration(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    _write(path, xid_events=[{"gpu": 0, "xid": 48}])  # before the agent: past
    nvml = FileNvml.open(path)
    _edit(path, lambda d: d["xid_events"].append({"gpu": 1, "xid": 31}))  # before registration: lost
    assert nvml.watch_xids() == {}
    assert nvml.next_xid(0) is None
    _edit(path, lambda d: d["xid_events"].append({"gpu": 1, "xid": 79}))
    assert nvml.next_xid(0) == XidEvent(1, 79)
    assert nvml.next_xid(0) is None


def test_a_lost_gpu_answers_gpu_is_lost_until_the_file_clears_it(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    _write(path, instances=[{"gpu": 1, "profile": "3g.40gb", "start": 4}])
    nvml = FileNvml.open(path)
    _edit(path, lambda d: d["gpus"][1].update(lost=True))
    assert nvml.lost(1) and not nvml.lost(0)
    with pytest.raises(NvmlError, match="GPU is lost"):
        nvml.cpu_affinity_numa_nodes(1)
    assert (nvml.mig_enabled(1), nvml.mig_instances(1), nvml.nvlinks(1)) == (False, [], [])
    with pytest.raises(NvmlError, match="GPU is lost"):
        nvml.create_mig(1, "1g.10gb", 0)
    _edit(path, lambda d: d["gpus"][1].update(lost=False))
    assert not nvml.lost(1) and [i.start for i in nvml.mig_instances(1)] == [4]


def test_saving_keeps_the_health_keys_and_a_lost_gpus_instances(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    _write(path, instances=[{"gpu": 1, "profile": "3g.40gb", "start": 4}])
    nvml = FileNvml.open(path)
    nvml.watch_xids()

    def inject(document: dict) -> None:
        document["gpus"][0]["lost"] = True
        document.setdefault("xid_events", []).append({"gpu": 1, "xid": 94})

    _edit(path, inject)
    nvml.create_mig(1, "1g.10gb", 0)  # writes the file back
    saved = json.loads(path.read_text())
    assert saved["gpus"][0]["lost"] is True and saved["xid_events"] == [{"gpu": 1, "xid": 94}]
    assert nvml.next_xid(0) == XidEvent(1, 94)
    _edit(path, lambda d: d["gpus"][1].update(lost=True))
    nvml.lost(1)
    nvml.save()
    assert {i["start"] for i in json.loads(path.read_text())["instances"]} == {0, 4}


def test_malformed_health_read_again_is_logged_and_changes_nothing(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.WARNING)
    path = tmp_path / "node.json"
    _write(path)
    nvml = FileNvml.open(path)
    _edit(path, lambda d: d["gpus"][0].update(lost="yes"))
    assert not nvml.lost(0)
    assert any('"lost" must be true or false' in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"xid_events": [{"gpu": 5, "xid": 79}]}, 'xid_events[0]: "gpu" must be a GPU index 0..1'),
        ({"xid_events": [{"gpu": 0, "xid": -1}]}, '"xid" must be a whole number'),
        ({"xid_events": [{"gpu": 0, "xid": 79, "when": 1}]}, "unknown key(s) 'when'"),
    ],
)
def test_malformed_health_at_start_names_the_file_and_the_problem(tmp_path: Path, extra, message: str) -> None:
    path = tmp_path / "node.json"
    _write(path, **extra)
    with pytest.raises(FakeNvmlFileError, match=re.escape(message)):
        FileNvml.open(path)
