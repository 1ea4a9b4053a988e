"""The `gpupack.io/gpu-topology` value and its reading from `nvidia-smi topo -m` (docs/contracts.md#gpupack-topology).

`nvidia-smi topo -m` prints a tab-separated matrix: a header row (wrapped in terminal underline escape
codes) naming the GPU and NIC columns and then `CPU Affinity`, `NUMA Affinity`, `GPU NUMA ID`; one row
per GPU and per NIC; a blank line and a legend. Cells line up with header columns by position: the
header's first cell is empty where each row holds its own name. `NV#` means # bonded NVLinks; every other
link kind (SYS, NODE, PHB, PXB, PIX, X) is 0 here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from gpupack.errors import GpupackError

UNKNOWN_NUMA = -1  # docs/contracts.md#gpupack-topology: a GPU whose NUMA affinity is N/A

_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU_NAME = re.compile(r"GPU([0-9]+)")
_NVLINK = re.compile(r"NV([0-9]+)")
_NUMA_COLUMN = "NUMA Affinity"


class TopologyTextError(GpupackError, ValueError):
    """`nvidia-smi topo -m` text that cannot be read; the message says why."""


@dataclass(frozen=True)
class Topology:
    """NVLink link counts between GPU indices (diagonal 0) and each GPU's NUMA node (-1: unknown)."""

    nvlink: tuple[tuple[int, ...], ...]
    numa: tuple[int, ...]

    def to_json(self) -> dict[str, list]:
        """The annotation value as a JSON-ready dict: `{"nvlink": [[...]], "numa": [...]}`."""
        return {"nvlink": [list(row) for row in self.nvlink], "numa": list(self.numa)}

    def to_annotation(self) -> str:
        """The annotation string: compact JSON, keys in the order of docs/contracts.md."""
        return json.dumps(self.to_json(), separators=(",", ":"))


def parse_topo_matrix(text: str) -> Topology:
    """The topology `nvidia-smi topo -m` printed; TopologyTextError on text it cannot read."""
    lines = [_ESCAPE.sub("", line).rstrip("\r") for line in text.splitlines()]
    lines = [line for line in lines if not line.startswith("#")]  # captures carry a comment header
    header_at = next((i for i, line in enumerate(lines) if _is_header(line)), None)
    if header_at is None:
        raise TopologyTextError("no header row naming GPU0 (is this `nvidia-smi topo -m` output?)")
    header = [cell.strip() for cell in lines[header_at].split("\t")]
    gpu_columns = {int(m[1]): i for i, cell in enumerate(header) if (m := _GPU_NAME.fullmatch(cell))}
    count = len(gpu_columns)
    if sorted(gpu_columns) != list(range(count)):
        raise TopologyTextError(f"GPU columns are not GPU0..GPU{count - 1}: {sorted(gpu_columns)}")
    rows = _gpu_rows(lines[header_at + 1 :], len(header))
    if sorted(rows) != list(range(count)):
        raise TopologyTextError(f"expected rows GPU0..GPU{count - 1}, found {sorted(rows)}")
    nvlink = tuple(tuple(_links(rows[i][gpu_columns[j]], i, j) for j in range(count)) for i in range(count))
    for i in range(count):
        for j in range(i):
            if nvlink[i][j] != nvlink[j][i]:
                raise TopologyTextError(f"GPU{i}-GPU{j} and GPU{j}-GPU{i} disagree: {nvlink[i][j]} vs {nvlink[j][i]}")
    numa_column = header.index(_NUMA_COLUMN) if _NUMA_COLUMN in header else None
    numa = tuple(UNKNOWN_NUMA if numa_column is None else _numa(rows[i][numa_column], i) for i in range(count))
    return Topology(nvlink, numa)


def _is_header(line: str) -> bool:
    cells = [cell.strip() for cell in line.split("\t")]
    return bool(cells) and cells[0] == "" and "GPU0" in cells


def _gpu_rows(lines: list[str], width: int) -> dict[int, list[str]]:
    """GPU index -> its cells, from the rows up to the first blank line (NIC rows skipped)."""
    rows: dict[int, list[str]] = {}
    for line in lines:
        if not line.strip():
            break
        cells = [cell.strip() for cell in line.split("\t")]
        match = _GPU_NAME.fullmatch(cells[0])
        if match is None:
            continue  # NIC0, NIC1, ...
        if len(cells) < width - 1:
            raise TopologyTextError(f"row {cells[0]} has {len(cells)} cells, the header {width}")
        rows[int(match[1])] = cells
    return rows


def _links(cell: str, row: int, column: int) -> int:
    if row == column:
        return 0
    match = _NVLINK.fullmatch(cell)
    return int(match[1]) if match else 0


def _numa(cell: str, gpu: int) -> int:
    if cell in ("N/A", ""):
        return UNKNOWN_NUMA
    if not cell.isdigit():
        raise TopologyTextError(f"GPU{gpu}: NUMA Affinity {cell!r} is neither a node number nor N/A")
    return int(cell)
