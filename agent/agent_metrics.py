"""The agent's Prometheus metrics (its own registry, served on `GPUPACK_AGENT_METRICS_PORT`).

Only the metrics: any agent module may count on them (`agent.devices_in_use.observe` sets the gauges).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REGISTRY = CollectorRegistry()
PODS_WITH_UNASSIGNED_DEVICES = Gauge(
    "gpupack_agent_pods_with_unassigned_devices",
    "Pods holding GPU devices (podresources) that their gpupack.io/assignment does not name",
    registry=REGISTRY,
)
PODS_MISSING_ASSIGNED_DEVICES = Gauge(
    "gpupack_agent_pods_missing_assigned_devices",
    "Pods listed by the kubelet that do not hold a device their gpupack.io/assignment names",
    registry=REGISTRY,
)
UNKNOWN_DEVICES = Gauge(
    "gpupack_agent_unknown_devices", "Device IDs held by pods that are no GPU or MIG instance of this node",
    registry=REGISTRY,
)
BLOCKED_SLOTS = Gauge(
    "gpupack_agent_blocked_slots", "Slots reported blocked in gpupack.io/devices-in-use", registry=REGISTRY
)
MIG_CREATE_REFUSALS = Counter(
    "gpupack_agent_mig_create_refusals", "Assigned dynamic-MIG instances NVML refused to create", registry=REGISTRY
)
PODRESOURCES_ERRORS = Counter(
    "gpupack_agent_podresources_errors", "Failed podresources List calls to the kubelet", registry=REGISTRY
)

UNHEALTHY_GPUS = Gauge(
    "gpupack_agent_unhealthy_gpus",
    "GPUs whose devices are advertised Unhealthy, by why: lost (NVML: GPU is lost), xid (a critical XID), "
    "cordoned (gpupack.io/cordoned-gpus)",
    ("reason",),
    registry=REGISTRY,
)
XID_EVENTS = Counter(
    "gpupack_agent_xid_events",
    "XID events NVML reported, by verdict: critical (the GPU is unhealthy), application, handled (nothing changes)",
    ("verdict",),
    registry=REGISTRY,
)
CORDON_ENTRIES_INVALID = Gauge(
    "gpupack_agent_cordon_entries_invalid",
    "Entries of gpupack.io/cordoned-gpus that name no GPU of this node (ignored)",
    registry=REGISTRY,
)
