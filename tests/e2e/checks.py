"""The one check of what the API server holds after scheduling: every `gpupack.io/assignment` is legal.

`assignment_problems(nodes, pods)` reads Node and Pod objects (JSON dicts, as the API server returns
them) and lists every problem: a bound pod without an assignment, an assignment whose `node` is not
the pod's `spec.nodeName`, a GPU index the node does not have, a slot that does not match the request,
a GPU handed out twice (whole, or whole and shared / MIG), shares over 1000 milli, a MIG instance that
does not exist in a static layout, overlapping memory slices, more compute slices than the GPU has,
two media-extension instances on one GPU, a model the pod's affinity excludes. Geometry comes from
`scoring.geometry` (docs/contracts.md#mig-geometry); the rest is read straight from the objects,
independently of gpupack.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupack.scoring.geometry import SHAPES, MigFamily, canonical_profile, resolve_profile, slice_bits
from gpupack.scoring.gpu_models import lookup_model

ASSIGNMENT = "gpupack.io/assignment"
PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
MILLI_RESOURCE = "gpupack.io/gpu-milli"
MIG_PREFIX = "nvidia.com/mig-"


@dataclass(frozen=True)
class NodeInventory:
    """What a node offers, read from its labels, allocatable and annotations."""

    name: str
    product: str
    family: MigFamily | None
    gpu_count: int
    mig_mode: str  # "none", "static" or "dynamic"
    layout: Mapping[int, frozenset[tuple[str, int]]]  # static MIG: GPU -> {(profile, start)}


@dataclass
class GpuUse:
    """What has been handed out of one GPU so far."""

    whole_by: str | None = None
    milli: int = 0
    slices: int = 0  # memory-slice occupancy mask of MIG instances
    compute: int = 0
    media_extensions: int = 0
    users: list[str] = field(default_factory=list)


def node_inventory(node: Mapping[str, Any]) -> NodeInventory:
    """The inventory of one Node object."""
    metadata = node["metadata"]
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    product = labels.get(PRODUCT_LABEL, "")
    layout_text = annotations.get("gpupack.io/mig-layout")
    layout = {
        int(index): frozenset((canonical_profile(p), int(s)) for p, s in (e.split("@") for e in entries))
        for index, entries in (json.loads(layout_text) if layout_text else {}).items()
    }
    has_mig = any(key.startswith(MIG_PREFIX) and int(value) > 0 for key, value in allocatable.items())
    if annotations.get("gpupack.io/mig") == "dynamic":
        mode = "dynamic"
    elif has_mig or layout:
        mode = "static"
    else:
        mode = "none"
    count = labels.get("nvidia.com/gpu.count") or allocatable.get(GPU_RESOURCE) or 0
    return NodeInventory(metadata["name"], product, lookup_model(product).mig_family, int(count), mode, layout)


def pod_key(pod: Mapping[str, Any]) -> str:
    """namespace/name."""
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def pod_gpu_request(pod: Mapping[str, Any]) -> dict[str, int]:
    """The GPU resources a pod asks for (summed limits of its containers): resource -> amount."""
    wanted: dict[str, int] = {}
    for container in pod["spec"]["containers"]:
        for resource, amount in ((container.get("resources") or {}).get("limits") or {}).items():
            if resource in (GPU_RESOURCE, MILLI_RESOURCE) or resource.startswith(MIG_PREFIX):
                wanted[resource] = wanted.get(resource, 0) + int(amount)
    return wanted


def allowed_products(pod: Mapping[str, Any]) -> set[str] | None:
    """The GPU models the pod's required node affinity allows, None when it names none."""
    affinity = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    products: set[str] | None = None
    for term in affinity.get("nodeSelectorTerms") or []:
        for expression in term.get("matchExpressions") or []:
            if expression["key"] == PRODUCT_LABEL and expression["operator"] == "In":
                products = (products or set()) | set(expression["values"])
    return products


def assignment_problems(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every problem with the bound pods' assignments against the nodes' inventories (empty: all legal)."""
    inventories = {inv.name: inv for inv in map(node_inventory, nodes)}
    usage: dict[tuple[str, int], GpuUse] = {}
    problems: list[str] = []
    for pod in sorted(pods, key=pod_key):
        node_name = pod["spec"].get("nodeName")
        if node_name:
            problems += _pod_problems(pod, node_name, inventories, usage)
    return problems


def _pod_problems(
    pod: Mapping[str, Any],
    node_name: str,
    inventories: Mapping[str, NodeInventory],
    usage: dict[tuple[str, int], GpuUse],
) -> list[str]:
    """Problems of one bound pod; records what it holds in `usage`."""
    key = pod_key(pod)
    wanted = pod_gpu_request(pod)
    if not wanted:
        return []
    text = (pod["metadata"].get("annotations") or {}).get(ASSIGNMENT)
    if text is None:
        return [f"{key}: bound to {node_name} without {ASSIGNMENT}"]
    assignment = json.loads(text)
    problems = []
    if assignment.get("node") != node_name:
        problems.append(f"{key}: assignment names node {assignment.get('node')!r}, spec.nodeName is {node_name}")
    inventory = inventories.get(node_name)
    if inventory is None:
        return [*problems, f"{key}: bound to {node_name}, which is not a known node"]
    products = allowed_products(pod)
    if products is not None and inventory.product not in products:
        problems.append(f"{key}: on a {inventory.product}, its affinity allows only {sorted(products)}")
    slots = assignment.get("gpus") or []
    problems += _slots_match_request(key, wanted, slots)
    for slot in slots:
        problems += _take_slot(key, inventory, slot, usage)
    return problems


def _slots_match_request(key: str, wanted: Mapping[str, int], slots: list[Mapping[str, Any]]) -> list[str]:
    """The slots are the kind and number the pod asked for."""
    if len(wanted) != 1:
        return [f"{key}: asks for several GPU kinds {dict(wanted)} yet was bound"]
    ((resource, amount),) = wanted.items()
    if resource == GPU_RESOURCE:
        indexes = [slot["index"] for slot in slots]
        ok = len(slots) == amount == len(set(indexes)) and all(set(slot) == {"index"} for slot in slots)
    elif resource == MILLI_RESOURCE:
        ok = len(slots) == 1 and slots[0].get("milli") == amount and "mig" not in slots[0]
    else:
        profile = canonical_profile(resource[len(MIG_PREFIX) :])
        ok = len(slots) == amount and all(canonical_profile(str(slot.get("mig"))) == profile for slot in slots)
    return [] if ok else [f"{key}: asked for {resource}: {amount}, got {slots}"]


def _take_slot(
    key: str, inventory: NodeInventory, slot: Mapping[str, Any], usage: dict[tuple[str, int], GpuUse]
) -> list[str]:
    """Record one slot on its GPU; the problems if it is not legal there or already handed out."""
    index = slot.get("index")
    where = f"{key}: {inventory.name} GPU {index}"
    if not isinstance(index, int) or not 0 <= index < inventory.gpu_count:
        return [f"{where}: the node has {inventory.gpu_count} GPUs"]
    use = usage.setdefault((inventory.name, index), GpuUse())
    held_by = f" (also held by {', '.join(use.users)})" if use.users else ""
    use.users.append(key)
    if "mig" in slot:
        return [f"{where}: {p}{held_by}" for p in _take_mig(inventory, index, slot, use)]
    if inventory.mig_mode == "static" and index in inventory.layout:
        return [f"{where}: a static-MIG GPU handed out as a whole GPU or share{held_by}"]
    if use.whole_by is not None or use.slices:
        return [f"{where}: already taken whole or by MIG{held_by}"]
    if "milli" in slot:
        use.milli += int(slot["milli"])
        return [f"{where}: shares add up to {use.milli} milli{held_by}"] if use.milli > 1000 else []
    if use.milli:
        return [f"{where}: a whole GPU that also holds shares{held_by}"]
    use.whole_by = key
    return []


def _take_mig(inventory: NodeInventory, index: int, slot: Mapping[str, Any], use: GpuUse) -> list[str]:
    """Record one MIG instance; the problems if it breaks the node's layout or the MIG geometry."""
    profile, start = canonical_profile(str(slot["mig"])), slot.get("start")
    if inventory.family is None or inventory.mig_mode == "none":
        return [f"MIG {profile} on a GPU that is not in MIG mode ({inventory.product})"]
    try:
        shape_id, media_extension = resolve_profile(inventory.family, profile)
    except KeyError:
        return [f"MIG profile {profile} does not exist on {inventory.family.name}"]
    shape = SHAPES[shape_id]
    problems = []
    if start not in shape.starts:
        problems.append(f"{profile} cannot start at {start}")
    elif inventory.mig_mode == "static" and (profile, start) not in inventory.layout.get(index, ()):
        problems.append(f"{profile}@{start} is not an instance of the static layout")
    if use.whole_by is not None or use.milli:
        problems.append(f"{profile}@{start} on a GPU already taken whole or shared")
    bits = slice_bits(shape.size, start) if isinstance(start, int) else 0
    if use.slices & bits:
        problems.append(f"{profile}@{start} overlaps memory slices already handed out")
    use.slices |= bits
    use.compute += shape.compute
    if use.compute > shape.compute_total:
        problems.append(f"{use.compute} compute slices of {shape.compute_total} handed out")
    use.media_extensions += media_extension
    if use.media_extensions > 1:
        problems.append("two media-extension (+me) instances on one GPU")
    return problems
