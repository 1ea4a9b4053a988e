"""Dynamic Resource Allocation (#30 item 1): ResourceSlices, ResourceClaims and DeviceClasses in gpupack's terms.

Pure functions from the raw objects (v1, v1beta2 or v1beta1 shapes, as the API server sends them) to the
GPUs NVIDIA's DRA driver (`gpu.nvidia.com`) publishes per node, as NodeFacts fields, and to the devices
each claim holds. docs/dra.md says what is read and the rules.
"""

from gpupack.kube.dra.claims import (
    EXTENDED_CLAIM_ANNOTATION,
    AllocatedDevice,
    ClaimInfo,
    extended_claim_of_pod,
    read_claim,
    read_device_class,
)
from gpupack.kube.dra.gpus import DeviceKey, DraGpus, dra_node_facts, gpus_of_node
from gpupack.kube.dra.objects import API_GROUP, DRIVER, DraError
from gpupack.kube.dra.slices import ResourceSliceInfo, SliceDevice, read_slice

__all__ = [
    "API_GROUP",
    "DRIVER",
    "EXTENDED_CLAIM_ANNOTATION",
    "AllocatedDevice",
    "ClaimInfo",
    "DeviceKey",
    "DraError",
    "DraGpus",
    "ResourceSliceInfo",
    "SliceDevice",
    "dra_node_facts",
    "extended_claim_of_pod",
    "gpus_of_node",
    "read_claim",
    "read_device_class",
    "read_slice",
]
