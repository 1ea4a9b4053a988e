"""A fake node in a JSON file: `gpupack agent --fake-nvml PATH` on GPU-less clusters (e2e tests).

Like NVIDIA's mock NVML, the agent then sees GPUs, NVLinks, NUMA nodes and MIG instances that do not
exist, and serves the kubelet as on a GPU node. The file is also the state: real MIG instances
outlive an agent restart, so every MIG instance the agent creates or destroys (dynamic MIG) is
written back to the same file (a temporary file beside it, then `os.replace`) and read again at
start. The rules are `agent.fake_nvml.FakeNvml`'s (NVML's placements and instance limits).

    {
      "gpus": [{"name": "NVIDIA H100 80GB HBM3", "mig": true},
               {"name": "NVIDIA H100 80GB HBM3", "mig": false, "uuid": "GPU-..."}],
      "nvlink": [[0, 18], [18, 0]],
      "nvswitch_links": 0,
      "numa": [0, 1],
      "instances": [{"gpu": 0, "profile": "3g.40gb", "start": 4},
                    {"gpu": 0, "profile": "1g.10gb+me", "start": 0, "uuid": "MIG-..."}],
      "mig_serial": 0,
      "xid_events": [{"gpu": 1, "xid": 79}]
    }

- `gpus` (required, by NVML index): `name` as NVML names the GPU (a product of
  `scoring.gpu_models`; the `nvidia.com/gpu.product` label's spelling with `-` is taken too); `mig`:
  MIG mode on (default false; only on MIG-capable products); `uuid`: optional, default derived from
  name and index (`FakeNvml.build`'s), stable across restarts.
- `nvlink` (optional): NVLinks between GPU i and j, a symmetric matrix with a zero diagonal.
  `nvswitch_links` (optional): each GPU's links into an NVSwitch. `numa` (optional): each GPU's NUMA
  node, `null` for N/A.
- `instances` (optional): the MIG instances that exist (static MIG set up by an operator, and those
  the agent created), profiles spelled as nvidia-smi does without `MIG ` (`1g.10gb+me`; `1g.10gb.me`
  is read as that). `uuid` optional, default derived from GPU, profile and start; the agent writes
  every instance back with its UUID.
- `mig_serial` (written by the agent): MIG instances created so far; a new instance's UUID derives
  from it, so an instance created again gets a new UUID, as on real hardware.
- Health, as NVML shows it (`FakeNvml`): `"lost": true` on a GPU makes NVML answer `GPU is lost` for it;
  `xid_events` (optional) is a log of XIDs the driver reported, `{"gpu": index, "xid": code}`, appended
  to by a test: each one appended after the agent registered for events is delivered once by
  `next_xid`; those already in the file at start are past, as NVML never delivers events from before
  registration.

Unknown keys are errors. The agent reads the file at start; edit it while the agent is stopped, except
the health keys (`lost`, `xid_events`), which it reads again whenever it asks NVML about health (a
re-read that is malformed is logged and changes nothing). It writes the file back with the health keys
of the moment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeGuard

from gpupack.agent.fake_nvml import FakeNvml
from gpupack.agent.nvml import MigInstance, NvmlError, XidEvent
from gpupack.errors import GpupackError
from gpupack.scoring.geometry import canonical_profile
from gpupack.scoring.gpu_models import lookup_model

_TOP_KEYS = ("gpus", "nvlink", "nvswitch_links", "numa", "instances", "mig_serial", "xid_events")
_GPU_KEYS = ("name", "mig", "uuid", "lost")
_INSTANCE_KEYS = ("gpu", "profile", "start", "uuid")
_XID_KEYS = ("gpu", "xid")
log = logging.getLogger(__name__)


class FakeNvmlFileError(GpupackError, ValueError):
    """A fake node file that cannot be used; the message names the file and what is wrong."""


class _Invalid(Exception):
    """What is wrong with a document (the file's name is added by `FileNvml.open`)."""


class FileNvml(FakeNvml):
    """A `FakeNvml` read from a fake node file; successful MIG creates and destroys are written back to it."""

    def __init__(self, fake: FakeNvml, path: Path, document: dict[str, Any]) -> None:
        super().__init__(fake.devices)
        self.mig_serial = fake.mig_serial
        self.lost_gpus = set(fake.lost_gpus)
        self.path = path
        self._document = document  # as read: written back with the instances and serial of the moment
        self._lock = threading.RLock()  # Allocate (create) and the agent loop (destroy, reads) are threads
        self._xids_past = len(document.get("xid_events", []))  # in the file before anyone could watch
        self._health_read = _stamp(path)

    @classmethod
    def open(cls, path: Path) -> FileNvml:
        """Read the fake node at `path`. FakeNvmlFileError naming the file and the problem."""
        try:
            text = path.read_text()
        except OSError as exc:
            raise FakeNvmlFileError(f"fake NVML file {path}: cannot read it: {exc.strerror or exc}") from None
        try:
            document = _load_json(text)
            return cls(parse(document), path, document)
        except _Invalid as exc:
            raise FakeNvmlFileError(f"fake NVML file {path}: {exc}") from None

    # --- agent.nvml.Nvml: health, read again from the file
    def watch_xids(self) -> dict[int, str]:
        with self._lock:
            self.refresh_health()  # what the file logged before now is past: never delivered
            return super().watch_xids()

    def next_xid(self, timeout_ms: int) -> XidEvent | None:
        with self._lock:
            self.refresh_health()
            return super().next_xid(timeout_ms)

    def lost(self, gpu: int) -> bool:
        with self._lock:
            self.refresh_health()
            return super().lost(gpu)

    def refresh_health(self) -> None:
        """Take `lost` and new `xid_events` from the file when it changed (a malformed one is logged)."""
        with self._lock:
            stamp = _stamp(self.path)
            if stamp == self._health_read:
                return
            self._health_read = stamp
            try:
                document = _load_json(self.path.read_text())
                lost, events = _health(document, len(self.devices))
            except (OSError, _Invalid) as exc:
                log.warning("fake NVML file %s: health not read again: %s", self.path, exc)
                return
            self.lost_gpus = lost
            self._document = {**self._document, "gpus": document["gpus"], "xid_events": events}
            if len(events) < self._xids_past:  # the log was rewritten: count from its new end
                self._xids_past = len(events)
            for event in events[self._xids_past :]:
                self.raise_xid(event["gpu"], event["xid"])
            self._xids_past = len(events)

    # --- agent.nvml.Nvml: MIG state, persisted
    def mig_instances(self, gpu: int) -> list[MigInstance]:
        with self._lock:
            return super().mig_instances(gpu)

    def create_mig(self, gpu: int, profile: str, start: int) -> MigInstance:
        with self._lock:
            instance = super().create_mig(gpu, profile, start)
            try:
                self.save()
            except OSError as exc:  # not created after all: NVML's state is the file
                del self.devices[gpu].instances[start]
                self.created.pop()
                raise NvmlError(f"Unknown Error: the fake NVML could not write {self.path}: {exc}") from exc
            return instance

    def destroy_mig(self, gpu: int, start: int) -> None:
        with self._lock:
            instance = self._gpu(gpu).instances.get(start)
            super().destroy_mig(gpu, start)
            try:
                self.save()
            except OSError as exc:
                assert instance is not None  # destroy_mig raised otherwise
                self.devices[gpu].instances[start] = instance
                self.destroyed.pop()
                raise NvmlError(f"Unknown Error: the fake NVML could not write {self.path}: {exc}") from exc

    def save(self) -> None:
        """Write the file as read, with today's MIG instances and serial (atomically: temp file + os.replace)."""
        with self._lock:
            self.refresh_health()  # a test's injection since the last read is written back, not undone
            document = dict(self._document)
            document["instances"] = [
                {"gpu": i.gpu, "profile": i.profile, "start": i.start, "uuid": i.uuid}
                for device in self.devices
                for i in sorted(device.instances.values(), key=lambda i: i.start)
            ]
            document["mig_serial"] = self.mig_serial
            _write_atomic(self.path, render(document))
            self._health_read = _stamp(self.path)


def parse(document: dict[str, Any]) -> FakeNvml:
    """The FakeNvml a fake node document describes; `_Invalid` saying what is wrong."""
    _known_keys(document, _TOP_KEYS, "the top level")
    entries = document.get("gpus")
    if not isinstance(entries, list) or not entries:
        raise _Invalid('"gpus" must be a non-empty list of {"name": ..., "mig": ...}, one per GPU by NVML index')
    names, mig, uuids = [], [], []
    for i, entry in enumerate(entries):
        where = f"gpus[{i}]"
        if not isinstance(entry, dict):
            raise _Invalid(f'{where} must be an object like {{"name": "NVIDIA H100 80GB HBM3", "mig": false}}')
        _known_keys(entry, _GPU_KEYS, where)
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise _Invalid(f'{where}: "name" must be the GPU\'s NVML name, e.g. "NVIDIA H100 80GB HBM3"')
        model = lookup_model(name.replace(" ", "-"))
        if not model.memory_mib:
            raise _Invalid(
                f"{where}: unknown GPU {name!r}: not a product gpupack knows (scoring/gpu_models.py), "
                'named as NVML names it, e.g. "NVIDIA H100 80GB HBM3"'
            )
        enabled = entry.get("mig", False)
        if not isinstance(enabled, bool):
            raise _Invalid(f'{where}: "mig" must be true or false, not {enabled!r}')
        if enabled and model.mig_family is None:
            raise _Invalid(f'{where}: {name} has no MIG, so "mig" cannot be true')
        gpu_uuid = entry.get("uuid")
        if gpu_uuid is not None and not (isinstance(gpu_uuid, str) and gpu_uuid.startswith("GPU-")):
            raise _Invalid(f'{where}: "uuid" must be a string starting with "GPU-", not {gpu_uuid!r}')
        names.append(name)
        mig.append(enabled)
        uuids.append(gpu_uuid)
    count = len(names)
    fake = FakeNvml.build(
        names,
        nvlink=_nvlink(document.get("nvlink"), count),
        nvswitch_links=_count(document.get("nvswitch_links", 0), '"nvswitch_links"'),
        numa=_numa(document.get("numa"), count),
    )
    for device, enabled, gpu_uuid in zip(fake.devices, mig, uuids, strict=True):
        device.mig_enabled = enabled
        if gpu_uuid is not None:
            device.info = dataclasses.replace(device.info, uuid=gpu_uuid)
    _unique([device.info.uuid for device in fake.devices], "GPU")
    fake.mig_serial = _count(document.get("mig_serial", 0), '"mig_serial"')
    _restore_instances(fake, document.get("instances", []))
    fake.lost_gpus, _ = _health(document, count)
    return fake


def _health(document: dict[str, Any], count: int) -> tuple[set[int], list[dict[str, int]]]:
    """The GPUs marked `"lost": true` and the `xid_events` log; `_Invalid` saying what is wrong."""
    entries = document.get("gpus")
    if not isinstance(entries, list) or len(entries) != count:
        raise _Invalid(f'"gpus" must still list {count} GPUs')
    lost = set()
    for i, entry in enumerate(entries):
        flag = entry.get("lost", False) if isinstance(entry, dict) else None
        if not isinstance(flag, bool):
            raise _Invalid(f'gpus[{i}]: "lost" must be true or false, not {flag!r}')
        if flag:
            lost.add(i)
    events = document.get("xid_events", [])
    for where, event in _objects(events, "xid_events", '{"gpu": 0, "xid": 79}', _XID_KEYS):
        _gpu_index(event, where, count)
        xid = event.get("xid")
        if not _is_int(xid) or xid < 0:
            raise _Invalid(f'{where}: "xid" must be a whole number >= 0, not {xid!r}')
    return lost, events


def _objects(value: object, name: str, example: str, keys: tuple[str, ...]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(`name[k]`, entry) of a list of objects with only `keys`; _Invalid, showing `example`, for anything else."""
    if not isinstance(value, list):
        raise _Invalid(f'"{name}" must be a list of objects like {example}')
    for k, entry in enumerate(value):
        where = f"{name}[{k}]"
        if not isinstance(entry, dict):
            raise _Invalid(f"{where} must be an object like {example}")
        _known_keys(entry, keys, where)
        yield where, entry


def _gpu_index(entry: dict[str, Any], where: str, count: int) -> int:
    """The entry's `gpu`, an index below `count`."""
    gpu = entry.get("gpu")
    if not _is_int(gpu) or not 0 <= gpu < count:
        raise _Invalid(f'{where}: "gpu" must be a GPU index 0..{count - 1}, not {gpu!r}')
    return int(gpu)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What tells that the file changed: (inode, size, mtime in ns); None when it cannot be read."""
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns)


def _restore_instances(fake: FakeNvml, entries: object) -> None:
    example = '{"gpu": 0, "profile": "1g.10gb", "start": 0}'
    for where, entry in _objects(entries, "instances", example, _INSTANCE_KEYS):
        gpu = _gpu_index(entry, where, len(fake.devices))
        profile, start, mig_uuid = entry.get("profile"), entry.get("start"), entry.get("uuid")
        if not isinstance(profile, str) or not _is_int(start):
            raise _Invalid(f'{where}: needs "profile" (e.g. "1g.10gb") and "start" (first memory slice, an integer)')
        if mig_uuid is not None and not (isinstance(mig_uuid, str) and mig_uuid.startswith("MIG-")):
            raise _Invalid(f'{where}: "uuid" must be a string starting with "MIG-", not {mig_uuid!r}')
        device = fake.devices[gpu]
        if not device.mig_enabled:
            raise _Invalid(f'{where}: GPU {gpu} ({device.info.name}) has MIG off; a MIG instance needs "mig": true')
        profile = canonical_profile(profile)
        try:
            fake.restore_mig(gpu, profile, start, mig_uuid)
        except NvmlError as exc:
            raise _Invalid(f"{where}: {profile}@{start} cannot exist on GPU {gpu}: {exc}") from None
    _unique([i.uuid for gpu in range(len(fake.devices)) for i in fake.mig_instances(gpu)], "MIG instance")


def render(document: dict[str, Any]) -> str:
    """JSON with one line per GPU, NVLink row and instance (readable, and diffs stay small)."""
    parts = []
    for key, value in document.items():
        if isinstance(value, list) and value:
            rows = ",\n    ".join(json.dumps(row) for row in value)
            parts.append(f"  {json.dumps(key)}: [\n    {rows}\n  ]")
        else:
            parts.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def _write_atomic(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never half of one (the folder must be writable)."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        with contextlib.suppress(OSError):  # keep the file's mode (mkstemp makes 0600)
            os.chmod(temporary, stat.S_IMODE(path.stat().st_mode))
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _load_json(text: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Invalid(f"not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise _Invalid(f'must be a JSON object {{"gpus": [...], ...}}, not {type(document).__name__}')
    return document


def _known_keys(entry: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(entry) - set(known))
    if unknown:
        raise _Invalid(f"unknown key(s) {', '.join(map(repr, unknown))} in {where} (known: {', '.join(known)})")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: object, what: str) -> int:
    if not _is_int(value) or value < 0:
        raise _Invalid(f"{what} must be a whole number >= 0, not {value!r}")
    return value


def _nvlink(value: object, count: int) -> list[list[int]] | None:
    if value is None:
        return None
    shape = f'"nvlink" must be a {count}x{count} matrix of link counts (one row per GPU)'
    if not isinstance(value, list) or len(value) != count:
        raise _Invalid(shape)
    matrix: list[list[int]] = []
    for i, row in enumerate(value):
        if not isinstance(row, list) or len(row) != count:
            raise _Invalid(f"{shape}: row {i} is {row!r}")
        matrix.append([_count(width, f"nvlink[{i}][{j}]") for j, width in enumerate(row)])
    for i in range(count):
        if matrix[i][i]:
            raise _Invalid(f'"nvlink"[{i}][{i}] must be 0: a GPU has no NVLink to itself')
        for j in range(i):
            if matrix[i][j] != matrix[j][i]:
                raise _Invalid(f'"nvlink" must be symmetric: [{i}][{j}] is {matrix[i][j]}, [{j}][{i}] {matrix[j][i]}')
    return matrix


def _numa(value: object, count: int) -> list[int | None] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != count:
        raise _Invalid(f'"numa" must list {count} NUMA nodes, one per GPU (null: N/A), not {value!r}')
    return [None if node is None else _count(node, f"numa[{i}]") for i, node in enumerate(value)]


def _unique(uuids: list[str], what: str) -> None:
    seen: set[str] = set()
    for one in uuids:
        if one in seen:
            raise _Invalid(f"{what} UUID {one} appears twice")
        seen.add(one)
