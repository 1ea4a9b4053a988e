"""A node's GPUs from the ResourceSlices NVIDIA's DRA driver publishes for it, as NodeFacts fields.

Rules (docs/dra.md#rules):
- Only slices of driver `gpu.nvidia.com` with `spec.nodeName` count, and of each pool only the slices of
  its highest `generation` (the API's rule: older generations are stale).
- The node's GPUs are its `type: gpu` devices and the parents of its `type: mig` devices, by GPU id
  (index, else minor). gpupack numbers them 0..n-1 in id order: its slot index, not NVML's index.
- MIG mode: any MIG device that consumes shared counters makes the node DynamicMIG; other MIG devices
  make it static MIG, each instance at its published placement start, or, when the driver publishes
  none, where `mig_layout.synthesize_layout` puts them (per GPU, as allocatable counts are placed).
- One product per node; memory from the GPUs' `memory` capacity (else the product's).
- Garbage, or slices gpupack cannot map (two products, a MIG profile the product lacks, more than 16 GPUs),
  raises NodeFactsError naming the node and `ResourceSlices`, so the node is unusable with that reason.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupack.kube.dra.objects import DRIVER
from gpupack.kube.dra.slices import ResourceSliceInfo, SliceDevice
from gpupack.kube.keys import ANNOTATION_GPU_TOPOLOGY, ANNOTATION_MIG, ANNOTATION_MIG_LAYOUT, decode_json
from gpupack.kube.mig_layout import Layout, MigLayoutError, parse_layout, synthesize_layout
from gpupack.kube.node_facts import NodeFactsError, PriceTable, facts_from_node, parse_topology
from gpupack.scoring.facts import GpuSlot, MigMode, NodeFacts
from gpupack.scoring.geometry import MigFamily, canonical_profile
from gpupack.scoring.gpu_models import lookup_model
from gpupack.scoring.request import MAX_GPUS_PER_NODE

KEY = "ResourceSlices"  # the key a NodeFactsError names for slice problems
DeviceKey = tuple[str, str, str]  # (driver, pool, device): how a claim's allocation names a device
_MIB = 1 << 20


@dataclass(frozen=True)
class DraGpus:
    """The GPUs a node's slices publish, in NodeFacts terms, and the slot each device stands for."""

    product: str  # as GPU Feature Discovery spells it (NVML's name with '-' for ' ')
    memory_mib: int
    count: int
    mig_mode: MigMode
    layout: Layout = field(default_factory=dict)
    slots: Mapping[DeviceKey, GpuSlot] = field(default_factory=dict)
    ids: tuple[int, ...] = ()  # the driver's GPU id (index, else minor) of each slot index
    uuids: tuple[str, ...] = ()  # each GPU's UUID ("" where not published)
    tainted: frozenset[DeviceKey] = frozenset()  # devices tainted NoSchedule/NoExecute


def current_slices(slices: Iterable[ResourceSliceInfo], node: str) -> list[ResourceSliceInfo]:
    """The node's slices of NVIDIA's GPU driver, stale pool generations left out."""
    mine = [s for s in slices if s.driver == DRIVER and s.node == node]
    newest: dict[str, int] = {}
    for piece in mine:
        newest[piece.pool] = max(newest.get(piece.pool, piece.generation), piece.generation)
    return sorted((s for s in mine if s.generation == newest[s.pool]), key=lambda s: s.name)


def gpus_of_node(node: str, slices: Iterable[ResourceSliceInfo]) -> DraGpus | None:
    """The node's GPUs from its current slices; None when they publish no GPU (not a DRA GPU node)."""
    devices = [(s.pool, d) for s in current_slices(slices, node) for d in s.devices if d.type in ("gpu", "mig")]
    if not devices:
        return None
    ids = sorted({d.gpu for _, d in devices})
    if len(ids) > MAX_GPUS_PER_NODE:
        raise NodeFactsError(node, KEY, f"{len(ids)} GPUs; gpupack supports at most {MAX_GPUS_PER_NODE}")
    slot_of = {gpu: i for i, gpu in enumerate(ids)}
    product = _product(node, [d for _, d in devices])
    migs = [(pool, d) for pool, d in devices if d.type == "mig"]
    dynamic = any(d.partitionable for _, d in migs)
    mode = MigMode.DYNAMIC if dynamic else MigMode.STATIC if migs else MigMode.NONE
    layout, mig_slots = ({}, _dynamic_slots(migs, slot_of)) if dynamic else _static(node, product, migs, slot_of)
    if mode != MigMode.NONE and lookup_model(product).mig_family is None:
        raise NodeFactsError(node, KEY, f"MIG devices on {product!r}, a GPU without MIG geometry gpupack knows")
    slots = {(DRIVER, pool, d.name): GpuSlot(slot_of[d.gpu]) for pool, d in devices if d.type == "gpu"}
    slots.update(mig_slots)
    by_gpu = {d.gpu: d for _, d in devices if d.type == "gpu"}
    return DraGpus(
        product=product,
        memory_mib=max((d.memory_bytes for d in by_gpu.values()), default=0) // _MIB,
        count=len(ids),
        mig_mode=mode,
        layout=layout,
        slots=slots,
        ids=tuple(ids),
        uuids=tuple(_uuid(gpu, by_gpu, migs) for gpu in ids),
        tainted=frozenset(
            (DRIVER, pool, d.name) for pool, d in devices if d.tainted and (DRIVER, pool, d.name) in slots
        ),
    )


def _product(node: str, devices: list[SliceDevice]) -> str:
    products = {d.product for d in devices if d.product}
    if len(products) > 1:
        raise NodeFactsError(node, KEY, f"GPUs of more than one product: {', '.join(sorted(products))}")
    return products.pop().replace(" ", "-") if products else ""


def _uuid(gpu: int, by_gpu: Mapping[int, SliceDevice], migs: list[tuple[str, SliceDevice]]) -> str:
    if gpu in by_gpu:
        return by_gpu[gpu].uuid
    return next((d.parent_uuid for _, d in migs if d.gpu == gpu and d.parent_uuid), "")


def _dynamic_slots(migs: list[tuple[str, SliceDevice]], slot_of: Mapping[int, int]) -> dict[DeviceKey, GpuSlot]:
    """Every profile × placement device of a DynamicMIG node; one without a start cannot be placed: left out."""
    return {
        (DRIVER, pool, d.name): GpuSlot(slot_of[d.gpu], mig=canonical_profile(d.profile), start=d.start)
        for pool, d in migs
        if d.profile and d.start is not None
    }


def _static(
    node: str, product: str, migs: list[tuple[str, SliceDevice]], slot_of: Mapping[int, int]
) -> tuple[Layout, dict[DeviceKey, GpuSlot]]:
    """The static MIG layout and each instance's slot: published starts, else synthesized per GPU."""
    family = lookup_model(product).mig_family
    if not migs or family is None:
        return {}, {}
    by_gpu: dict[int, list[tuple[str, SliceDevice]]] = defaultdict(list)
    for pool, d in sorted(migs, key=lambda pd: (pd[1].start is None, pd[1].start or 0, pd[1].name)):
        if not d.profile:
            raise NodeFactsError(node, KEY, f"MIG device {d.name} without a profile attribute")
        by_gpu[slot_of[d.gpu]].append((pool, d))
    slots: dict[DeviceKey, GpuSlot] = {}
    entries: dict[str, list[str]] = {}
    try:
        for index, devices in sorted(by_gpu.items()):
            starts = _starts(family, [d for _, d in devices])
            entries[str(index)] = [
                f"{canonical_profile(d.profile)}@{s}" for (_, d), s in zip(devices, starts, strict=True)
            ]
            for (pool, d), start in zip(devices, starts, strict=True):
                slots[DRIVER, pool, d.name] = GpuSlot(index, mig=canonical_profile(d.profile), start=start)
        return parse_layout(entries, family, len(slot_of)), slots
    except MigLayoutError as exc:
        raise NodeFactsError(node, KEY, f"static MIG devices: {exc}") from None


def _starts(family: MigFamily, devices: list[SliceDevice]) -> list[int]:
    """Each instance's start on one GPU: as published, or all synthesized when any is missing."""
    if all(d.start is not None for d in devices):
        return [d.start for d in devices if d.start is not None]
    counts: dict[str, int] = defaultdict(int)
    for d in devices:
        counts[canonical_profile(d.profile)] += 1
    placed: dict[str, list[int]] = defaultdict(list)
    for profile, start in synthesize_layout(family, counts, 1).get(0, ()):
        placed[profile].append(start)
    return [placed[canonical_profile(d.profile)].pop(0) for d in devices]


def dra_node_facts(node: Mapping[str, Any], gpus: DraGpus, price_table: PriceTable | None = None) -> NodeFacts:
    """NodeFacts of a DRA node: CPU, memory, pods, labels, price from the Node; GPUs from its slices.

    The Node's device-plugin GPU resources and gpupack's MIG annotations are not read (the slices say it);
    `gpupack.io/gpu-topology` is checked against the slices' GPU count. NodeFactsError on garbage.
    """
    bare = _without_gpu_resources(node)
    facts = facts_from_node(bare, price_table)
    nvlink, numa = _topology(facts.name, node, gpus.count)
    return dataclasses.replace(
        facts,
        gpu_product=gpus.product,
        gpu_count=gpus.count,
        gpu_memory_mib=gpus.memory_mib or facts.gpu_memory_mib,
        mig_mode=gpus.mig_mode,
        mig_layout=dict(gpus.layout),
        nvlink=nvlink,
        numa=numa,
    )


def _without_gpu_resources(node: Mapping[str, Any]) -> dict[str, Any]:
    """A shallow copy of the Node without what the slices replace."""
    metadata = dict(node.get("metadata") or {})
    annotations = metadata.get("annotations")
    if isinstance(annotations, Mapping):
        dropped = (ANNOTATION_MIG, ANNOTATION_MIG_LAYOUT, ANNOTATION_GPU_TOPOLOGY)
        metadata["annotations"] = {k: v for k, v in annotations.items() if k not in dropped}
    status = dict(node.get("status") or {})
    for key in ("allocatable", "capacity"):
        resources = status.get(key)
        if isinstance(resources, Mapping):
            status[key] = {k: v for k, v in resources.items() if not str(k).startswith("nvidia.com/")}
    return {**node, "metadata": metadata, "status": status}


def _topology(
    name: str, node: Mapping[str, Any], count: int
) -> tuple[tuple[tuple[int, ...], ...] | None, tuple[int, ...] | None]:
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(ANNOTATION_GPU_TOPOLOGY)
    if text is None:
        return None, None
    try:
        return parse_topology(decode_json(text), count)
    except ValueError as exc:
        raise NodeFactsError(name, ANNOTATION_GPU_TOPOLOGY, str(exc)) from None
