"""`gpupack.io/cordoned-gpus`: GPUs of one node an operator takes out of service (docs/contracts.md).

Value: GPU indexes (NVML's, as in `gpupack.io/assignment`) and/or GPU UUIDs, comma-separated
(`"2"`, `"0, GPU-5f1c..."`). Both `gpupack serve` and `gpupack agent` read it: serve places nothing new
on a cordoned GPU it can name by index; the agent resolves indexes and UUIDs, advertises the GPU's
devices Unhealthy and publishes it in `gpupack.io/devices-in-use`. An entry that is neither (`"x"`,
`"-1"`, an index past the node's GPUs) is left out and reported; it never makes the node unusable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupack.kube.keys import ANNOTATION_CORDONED_GPUS

MAX_CORDON_CHARS = 4096  # far above a node's GPUs by UUID (16 x 41 characters); a longer value is all invalid
_INDEX = re.compile(r"[0-9]{1,3}")
_UUID = re.compile(r"GPU-[0-9A-Za-z-]{1,64}")


@dataclass(frozen=True)
class Cordon:
    """One node's annotation, read: the GPUs it names by index and by UUID, and the entries it could not read."""

    indexes: frozenset[int] = frozenset()
    uuids: frozenset[str] = frozenset()
    invalid: tuple[str, ...] = ()

    def resolve(self, uuid_index: Mapping[str, int], gpu_count: int) -> tuple[frozenset[int], tuple[str, ...]]:
        """(GPU indexes named, by index or UUID, on a node of `gpu_count` GPUs; entries naming no GPU there)."""
        indexes = {i for i in self.indexes if i < gpu_count} | {uuid_index[u] for u in self.uuids if u in uuid_index}
        missing = [str(i) for i in sorted(self.indexes) if i >= gpu_count]
        missing += sorted(u for u in self.uuids if u not in uuid_index)
        return frozenset(indexes), self.invalid + tuple(missing)


def read_cordon(node: Mapping[str, Any]) -> Cordon:
    """The node's `gpupack.io/cordoned-gpus` (an empty Cordon when absent or not a string)."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_CORDONED_GPUS)
    return parse_cordon(text) if isinstance(text, str) else Cordon()


def parse_cordon(text: str) -> Cordon:
    """Entries by index and UUID; empty entries (`"1,"`) are skipped, unreadable ones kept as `invalid`."""
    if len(text) > MAX_CORDON_CHARS:
        return Cordon(invalid=(f"{text[:40]}... ({len(text)} characters, more than {MAX_CORDON_CHARS})",))
    indexes: set[int] = set()
    uuids: set[str] = set()
    invalid: list[str] = []
    for entry in (part.strip() for part in text.split(",")):
        if _INDEX.fullmatch(entry):
            indexes.add(int(entry))
        elif _UUID.fullmatch(entry):
            uuids.add(entry)
        elif entry:
            invalid.append(entry[:80])
    return Cordon(frozenset(indexes), frozenset(uuids), tuple(invalid))


def cordon_reason(entry: str) -> str:
    """The reason published and explained for a GPU the annotation names (`entry`: its index or UUID)."""
    return f"cordoned: {ANNOTATION_CORDONED_GPUS} names {entry if entry.startswith('GPU-') else f'GPU {entry}'}"
