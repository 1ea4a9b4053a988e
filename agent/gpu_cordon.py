"""The operator's `gpupack.io/cordoned-gpus` on the agent's Node, resolved to GPU indexes (kube.gpu_cordon)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpupack.agent.agent_metrics import CORDON_ENTRIES_INVALID
from gpupack.agent.gpu_health import OutOfService, Why
from gpupack.agent.node_gpus import NodeGpus
from gpupack.kube.gpu_cordon import cordon_reason, read_cordon
from gpupack.kube.keys import ANNOTATION_CORDONED_GPUS

log = logging.getLogger(__name__)


class CordonReader:
    """Reads the annotation every round; entries naming no GPU of the node are logged once per value."""

    def __init__(self) -> None:
        self._reported: tuple[str, ...] = ()

    def cordoned(self, node: Mapping[str, Any], gpus: NodeGpus) -> dict[int, OutOfService]:
        """The GPUs the annotation names (by index or UUID), by index."""
        cordon = read_cordon(node)
        named, invalid = cordon.resolve(gpus.uuid_index(), len(gpus.gpus))
        CORDON_ENTRIES_INVALID.set(len(invalid))
        if invalid and invalid != self._reported:
            log.warning("%s: entries naming no GPU of this node are ignored: %s", ANNOTATION_CORDONED_GPUS, invalid)
        self._reported = invalid
        by_uuid = {gpu.index: gpu.uuid for gpu in gpus.gpus}
        return {
            gpu: OutOfService(gpu, Why.CORDONED, cordon_reason(str(gpu) if gpu in cordon.indexes else by_uuid[gpu]))
            for gpu in sorted(named)
        }
