"""Loaders for the Alibaba openb trace CSVs (schema: ../shared/traces/openb/README.md).

Both loaders validate strictly: any malformed row raises `TraceError` naming the file, the 1-based line
number and the reason. Blank lines are skipped; CRLF line endings, a UTF-8 BOM and a missing final newline
are accepted.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from gpupack.scoring.facts import MigMode, NodeFacts
from gpupack.scoring.request import MAX_GPUS_PER_NODE, MILLI_PER_GPU, Kind, PodRequest, RequestError
from gpupack.sim.workload import TraceError, TracePod

__all__ = [
    "NODE_HEADER",
    "POD_HEADER",
    "POD_HEADER_SHORT",
    "TraceError",
    "load_openb_nodes",
    "load_openb_pods",
]

NODE_HEADER = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_HEADER = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
POD_HEADER_SHORT = POD_HEADER[:5]  # the multigpu* files

OPENB_NODE_PODS = 1001  # README: every node also allows 1,001 pods
MIB = 1 << 20


def _rows(
    path: Path, headers: tuple[tuple[str, ...], ...]
) -> Iterator[tuple[int, tuple[str, ...], list[str]]]:
    """Yield (line number, header, row) for every non-blank data row, after checking the header."""
    try:
        handle = path.open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise TraceError(f"{path}: cannot open: {exc.strerror or exc}") from exc
    with handle:
        reader = csv.reader(handle, strict=True)
        try:
            header: tuple[str, ...] | None = None
            for row in reader:
                if not row:  # blank line
                    continue
                if header is None:
                    got = tuple(field.strip() for field in row)
                    if got not in headers:
                        expected = " or ".join(repr(",".join(h)) for h in headers)
                        raise TraceError(
                            f"{path}:{reader.line_num}: wrong header {','.join(row)!r}, expected {expected}"
                        )
                    header = got
                    continue
                if len(row) != len(header):
                    raise TraceError(f"{path}:{reader.line_num}: {len(row)} columns, expected {len(header)}")
                yield reader.line_num, header, row
        except csv.Error as exc:
            raise TraceError(f"{path}:{reader.line_num}: malformed CSV: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise TraceError(f"{path}: not UTF-8 text: {exc}") from exc
        if header is None:
            raise TraceError(f"{path}:1: empty file, expected header {','.join(headers[0])!r}")


def _int(path: Path, line: int, column: str, text: str) -> int:
    """A non-negative decimal integer (ASCII digits only), or TraceError."""
    value = text.strip()
    if value.isascii() and value.isdigit():
        return int(value)
    if value.startswith("-") and value[1:].isascii() and value[1:].isdigit():
        raise TraceError(f"{path}:{line}: {column} is negative ({value})")
    raise TraceError(f"{path}:{line}: {column} is not an integer ({text!r})")


def _name(path: Path, line: int, column: str, text: str, seen: set[str]) -> str:
    name = text.strip()
    if not name:
        raise TraceError(f"{path}:{line}: {column} is empty")
    if name in seen:
        raise TraceError(f"{path}:{line}: duplicate {column} {name!r}")
    seen.add(name)
    return name


def load_openb_nodes(path: str | Path) -> list[NodeFacts]:
    """Load an openb node list (`sn,cpu_milli,memory_mib,gpu,model`) as NodeFacts.

    `model` becomes `gpu_product` verbatim (the openb model code, e.g. "G2", "V100M16"; empty for CPU
    nodes); every node allows 1,001 pods and has no MIG.
    """
    path = Path(path)
    nodes: list[NodeFacts] = []
    seen: set[str] = set()
    for line, _, row in _rows(path, (NODE_HEADER,)):
        name = _name(path, line, "sn", row[0], seen)
        cpu_milli = _int(path, line, "cpu_milli", row[1])
        memory_mib = _int(path, line, "memory_mib", row[2])
        gpus = _int(path, line, "gpu", row[3])
        if gpus > MAX_GPUS_PER_NODE:
            raise TraceError(f"{path}:{line}: gpu {gpus} is out of range 0..{MAX_GPUS_PER_NODE}")
        nodes.append(
            NodeFacts(
                name=name,
                cpu_milli=cpu_milli,
                memory_bytes=memory_mib * MIB,
                pods=OPENB_NODE_PODS,
                gpu_product=row[4].strip(),
                gpu_count=gpus,
                mig_mode=MigMode.NONE,
            )
        )
    return nodes


def _allowed_products(spec: str) -> frozenset[str] | None:
    """`gpu_spec` → allowed models: `|`-separated, repeats and empty tokens ignored; empty → None (any)."""
    products = frozenset(token.strip() for token in spec.split("|") if token.strip())
    return products or None


def _gpu_kind(path: Path, line: int, num_gpu: int, gpu_milli: int) -> tuple[Kind, int, int]:
    """(kind, gpus, milli) for a row's num_gpu / gpu_milli, or TraceError."""
    if num_gpu > MAX_GPUS_PER_NODE:
        raise TraceError(f"{path}:{line}: num_gpu {num_gpu} is out of range 0..{MAX_GPUS_PER_NODE}")
    if gpu_milli > MILLI_PER_GPU:
        raise TraceError(f"{path}:{line}: gpu_milli {gpu_milli} is out of range 0..{MILLI_PER_GPU}")
    if num_gpu == 0:
        if gpu_milli != 0:
            raise TraceError(f"{path}:{line}: num_gpu is 0 but gpu_milli is {gpu_milli}, expected 0")
        return Kind.NONE, 0, 0
    if gpu_milli == MILLI_PER_GPU:
        return Kind.WHOLE, num_gpu, 0
    if num_gpu > 1:
        raise TraceError(f"{path}:{line}: num_gpu {num_gpu} > 1 needs gpu_milli {MILLI_PER_GPU}, got {gpu_milli}")
    if gpu_milli == 0:
        raise TraceError(f"{path}:{line}: num_gpu is 1 but gpu_milli is 0, expected 1..{MILLI_PER_GPU}")
    return Kind.SHARE, 0, gpu_milli


def load_openb_pods(path: str | Path) -> list[TracePod]:
    """Load an openb pod list (11-column schema, or the 5-column `multigpu*` schema) in file order.

    Mapping: num_gpu 0 → Kind.NONE; gpu_milli 1000 → Kind.WHOLE with gpus = num_gpu; num_gpu 1 with
    gpu_milli < 1000 → Kind.SHARE with that milli. `gpu_spec` → allowed_products; `qos: BE` →
    interruptible. Times and pod_phase are ignored (the standard protocol does not replay them).
    """
    path = Path(path)
    pods: list[TracePod] = []
    seen: set[str] = set()
    for line, header, row in _rows(path, (POD_HEADER, POD_HEADER_SHORT)):
        name = _name(path, line, "name", row[0], seen)
        cpu_milli = _int(path, line, "cpu_milli", row[1])
        memory_mib = _int(path, line, "memory_mib", row[2])
        num_gpu = _int(path, line, "num_gpu", row[3])
        gpu_milli = _int(path, line, "gpu_milli", row[4])
        kind, gpus, milli = _gpu_kind(path, line, num_gpu, gpu_milli)
        long = len(header) > len(POD_HEADER_SHORT)
        qos = row[6].strip() if long else ""
        try:
            request = PodRequest(
                cpu_milli=cpu_milli,
                memory_bytes=memory_mib * MIB,
                kind=kind,
                gpus=gpus,
                milli=milli,
                allowed_products=_allowed_products(row[5]) if long else None,
                interruptible=qos == "BE",
            )
        except RequestError as exc:
            raise TraceError(f"{path}:{line}: {exc}") from exc
        pods.append(TracePod(name=name, request=request, qos=qos))
    return pods
