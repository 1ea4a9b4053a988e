"""Names of the labels, annotations and resources gpupack reads and writes (docs/contracts.md)."""

from __future__ import annotations

import orjson

# --- pod resources (§2)
RESOURCE_CPU = "cpu"
RESOURCE_MEMORY = "memory"
RESOURCE_PODS = "pods"
RESOURCE_GPU = "nvidia.com/gpu"
RESOURCE_MIG_PREFIX = "nvidia.com/mig-"
RESOURCE_GPU_MILLI = "gpupack.io/gpu-milli"

# --- pod annotations (§2, §4)
ANNOTATION_INTERRUPTIBLE = "gpupack.io/interruptible"
ANNOTATION_ASSIGNMENT = "gpupack.io/assignment"
ANNOTATION_DEFRAG_HOLD = "gpupack.io/defrag-hold"  # on a pending pod: the placement a defrag move frees for it
ANNOTATION_GROUP = "gpupack.io/group"  # gang placement (docs/gangs.md): the group's name ...
ANNOTATION_GROUP_SIZE = "gpupack.io/group-size"  # ... its minMember
ANNOTATION_GROUP_TOPOLOGY = "gpupack.io/group-topology"  # ... and the widest domain it may spread over

# --- pod labels (docs/defrag.md)
LABEL_MOVABLE = "gpupack.io/movable"  # "true": defrag may evict the pod for its controller to recreate elsewhere

# --- pod scheduling gates and namespace labels (docs/dra.md#device-choice)
GATE_DRA_ALLOCATION = "gpupack.io/dra-allocation"  # held until gpupack allocated the pod's ResourceClaims
LABEL_DRA_ALLOCATION = "gpupack.io/dra-allocation"  # on a namespace, "enabled": its claim pods are gated

# --- node labels (§3)
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"
LABEL_GPU_COUNT = "nvidia.com/gpu.count"
LABEL_GPU_MEMORY = "nvidia.com/gpu.memory"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
# capacity type label -> the value (lower-cased) that means spot
SPOT_LABELS: dict[str, str] = {
    "karpenter.sh/capacity-type": "spot",
    "eks.amazonaws.com/capacityType": "spot",
    "cloud.google.com/gke-spot": "true",
    "kubernetes.azure.com/scalesetpriority": "spot",
}

# --- node annotations (§3)
ANNOTATION_MIG = "gpupack.io/mig"
ANNOTATION_MIG_LAYOUT = "gpupack.io/mig-layout"
ANNOTATION_GPU_TOPOLOGY = "gpupack.io/gpu-topology"
ANNOTATION_HOURLY_COST = "gpupack.io/hourly-cost"
ANNOTATION_DEVICES_IN_USE = "gpupack.io/devices-in-use"  # written by gpupack agent (docs/agent.md)
ANNOTATION_CORDONED_GPUS = "gpupack.io/cordoned-gpus"  # written by the operator: GPUs to place nothing on


def decode_json(value: object) -> object:
    """The JSON value held by an annotation string; ValueError with a short reason otherwise."""
    if not isinstance(value, str):
        raise ValueError(f"expected a JSON string, got {type(value).__name__}")
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"malformed JSON ({exc})") from None
