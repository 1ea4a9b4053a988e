"""A packing instance in the terms of the pattern LP: GPU shapes with their counts, node types with theirs.

A shape is one GPU ask with one CPU and memory request: pods of a shape are interchangeable. A node type
is one GPU model and count with one CPU and memory: its nodes are interchangeable.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpupack.scoring.facts import NodeFacts
from gpupack.scoring.request import MILLI_PER_GPU, Kind, PodRequest

Products = frozenset[str] | None  # the GPU models a pod accepts; None: any


@dataclass(frozen=True)
class WholeShape:
    """Pods asking for `gpus` entire GPUs of one node, of a model in `products`."""

    gpus: int
    products: Products = None
    cpu_milli: int = 0
    memory_bytes: int = 0

    @property
    def milli(self) -> int:
        """The milli this shape adds to the allocation when placed."""
        return self.gpus * MILLI_PER_GPU


@dataclass(frozen=True)
class ShareShape:
    """Pods asking for `milli` thousandths of one GPU, of a model in `products`."""

    milli: int
    products: Products = None
    cpu_milli: int = 0
    memory_bytes: int = 0


@dataclass(frozen=True, order=True)
class NodeType:
    """Nodes with `gpus` GPUs of model `product` and this CPU and memory."""

    product: str
    gpus: int
    cpu_milli: int = 0
    memory_bytes: int = 0

    @classmethod
    def of(cls, node: NodeFacts) -> NodeType:
        """The type of `node`."""
        return cls(node.gpu_product, node.gpu_count, node.cpu_milli, node.memory_bytes)


@dataclass(frozen=True)
class Instance:
    """Counts of each shape among the arrived pods and of each node type in the cluster."""

    wholes: dict[WholeShape, int]
    shares: dict[ShareShape, int]
    node_types: dict[NodeType, int]

    @property
    def gpus(self) -> int:
        """GPUs in the cluster."""
        return sum(t.gpus * n for t, n in self.node_types.items())


def accepts(products: Products, product: str) -> bool:
    """Whether a pod that accepts `products` may run on a GPU of model `product`."""
    return products is None or product in products


def shape_of(request: PodRequest) -> WholeShape | ShareShape | None:
    """The shape of a request; None for a pod without GPUs."""
    cpu, memory = request.cpu_milli, request.memory_bytes
    if request.kind == Kind.WHOLE:
        return WholeShape(request.gpus, request.allowed_products, cpu, memory)
    if request.kind == Kind.SHARE:
        return ShareShape(request.milli, request.allowed_products, cpu, memory)
    if request.kind == Kind.MIG:
        raise ValueError("the pattern LP has no MIG shapes (the openb traces have none)")
    return None


def build_instance(requests: Iterable[PodRequest], nodes: Sequence[NodeFacts]) -> Instance:
    """The instance of `requests` (the arrived pods) on `nodes`; nodes without GPUs are left out."""
    counts = Counter(shape for shape in map(shape_of, requests) if shape is not None)
    wholes = {s: n for s, n in counts.items() if isinstance(s, WholeShape)}
    shares = {s: n for s, n in counts.items() if isinstance(s, ShareShape)}
    types = Counter(NodeType.of(node) for node in nodes if node.gpu_count > 0)
    return Instance(
        dict(sorted(wholes.items(), key=lambda item: _key(item[0].gpus, item[0]))),
        dict(sorted(shares.items(), key=lambda item: _key(item[0].milli, item[0]))),
        dict(sorted(types.items())),
    )


def _key(size: int, shape: WholeShape | ShareShape) -> tuple[int, bool, tuple[str, ...], int, int]:
    """A stable order of shapes (the LP's rows): by size, the models they accept, CPU and memory."""
    products = shape.products
    return size, products is not None, tuple(sorted(products or ())), shape.cpu_milli, shape.memory_bytes
