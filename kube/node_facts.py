"""NodeFacts from a v1.Node (as a JSON dict): capacity, GPUs, MIG, topology and price (docs/contracts.md#node-labels).

Rules, beyond reading the labels and annotations docs/contracts.md names:
- Allocatable falls back to capacity when absent (the API server's defaulting); a missing `pods`
  means the kubelet default of 110.
- GPUs: allocatable `nvidia.com/gpu`. `gpupack.io/mig: "dynamic"` makes every GPU partitionable on
  demand; the count is then the `nvidia.com/gpu.count` label if present. Otherwise any allocatable
  `nvidia.com/mig-<profile>` makes the node static MIG: the instances sit where
  `gpupack.io/mig-layout` says (it must hold exactly the instances allocatable advertises) or, when
  absent, where `mig_layout.synthesize_layout` puts them; the count is the `nvidia.com/gpu.count`
  label if present, else the whole GPUs plus the GPUs the layout uses.
- A product without known MIG geometry is non-MIG: its `nvidia.com/mig-*` resources are ignored, and
  gpupack's MIG annotations on it are an error.
- Garbage in a label or annotation gpupack reads raises NodeFactsError naming the node and the key;
  the caller marks the node unusable with that reason.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from gpupack.errors import GpupackError
from gpupack.kube.keys import (
    ANNOTATION_GPU_TOPOLOGY,
    ANNOTATION_HOURLY_COST,
    ANNOTATION_MIG,
    ANNOTATION_MIG_LAYOUT,
    LABEL_GPU_COUNT,
    LABEL_GPU_MEMORY,
    LABEL_GPU_PRODUCT,
    LABEL_INSTANCE_TYPE,
    RESOURCE_CPU,
    RESOURCE_GPU,
    RESOURCE_MEMORY,
    RESOURCE_MIG_PREFIX,
    RESOURCE_PODS,
    SPOT_LABELS,
    decode_json,
)
from gpupack.kube.mig_layout import Layout, instance_counts, parse_layout, synthesize_layout
from gpupack.kube.quantity import parse_bytes, parse_count, parse_cpu_milli
from gpupack.scoring.facts import MigMode, NodeFacts
from gpupack.scoring.geometry import canonical_profile
from gpupack.scoring.gpu_models import lookup_model
from gpupack.scoring.request import MAX_GPUS_PER_NODE

DEFAULT_PODS = 110  # kubelet's default maxPods
MAX_NVLINKS = 64  # NVLink connections between two GPUs; more is garbage
PriceTable = Mapping[tuple[str, str], float]  # (instance type, "spot" | "on-demand") -> hourly price

_WHOLE_NUMBER = re.compile(r"[0-9]{1,9}")
_PRICE = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


class NodeFactsError(GpupackError, ValueError):
    """A node whose labels, annotations or resources gpupack cannot read; names node and key."""

    def __init__(self, node: str, key: str, reason: str) -> None:
        self.node = node
        self.key = key
        self.reason = reason
        super().__init__(f"node {node}: {key}: {reason}")


def node_name(node: Mapping[str, Any]) -> str:
    """The node's metadata.name; NodeFactsError when missing."""
    name = (node.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise NodeFactsError("<unnamed>", "metadata.name", "missing")
    return name


def facts_from_node(node: Mapping[str, Any], price_table: PriceTable | None = None) -> NodeFacts:
    """What a node offers, for the scoring core. Raises NodeFactsError on garbage.

    `price_table` gives the hourly price by (instance type, "spot"/"on-demand") for nodes without
    the `gpupack.io/hourly-cost` annotation.
    """
    name = node_name(node)
    metadata = node.get("metadata") or {}
    labels = _string_map(name, "metadata.labels", metadata.get("labels"))
    annotations = _string_map(name, "metadata.annotations", metadata.get("annotations"))
    resources = _allocatable(name, node)
    product = labels.get(LABEL_GPU_PRODUCT, "")
    gpu_count, mig_mode, layout = _gpus(name, product, labels, annotations, resources)
    nvlink, numa = _topology(name, annotations, gpu_count)
    spot = is_spot(labels)
    return NodeFacts(
        name=name,
        cpu_milli=_resource(name, resources, RESOURCE_CPU, parse_cpu_milli, 0),
        memory_bytes=_resource(name, resources, RESOURCE_MEMORY, parse_bytes, 0),
        pods=_resource(name, resources, RESOURCE_PODS, parse_count, DEFAULT_PODS),
        gpu_product=product,
        gpu_count=gpu_count,
        gpu_memory_mib=_label_number(name, labels, LABEL_GPU_MEMORY) or 0,
        mig_mode=mig_mode,
        mig_layout=layout,
        nvlink=nvlink,
        numa=numa,
        spot=spot,
        hourly_cost=_hourly_cost(name, labels, annotations, spot, price_table),
        labels=dict(labels),
    )


def is_spot(labels: Mapping[str, str]) -> bool:
    """True when any cloud's capacity-type label says spot (Karpenter, EKS, GKE, AKS)."""
    return any(labels.get(key, "").lower() == value for key, value in SPOT_LABELS.items())


def node_is_schedulable(node: Mapping[str, Any]) -> bool:
    """False when the node is cordoned, or reports conditions without Ready=True."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions")
    if not conditions:
        return True  # objects from a cluster file carry no status
    return any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


@contextmanager
def _reading(node: str, key: str) -> Iterator[None]:
    """Turn any ValueError raised while reading `key` into a NodeFactsError naming node and key."""
    try:
        yield
    except NodeFactsError:
        raise
    except ValueError as exc:
        raise NodeFactsError(node, key, str(exc)) from None


def _string_map(node: str, key: str, value: object) -> Mapping[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise NodeFactsError(node, key, "must map strings to strings")
    return value


def _allocatable(node: str, obj: Mapping[str, Any]) -> Mapping[str, object]:
    status = obj.get("status") or {}
    resources = status.get("allocatable")
    if resources is None:
        resources = status.get("capacity") or {}
    if not isinstance(resources, Mapping):
        raise NodeFactsError(node, "status.allocatable", "must be an object")
    return resources


def _resource(
    node: str, resources: Mapping[str, object], key: str, parse: Callable[[Any], int], default: int
) -> int:
    if key not in resources:
        return default
    with _reading(node, f"allocatable {key}"):
        return parse(resources[key])


def _label_number(node: str, labels: Mapping[str, str], key: str) -> int | None:
    value = labels.get(key)
    if value is None:
        return None
    if not _WHOLE_NUMBER.fullmatch(value):
        raise NodeFactsError(node, f"label {key}", f"{value!r} is not a whole number")
    return int(value)


def _gpus(
    node: str,
    product: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    resources: Mapping[str, object],
) -> tuple[int, MigMode, Layout]:
    """GPU count, MIG mode and static layout (see the module docstring for the rules)."""
    whole = _resource(node, resources, RESOURCE_GPU, parse_count, 0)
    labelled = _label_number(node, labels, LABEL_GPU_COUNT)
    family = lookup_model(product).mig_family
    dynamic = _dynamic_mig(node, annotations)
    layout_text = annotations.get(ANNOTATION_MIG_LAYOUT)
    if (dynamic or layout_text is not None) and family is None:
        key = ANNOTATION_MIG if dynamic else ANNOTATION_MIG_LAYOUT
        raise NodeFactsError(node, key, f"GPU product {product!r} has no MIG geometry gpupack knows")
    if dynamic:
        return _checked_count(node, whole if labelled is None else labelled), MigMode.DYNAMIC, {}
    instances = _mig_instances(node, resources)
    if family is None or not (instances or layout_text is not None):
        return _checked_count(node, whole), MigMode.NONE, {}
    if layout_text is None:
        with _reading(node, "allocatable nvidia.com/mig-*"):
            layout = synthesize_layout(family, instances, labelled)
    else:
        with _reading(node, ANNOTATION_MIG_LAYOUT):
            layout = parse_layout(decode_json(layout_text), family, labelled)
            held = instance_counts(layout)
            if held != Counter(instances):
                raise ValueError(f"holds {_counts(held)} but allocatable advertises {_counts(instances)}")
    count = _checked_count(node, whole + len(layout) if labelled is None else labelled)
    if layout and max(layout) >= count:
        raise NodeFactsError(node, ANNOTATION_MIG_LAYOUT, f"names GPU {max(layout)} of {count}")
    return count, MigMode.STATIC, layout


def _mig_instances(node: str, resources: Mapping[str, object]) -> dict[str, int]:
    """Allocatable `nvidia.com/mig-<profile>` counts by profile (nvidia-smi's spelling), zeros dropped."""
    instances: dict[str, int] = {}
    for key in resources:
        if not key.startswith(RESOURCE_MIG_PREFIX):
            continue
        if "+" in key:
            raise NodeFactsError(node, key, "a Kubernetes resource name cannot hold '+' (the device plugin writes .me)")
        count = _resource(node, resources, key, parse_count, 0)
        if count > 0:
            instances[canonical_profile(key[len(RESOURCE_MIG_PREFIX) :])] = count
    return instances


def _dynamic_mig(node: str, annotations: Mapping[str, str]) -> bool:
    value = annotations.get(ANNOTATION_MIG)
    if value not in (None, "dynamic", "static"):
        raise NodeFactsError(node, ANNOTATION_MIG, f'{value!r} is neither "dynamic" nor "static"')
    return value == "dynamic"


def _checked_count(node: str, count: int) -> int:
    if count > MAX_GPUS_PER_NODE:
        raise NodeFactsError(node, "GPUs", f"{count} GPUs; gpupack supports at most {MAX_GPUS_PER_NODE}")
    return count


def _counts(counts: Mapping[str, int]) -> str:
    return "{" + ", ".join(f"{p}: {n}" for p, n in sorted(counts.items())) + "}"


def _topology(
    node: str, annotations: Mapping[str, str], gpu_count: int
) -> tuple[tuple[tuple[int, ...], ...] | None, tuple[int, ...] | None]:
    text = annotations.get(ANNOTATION_GPU_TOPOLOGY)
    if text is None:
        return None, None
    with _reading(node, ANNOTATION_GPU_TOPOLOGY):
        return parse_topology(decode_json(text), gpu_count)


def parse_topology(
    data: object, gpu_count: int
) -> tuple[tuple[tuple[int, ...], ...] | None, tuple[int, ...] | None]:
    """(NVLink matrix, NUMA nodes) from a decoded `gpupack.io/gpu-topology`; ValueError on garbage.

    The matrix must be gpu_count x gpu_count and symmetric with counts 0..64 (the diagonal is
    ignored); `numa` must have one entry per GPU: a NUMA node, or -1 where it is unknown (as
    `gpupack topology` writes N/A), and then the node's NUMA layout is unknown as a whole (no NUMA
    preference, as when `numa` is absent). Either key may be absent.
    """
    if not isinstance(data, dict) or not set(data) <= {"nvlink", "numa"}:
        raise ValueError('must be a JSON object with keys "nvlink" and/or "numa"')
    nvlink = None
    if data.get("nvlink") is not None:
        rows = data["nvlink"]
        if (
            not isinstance(rows, list)
            or len(rows) != gpu_count
            or not all(isinstance(row, list) and len(row) == gpu_count for row in rows)
        ):
            raise ValueError(f"nvlink must be a {gpu_count}x{gpu_count} matrix, one row per GPU")
        nvlink = tuple(_small_ints(row, "nvlink", MAX_NVLINKS) for row in rows)
        for i in range(gpu_count):
            for j in range(i):
                if nvlink[i][j] != nvlink[j][i]:
                    raise ValueError(f"nvlink is not symmetric: [{i}][{j}] != [{j}][{i}]")
    numa = None
    if data.get("numa") is not None:
        entries = data["numa"]
        if not isinstance(entries, list) or len(entries) != gpu_count:
            raise ValueError(f"numa must list one NUMA node per GPU ({gpu_count})")
        known = [value for value in entries if value != -1]
        _small_ints(known, "numa", 1023)
        numa = tuple(known) if len(known) == gpu_count else None
    return nvlink, numa


def _small_ints(values: list[object], what: str, limit: int) -> tuple[int, ...]:
    checked: list[int] = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
            raise ValueError(f"{what} entry {value!r} is not an integer in 0..{limit}")
        checked.append(value)
    return tuple(checked)


def _hourly_cost(
    node: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    spot: bool,
    price_table: PriceTable | None,
) -> float | None:
    text = annotations.get(ANNOTATION_HOURLY_COST)
    if text is None:
        if price_table is None:
            return None
        return price_table.get((labels.get(LABEL_INSTANCE_TYPE, ""), "spot" if spot else "on-demand"))
    if not _PRICE.fullmatch(text):
        raise NodeFactsError(node, ANNOTATION_HOURLY_COST, f"{text!r} is not a number")
    cost = float(text)
    if not math.isfinite(cost) or math.copysign(1.0, cost) < 0:  # "-0" too: a sign is a typo, not a price
        raise NodeFactsError(node, ANNOTATION_HOURLY_COST, f"{text!r} must be a finite, non-negative price")
    return cost
