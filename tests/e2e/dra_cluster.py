"""DRA on a running `FullControlPlane`: fake H100 nodes, their ResourceSlices, claims, pods, and a legality check (#30).

The nodes have no kubelet: a Node object with a Ready condition and the slices NVIDIA's DRA driver
(`gpu.nvidia.com`) would publish for it (`tests/kube/dra_bodies.py`: full GPUs, static MIG, DynamicMIG
with each GPU's counter set in a slice of its own, since a v1 slice holds devices or sharedCounters,
never both). The DeviceClasses are the two NVIDIA's chart installs. Pods ask for devices through
ResourceClaimTemplates; kube-controller-manager's `resourceclaim-controller` makes each pod's claim and
deletes it when the pod goes.

`legality` reads back every slice and allocated claim and lists what no allocator may do: a device that
is not published on the claim's node, a device in two claims, a counter set overdrawn, a pod bound
away from its claims' node. Everything is read as the JSON the API server serves.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from gpupack.harness.controlplane import REPO_ROOT, ControlPlane, ControlPlaneError, node_body, wait_until
from gpupack.kube.dra import DRIVER
from gpupack.kube.quantity import parse_quantity
from tests.kube.dra_bodies import H100_PLACEMENTS, gpu_device, h100_dynamic, h100_full, mig_device, resource_slice

JsonObject = dict[str, Any]
RESOURCE_API = "resource.k8s.io/v1"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
GATE = "gpupack.io/dra-allocation"  # the scheduling gate gpupack lifts once it has allocated a pod's claims
GATE_PROBE_NAMESPACE = "gpupack-gate-probe"  # where apply_gate_policy tries the policy out
GATE_LABEL = "gpupack.io/dra-allocation"  # namespaces whose claim pods the admission policy gates
GATE_MANIFEST = REPO_ROOT / "manifests" / "dra" / "gate.yaml"
DEFAULT_SCHEDULER = "default-scheduler"
WAIT_TIMEOUT = 60.0  # seconds for one pod to be decided or one claim to go, on a loaded 2-core machine


# ============================================================ reading the API server as JSON
def resource_api(plane: ControlPlane) -> Any:
    """`kubernetes.client.ResourceV1Api` on the admin client."""
    from kubernetes import client

    return client.ResourceV1Api(plane.api_client())


def _items(response: Any) -> list[JsonObject]:
    return list(json.loads(response.data)["items"])


def list_slices(plane: ControlPlane) -> list[JsonObject]:
    """Every ResourceSlice, as served."""
    return _items(resource_api(plane).list_resource_slice(_preload_content=False))


def list_claims(plane: ControlPlane, namespace: str | None = None) -> list[JsonObject]:
    """Every ResourceClaim (of `namespace`, or of all namespaces), as served."""
    api = resource_api(plane)
    if namespace is None:
        return _items(api.list_resource_claim_for_all_namespaces(_preload_content=False))
    return _items(api.list_namespaced_resource_claim(namespace, _preload_content=False))


def list_pods(plane: ControlPlane, namespace: str | None = None) -> list[JsonObject]:
    """Every pod (of `namespace`, or of all namespaces), as served."""
    core = plane.core()
    if namespace is None:
        return _items(core.list_pod_for_all_namespaces(_preload_content=False))
    return _items(core.list_namespaced_pod(namespace, _preload_content=False))


def read_pod(plane: ControlPlane, namespace: str, name: str) -> JsonObject:
    """One pod, as served."""
    return dict(json.loads(plane.core().read_namespaced_pod(name, namespace, _preload_content=False).data))


def _ignore_conflict(create: Any, *args: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        create(*args)
    except ApiException as exc:
        if exc.status != 409:
            raise


# ============================================================ nodes and their slices
def for_create(body: Mapping[str, Any]) -> JsonObject:
    """A dra_bodies object without the server-owned `uid` and `resourceVersion` (refused on create)."""
    metadata = {k: v for k, v in body["metadata"].items() if k not in ("uid", "resourceVersion")}
    return {**body, "metadata": metadata}


def full_gpu_slices(node: str, gpus: int = 2) -> list[JsonObject]:
    """One slice with `gpus` whole H100s, as the driver publishes a node with MIG off."""
    return [for_create(h100_full(node, gpus))]


def static_mig_slices(node: str, layout: Mapping[int, Sequence[tuple[str, int]]]) -> list[JsonObject]:
    """Static MIG: the instances of `layout` (minor -> (profile, start)), the full GPUs not published;
    a minor with no instance is published as a whole GPU (MIG off there)."""
    devices: list[JsonObject] = []
    for minor, instances in sorted(layout.items()):
        if instances:
            devices.extend(mig_device(node, minor, profile, start) for profile, start in instances)
        else:
            devices.append(gpu_device(node, minor))
    return [for_create(resource_slice(f"{node}-gpu", node, devices))]


def dynamic_mig_slices(node: str, gpus: int = 2) -> list[JsonObject]:
    """DynamicMIG: a slice of the per-GPU counter sets and a slice of every full GPU and MIG profile ×
    placement of an H100 (each consuming its GPU's counters), one pool of two slices."""
    return [for_create(body) for body in h100_dynamic(node, gpus, H100_PLACEMENTS)]


def create_gpu_node(
    plane: ControlPlane, name: str, slices: Iterable[Mapping[str, Any]], labels: Mapping[str, str] | None = None
) -> None:
    """A Ready Node without GPUs in its allocatable (DRA serves them) and its published slices."""
    plane.create_node(node_body(name, {"cpu": "32", "memory": "256Gi", "pods": "110"}, labels))
    api = resource_api(plane)
    for body in slices:
        api.create_resource_slice(dict(body))


def delete_gpu_node(plane: ControlPlane, name: str) -> None:
    """Delete a node's slices (any driver) and the Node."""
    api = resource_api(plane)
    for body in list_slices(plane):
        if body["spec"].get("nodeName") == name:
            api.delete_resource_slice(body["metadata"]["name"])
    plane.delete_node(name)


def install_device_classes(plane: ControlPlane) -> None:
    """The DeviceClasses NVIDIA's chart installs: `gpu.nvidia.com` (whole GPUs) and `mig.nvidia.com`."""
    api = resource_api(plane)
    for name, kind in ((GPU_CLASS, "gpu"), (MIG_CLASS, "mig")):
        expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
        body = {
            "apiVersion": RESOURCE_API,
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }
        _ignore_conflict(api.create_device_class, body)


# ============================================================ claim templates and pods
def claim_template(name: str, device_class: str, count: int = 1, selector: str | None = None) -> JsonObject:
    """A ResourceClaimTemplate of one request `gpu` for `count` devices of `device_class` (CEL `selector`)."""
    exactly: JsonObject = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def mig_template(profile: str) -> JsonObject:
    """`mig-<profile>`: one MIG device of `profile` (`mig.nvidia.com`)."""
    selector = f"device.attributes['{DRIVER}'].profile == '{profile}'"
    return claim_template(f"mig-{profile.replace('.', '-')}", MIG_CLASS, 1, selector)


def gpu_template(count: int) -> JsonObject:
    """`gpus-<count>`: `count` whole GPUs (`gpu.nvidia.com`)."""
    return claim_template(f"gpus-{count}", GPU_CLASS, count)


def create_templates(plane: ControlPlane, namespace: str, templates: Iterable[Mapping[str, Any]]) -> None:
    """Create ResourceClaimTemplates in `namespace`."""
    api = resource_api(plane)
    for body in templates:
        api.create_namespaced_resource_claim_template(namespace, dict(body))


def claim_pod(
    name: str,
    templates: Mapping[str, str],
    *,
    cpu: str = "100m",
    node_selector: Mapping[str, str] | None = None,
    scheduler_name: str = DEFAULT_SCHEDULER,
) -> JsonObject:
    """A one-container pod with a ResourceClaim per `templates` entry (claim name -> template name), all
    of them used by the container, and a small CPU request."""
    spec: JsonObject = {
        "schedulerName": scheduler_name,
        "terminationGracePeriodSeconds": 0,
        "resourceClaims": [{"name": claim, "resourceClaimTemplateName": t} for claim, t in templates.items()],
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/gpupack-e2e:0",
                "resources": {
                    "requests": {"cpu": cpu, "memory": "128Mi"},
                    "claims": [{"name": claim} for claim in templates],
                },
            }
        ],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def gated(pod: Mapping[str, Any]) -> JsonObject:
    """The pod body with the `gpupack.io/dra-allocation` gate written in (as a user may; the shipped policy
    adds it to opted-in pods: `apply_gate_policy`)."""
    body: JsonObject = json.loads(json.dumps(pod))
    body["spec"].setdefault("schedulingGates", []).append({"name": GATE})
    return body


def apply_gate_policy(plane: ControlPlane) -> None:
    """Apply the shipped MutatingAdmissionPolicy that gates opted-in pods (`manifests/dra/gate.yaml`), and wait
    until it is in force (the API server loads a new policy within a second or so): a dry-run pod with a
    claim in an opted-in namespace comes back gated."""
    argv = [str(plane.kube_bin / "kubectl"), f"--kubeconfig={plane.kubeconfig}", "apply", "-f", str(GATE_MANIFEST)]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)
    core = plane.core()
    if GATE_PROBE_NAMESPACE not in {n.metadata.name for n in core.list_namespace().items}:
        plane.create_namespace(GATE_PROBE_NAMESPACE, {GATE_LABEL: "enabled"})
    probe = claim_pod("gate-probe", {"gpu": "never-made"})

    def gated_on_create() -> bool:
        created = core.create_namespaced_pod(GATE_PROBE_NAMESPACE, probe, dry_run="All")
        return GATE in [gate.name for gate in created.spec.scheduling_gates or []]

    wait_until("the DRA gate policy in force", gated_on_create, timeout=30, interval=0.3)


def lift_gate(plane: ControlPlane, namespace: str, name: str) -> None:
    """Remove every scheduling gate of the pod (what gpupack does once it has allocated its claims)."""
    patch = {"spec": {"schedulingGates": None}}
    plane.core().patch_namespaced_pod(name, namespace, patch, _content_type="application/merge-patch+json")


def node_selector(node: str) -> JsonObject:
    """An allocation's nodeSelector for one node, as kube-scheduler writes it."""
    return {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def write_allocation(
    plane: ControlPlane, namespace: str, claim: str, node: str, devices: Sequence[str], request: str = "gpu"
) -> None:
    """Allocate `devices` (of `node`'s pool of gpu.nvidia.com) to the claim's `request`, as an allocator
    outside kube-scheduler would: status.allocation with results, the node selector and the timestamp.

    kube-scheduler 1.37 needs `allocationTimestamp`: without it its PreBind sends `allocation: null` with
    the reservation and the API server refuses it ("field cannot be modified once set"), for ever.
    """
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results = [{"request": request, "driver": DRIVER, "pool": node, "device": device} for device in devices]
    allocation = {"devices": {"results": results}, "nodeSelector": node_selector(node), "allocationTimestamp": stamp}
    resource_api(plane).patch_namespaced_resource_claim_status(
        claim, namespace, {"status": {"allocation": allocation}}, _content_type="application/merge-patch+json"
    )


# ============================================================ waiting
def pod_state(pod: Mapping[str, Any]) -> str:
    """`bound` (spec.nodeName set), `unschedulable` (PodScheduled False, reason Unschedulable), `gated`
    (reason SchedulingGated) or `pending`."""
    if pod["spec"].get("nodeName"):
        return "bound"
    for condition in pod.get("status", {}).get("conditions", []):
        if condition["type"] == "PodScheduled" and condition["status"] == "False":
            if condition.get("reason") == "Unschedulable":
                return "unschedulable"
            if condition.get("reason") == "SchedulingGated":
                return "gated"
    return "pending"


def wait_decided(plane: ControlPlane, namespace: str, name: str, timeout: float = WAIT_TIMEOUT) -> JsonObject:
    """The pod once it is bound or unschedulable; ControlPlaneError with its state after `timeout`."""
    deadline = time.monotonic() + timeout
    interval = 0.02
    while True:
        pod = read_pod(plane, namespace, name)
        if pod_state(pod) in ("bound", "unschedulable"):
            return pod
        if time.monotonic() > deadline:
            conditions = pod.get("status", {}).get("conditions", [])
            raise ControlPlaneError(f"pod {namespace}/{name} not decided after {timeout:.0f} s: {conditions}")
        time.sleep(interval)
        interval = min(interval * 1.5, 0.25)


def wait_bound(plane: ControlPlane, namespace: str, name: str, timeout: float = WAIT_TIMEOUT) -> JsonObject:
    """The pod once bound; ControlPlaneError when it ends unschedulable or after `timeout`."""
    pod = wait_decided(plane, namespace, name, timeout)
    if pod_state(pod) != "bound":
        raise ControlPlaneError(f"pod {namespace}/{name} is unschedulable: {pod['status'].get('conditions')}")
    return pod


def wait_unschedulable(plane: ControlPlane, namespace: str, name: str, timeout: float = WAIT_TIMEOUT) -> JsonObject:
    """The pod once unschedulable; ControlPlaneError when it is bound or after `timeout`."""
    pod = wait_decided(plane, namespace, name, timeout)
    if pod_state(pod) != "unschedulable":
        raise ControlPlaneError(f"pod {namespace}/{name} was bound to {pod['spec']['nodeName']}")
    return pod


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The pod's ResourceClaims: those it names and those the controller made for it from templates
    (`status.resourceClaimStatuses`)."""
    direct = [c["resourceClaimName"] for c in pod["spec"].get("resourceClaims", []) if c.get("resourceClaimName")]
    statuses = pod.get("status", {}).get("resourceClaimStatuses", [])
    return direct + [s["resourceClaimName"] for s in statuses if s.get("resourceClaimName")]


def wait_pod_claims(plane: ControlPlane, namespace: str, name: str, timeout: float = WAIT_TIMEOUT) -> list[str]:
    """The pod's claim names once the controller has made them (gated pods' claims too)."""
    pod = read_pod(plane, namespace, name)
    wanted = len(pod["spec"].get("resourceClaims", []))
    names: list[str] = []

    def made() -> bool:
        names[:] = claim_names(read_pod(plane, namespace, name))
        return len(names) >= wanted

    wait_until(f"the claims of pod {namespace}/{name}", made, timeout, interval=0.05)
    return names


def wait_claims_gone(plane: ControlPlane, namespace: str, names: Iterable[str], timeout: float = WAIT_TIMEOUT) -> None:
    """Wait until none of the named claims exists any more."""
    names = set(names)
    if names:
        wait_until(
            f"claims {sorted(names)} of {namespace} to be deleted",
            lambda: not names & {c["metadata"]["name"] for c in list_claims(plane, namespace)},
            timeout,
            interval=0.05,
        )


def delete_pod_and_claims(plane: ControlPlane, namespace: str, name: str, timeout: float = WAIT_TIMEOUT) -> None:
    """Delete the pod at once and wait until the controller has deleted its generated claims."""
    names = claim_names(read_pod(plane, namespace, name))
    plane.delete_pod(namespace, name)
    wait_claims_gone(plane, namespace, names, timeout)


# ============================================================ the slices' devices and counters
class Inventory:
    """The current devices and counter sets of every pool (highest generation only) and what the allocated
    claims take of them."""

    def __init__(self, slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]]) -> None:
        slices = list(slices)
        newest: dict[tuple[str, str], int] = {}
        for body in slices:
            pool = body["spec"]["pool"]
            key = (body["spec"]["driver"], pool["name"])
            newest[key] = max(newest.get(key, 0), int(pool.get("generation", 0)))
        # (driver, pool, device) -> (node, device); (driver, pool, counter set) -> counter -> amount
        self.devices: dict[tuple[str, str, str], tuple[str, JsonObject]] = {}
        self.counters: dict[tuple[str, str, str], dict[str, Fraction]] = {}
        for body in slices:
            spec = body["spec"]
            driver, pool = spec["driver"], spec["pool"]["name"]
            if int(spec["pool"].get("generation", 0)) != newest[(driver, pool)]:
                continue
            for device in spec.get("devices") or []:
                self.devices[(driver, pool, device["name"])] = (spec.get("nodeName", ""), device)
            for counter_set in spec.get("sharedCounters") or []:
                amounts = {k: parse_quantity(v["value"]) for k, v in counter_set.get("counters", {}).items()}
                self.counters[(driver, pool, counter_set["name"])] = amounts
        # (driver, pool, device) -> "namespace/claim" of every allocated claim naming it
        self.holders: dict[tuple[str, str, str], list[str]] = defaultdict(list)
        self.claim_nodes: dict[str, str | None] = {}  # "namespace/claim" -> the node its allocation selects
        for claim in claims:
            allocation = claim.get("status", {}).get("allocation")
            if not allocation:
                continue
            ref = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
            self.claim_nodes[ref] = selected_node(allocation.get("nodeSelector"))
            for result in allocation.get("devices", {}).get("results", []):
                self.holders[(result["driver"], result["pool"], result["device"])].append(ref)

    def used(self) -> dict[tuple[str, str, str], dict[str, Fraction]]:
        """Per counter set, what the allocated devices consume of it."""
        used: dict[tuple[str, str, str], dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
        for key in self.holders:
            if key not in self.devices:
                continue
            driver, pool, _ = key
            for consumption in self.devices[key][1].get("consumesCounters") or []:
                for counter, value in consumption.get("counters", {}).items():
                    used[(driver, pool, consumption["counterSet"])][counter] += parse_quantity(value["value"])
        return used

    def free(self, key: tuple[str, str, str]) -> bool:
        """Whether the device is unallocated and every counter it consumes is still available."""
        if self.holders.get(key):
            return False
        driver, pool, _ = key
        used = self.used()
        for consumption in self.devices[key][1].get("consumesCounters") or []:
            set_key = (driver, pool, consumption["counterSet"])
            for counter, value in consumption.get("counters", {}).items():
                available = self.counters.get(set_key, {}).get(counter, Fraction(0)) - used[set_key][counter]
                if parse_quantity(value["value"]) > available:
                    return False
        return True

    def placeable(self, profile: str, nodes: Iterable[str] | None = None) -> int:
        """On how many GPUs (of `nodes`, or all) a device of MIG `profile` could be allocated now."""
        wanted = set(nodes) if nodes is not None else None
        gpus = set()
        for key, (node, device) in self.devices.items():
            attributes = device.get("attributes", {})
            if attributes.get("type", {}).get("string") != "mig":
                continue
            if attributes.get("profile", {}).get("string") != profile or (wanted is not None and node not in wanted):
                continue
            if self.free(key):
                gpus.add((node, attributes.get("parentUUID", {}).get("string")))
        return len(gpus)

    def fits_repacked(self, profile: str, nodes: Iterable[str] | None = None) -> bool:
        """Whether some GPU (of `nodes`) has, in total, the counters a `profile` device consumes free, though
        not at a placement that is free: the profile is blocked by where the GPU's instances sit
        (`memory-slice-*` counters count as interchangeable)."""
        wanted = set(nodes) if nodes is not None else None
        used = self.used()
        for key, (node, device) in self.devices.items():
            attributes = device.get("attributes", {})
            if attributes.get("profile", {}).get("string") != profile or (wanted is not None and node not in wanted):
                continue
            driver, pool, _ = key
            consumptions = device.get("consumesCounters") or []
            if consumptions and all(self._fits_anywhere(driver, pool, c, used) for c in consumptions):
                return True
        return False

    def _fits_anywhere(
        self, driver: str, pool: str, consumption: Mapping[str, Any], used: Mapping[Any, Mapping[str, Fraction]]
    ) -> bool:
        set_key = (driver, pool, consumption["counterSet"])
        shared, taken = self.counters.get(set_key, {}), used.get(set_key, {})
        free = {c: amount - taken.get(c, Fraction(0)) for c, amount in shared.items()}
        need = {c: parse_quantity(v["value"]) for c, v in consumption.get("counters", {}).items()}
        slices_needed = sum(v for c, v in need.items() if c.startswith("memory-slice-"))
        slices_free = sum(v for c, v in free.items() if c.startswith("memory-slice-"))
        others = all(v <= free.get(c, Fraction(0)) for c, v in need.items() if not c.startswith("memory-slice-"))
        return others and slices_needed <= slices_free


def selected_node(selector: Mapping[str, Any] | None) -> str | None:
    """The one node an allocation's nodeSelector names (`metadata.name In [node]`), None for any other form."""
    if not selector:
        return None
    names: set[str] = set()
    for term in selector.get("nodeSelectorTerms", []):
        for field in term.get("matchFields", []):
            if field.get("key") == "metadata.name" and field.get("operator") == "In":
                names.update(field.get("values", []))
    return names.pop() if len(names) == 1 else None


def legality(plane: ControlPlane) -> list[str]:
    """What is illegal about the cluster's allocations now (empty: all legal), read from the live objects."""
    return legality_of(list_slices(plane), list_claims(plane), list_pods(plane))


def legality_of(
    slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> list[str]:
    """`legality` over given objects: each allocated device exists in the current slices of the claim's node
    and is in one claim only; no counter set is overdrawn; a bound pod's claims are allocated on its node
    and reserved for it."""
    claims = list(claims)
    inventory = Inventory(slices, claims)
    violations = []
    for ref, node in inventory.claim_nodes.items():
        if node is None:
            violations.append(f"claim {ref}: its allocation's nodeSelector names no single node")
    for key, refs in sorted(inventory.holders.items()):
        device = "/".join(key)
        if len(refs) > 1:
            violations.append(f"device {device} is allocated to {len(refs)} claims: {sorted(refs)}")
        if key not in inventory.devices:
            violations.append(f"device {device} of {sorted(refs)} is in no current slice")
            continue
        node = inventory.devices[key][0]
        for ref in refs:
            if inventory.claim_nodes.get(ref) not in (None, node):
                violations.append(f"claim {ref} selects node {inventory.claim_nodes[ref]} but {device} is on {node}")
    for set_key, used in sorted(inventory.used().items()):
        shared = inventory.counters.get(set_key)
        if shared is None:
            violations.append(f"counter set {'/'.join(set_key)} is consumed but published by no current slice")
            continue
        for counter, amount in sorted(used.items()):
            if amount > shared.get(counter, Fraction(0)):
                violations.append(
                    f"counter set {'/'.join(set_key)}: {counter} allocated {amount} > {shared.get(counter, 0)}"
                )
    by_ref = {f"{c['metadata']['namespace']}/{c['metadata']['name']}": c for c in claims}
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if not node:
            continue
        namespace, name, uid = pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"]
        for claim_name in claim_names(pod):
            ref = f"{namespace}/{claim_name}"
            claim = by_ref.get(ref)
            if claim is None or not claim.get("status", {}).get("allocation"):
                violations.append(f"pod {namespace}/{name} is bound to {node} but its claim {ref} is not allocated")
                continue
            if inventory.claim_nodes.get(ref) not in (None, node):
                violations.append(f"pod {namespace}/{name} is bound to {node}, its claim {ref} selects another node")
            reserved = {r.get("uid") for r in claim["status"].get("reservedFor", [])}
            if uid not in reserved:
                violations.append(f"pod {namespace}/{name} is bound but its claim {ref} is not reserved for it")
    return violations
