"""The simulator's workload model: trace pods, a trace (nodes + pods), and GPU-demand arithmetic.

GPU amounts here are in milli-GPU (one whole GPU = 1000), as in the openb trace and the ATC'23 simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpupack.errors import GpupackError
from gpupack.scoring.facts import NodeFacts
from gpupack.scoring.request import MILLI_PER_GPU, Kind, PodRequest


class TraceError(GpupackError, ValueError):
    """A trace or order file that cannot be loaded; the message names the file, the line and the reason."""


@dataclass(frozen=True)
class TracePod:
    """One pod of a workload trace: its unique name, what it asks for, and its trace QoS class."""

    name: str
    request: PodRequest
    qos: str = ""  # informational: openb `qos` (LS, BE, Burstable, Guaranteed) or the Pod's qosClass

    def clone(self, name: str) -> TracePod:
        """A copy of this pod under another name (the protocol's resampled `-tuned-K` pods)."""
        return replace(self, name=name)


@dataclass
class Trace:
    """A cluster and the pods to submit to it."""

    nodes: list[NodeFacts]
    pods: list[TracePod]

    @property
    def gpu_count(self) -> int:
        """Number of GPUs in the cluster."""
        return gpu_count(self.nodes)

    @property
    def gpu_milli_capacity(self) -> int:
        """Cluster GPU capacity in milli-GPU."""
        return gpu_milli_capacity(self.nodes)

    @property
    def gpu_milli_demand(self) -> int:
        """Total GPU demand of the pods in milli-GPU."""
        return gpu_milli_demand(self.pods)


def _request_of(pod: TracePod | PodRequest) -> PodRequest:
    return pod.request if isinstance(pod, TracePod) else pod


def gpu_milli_total(pod: TracePod | PodRequest) -> int:
    """GPU demand of one pod in milli-GPU: num_gpu × gpu_milli.

    A whole-GPU pod counts 1000 per GPU, a shared pod its milli; MIG and CPU-only pods count 0.
    """
    request = _request_of(pod)
    if request.kind == Kind.WHOLE:
        return request.gpus * MILLI_PER_GPU
    if request.kind == Kind.SHARE:
        return request.milli
    return 0


def gpu_milli_per_gpu(pod: TracePod | PodRequest) -> int:
    """The openb `gpu_milli` column: the share of EACH GPU (1000 for whole-GPU pods, 0 for CPU-only / MIG)."""
    request = _request_of(pod)
    if request.kind == Kind.WHOLE:
        return MILLI_PER_GPU
    if request.kind == Kind.SHARE:
        return request.milli
    return 0


def gpu_milli_demand(pods: list[TracePod]) -> int:
    """Sum of `gpu_milli_total` over pods."""
    return sum(gpu_milli_total(pod) for pod in pods)


def gpu_count(nodes: list[NodeFacts]) -> int:
    """Number of GPUs over nodes."""
    return sum(node.gpu_count for node in nodes)


def gpu_milli_capacity(nodes: list[NodeFacts]) -> int:
    """Cluster GPU capacity in milli-GPU (1000 per GPU)."""
    return gpu_count(nodes) * MILLI_PER_GPU
