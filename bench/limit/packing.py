"""An offline packing: the whole-node columns of `node_lp` laid onto the real nodes with the real pods.

Each node of a type takes one of the columns the integer program chose for the type: its whole-GPU pods
on the lowest free GPUs, then one GPU pattern per next free GPU, each slot filled with an arrived pod of
that shape (pods of a shape are alike). A last pass offers every pod still out to any room left (whole
GPUs first fit, shares best fit). Every placement is committed to the simulator's own inventory, which
refuses anything that does not fit, and is checked against the pod's GPU models; the placed milli is what
that inventory holds afterwards, not what the integer program says.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpupack.bench.limit.instance import NodeType, ShareShape, WholeShape, accepts, shape_of
from gpupack.bench.limit.node_lp import FullPattern, NodeLp
from gpupack.scoring.facts import GpuSlot, NodeFacts, Placement
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.request import MILLI_PER_GPU, PodRequest
from gpupack.sim.simulate import build_inventory, placement_gpus

Shape = WholeShape | ShareShape


@dataclass
class _Room:
    """What is still free on one node while the packing is laid out."""

    facts: NodeFacts
    cpu: int
    memory: int
    gpu_milli: list[int] = field(default_factory=list)  # free milli per GPU; a whole-GPU pod takes all 1000

    @classmethod
    def of(cls, facts: NodeFacts) -> _Room:
        return cls(facts, facts.cpu_milli, facts.memory_bytes, [MILLI_PER_GPU] * facts.gpu_count)

    def holds(self, request: PodRequest) -> bool:
        """Whether the request's CPU, memory and GPU model suit this node (its GPUs are checked apart)."""
        return (
            request.cpu_milli <= self.cpu
            and request.memory_bytes <= self.memory
            and accepts(request.allowed_products, self.facts.gpu_product)
        )

    def free_gpus(self) -> list[int]:
        """GPUs nothing uses yet."""
        return [g for g, milli in enumerate(self.gpu_milli) if milli == MILLI_PER_GPU]


@dataclass
class OfflinePacking:
    """Placements by pod index (into the arrived pods), and the GPU milli the inventory holds after them."""

    placements: dict[int, Placement]
    placed_milli: int


class _Layout:
    """The rooms, the pods still out by shape, and the inventory every placement is committed to."""

    def __init__(self, requests: Sequence[PodRequest], nodes: Sequence[NodeFacts]) -> None:
        self.requests = requests
        self.rooms = [_Room.of(node) for node in nodes if node.gpu_count > 0]
        self.inventory: Inventory = build_inventory(list(nodes))
        self.placements: dict[int, Placement] = {}
        self.waiting: dict[Shape, list[int]] = defaultdict(list)
        for i, request in enumerate(requests):
            shape = shape_of(request)
            if shape is not None:
                self.waiting[shape].append(i)

    def put(self, shape: Shape, room: _Room, gpus: Sequence[int]) -> None:
        """A waiting pod of `shape` onto `room`'s `gpus`, if one is left and fits."""
        queue = self.waiting.get(shape, [])
        if queue and room.holds(self.requests[queue[-1]]):
            self.place(queue.pop(), room, gpus)

    def place(self, i: int, room: _Room, gpus: Sequence[int]) -> None:
        """Commit pod i to `room` on `gpus` (its whole GPUs, or the one GPU of its share)."""
        request = self.requests[i]
        if not room.holds(request):
            raise AssertionError(f"pod {i} does not fit node {room.facts.name}")
        share = request.milli
        placement = Placement(room.facts.name, tuple(GpuSlot(g, milli=share) for g in gpus),
                              request.cpu_milli, request.memory_bytes)  # fmt: skip
        self.inventory.commit(placement)  # raises when the GPUs (or anything else) do not fit
        room.cpu -= request.cpu_milli
        room.memory -= request.memory_bytes
        for g in gpus:
            room.gpu_milli[g] -= share or MILLI_PER_GPU
        self.placements[i] = placement


def lay_out(requests: Sequence[PodRequest], nodes: Sequence[NodeFacts], lp: NodeLp,
            chosen: dict[FullPattern, int]) -> OfflinePacking:  # fmt: skip
    """Place `requests` on `nodes` after the chosen columns of `lp`, then offer what is left anywhere."""
    layout = _Layout(requests, nodes)
    by_type: dict[NodeType, list[_Room]] = defaultdict(list)
    for room in layout.rooms:
        by_type[NodeType.of(room.facts)].append(room)
    for node_type, rooms in by_type.items():
        columns = [p for p, n in chosen.items() if p.node_type == node_type for _ in range(n)]
        for room, column in zip(rooms, columns, strict=False):
            _fill(layout, room, lp, column)
    _place_the_rest(layout)
    placed = round(sum(placement_gpus(layout.inventory, p) for p in layout.placements.values()) * MILLI_PER_GPU)
    return OfflinePacking(layout.placements, placed)


def _fill(layout: _Layout, room: _Room, lp: NodeLp, column: FullPattern) -> None:
    """The column's whole-GPU pods (largest first) on the lowest free GPUs, then a GPU per GPU pattern."""
    for shape, count in sorted(zip(lp.wholes, column.wholes, strict=True), key=lambda sc: -sc[0].gpus):
        for _ in range(count):
            free = room.free_gpus()
            if len(free) >= shape.gpus:
                layout.put(shape, room, free[: shape.gpus])
    pool = lp.pools[column.node_type]
    for gpu_pattern, count in zip(pool, column.gpus, strict=True):
        for _ in range(count):
            free = room.free_gpus()
            for share, pods in zip(lp.shares, gpu_pattern.shares, strict=True):
                for _ in range(pods if free else 0):
                    layout.put(share, room, free[:1])


def _place_the_rest(layout: _Layout) -> None:
    """Offer every pod still out, largest GPU ask first, the first room that takes it (best fit on shares)."""
    rest = sorted(((shape, i) for shape, queue in layout.waiting.items() for i in queue), key=lambda si: -si[0].milli)
    for shape, i in rest:
        spot = _spot_for(layout, shape, layout.requests[i])
        if spot is not None:
            layout.waiting[shape].remove(i)
            layout.place(i, spot[0], spot[1])


def _spot_for(layout: _Layout, shape: Shape, request: PodRequest) -> tuple[_Room, list[int]] | None:
    """Where `request` fits now: whole GPUs on the first node with enough, or the fullest GPU for a share."""
    best: tuple[int, _Room, list[int]] | None = None
    for room in layout.rooms:
        if not room.holds(request):
            continue
        if isinstance(shape, WholeShape):
            free = room.free_gpus()
            if len(free) >= shape.gpus:
                return room, free[: shape.gpus]
            continue
        for g, milli in enumerate(room.gpu_milli):
            if milli >= shape.milli and (best is None or milli < best[0]):
                best = (milli, room, [g])
    return None if best is None else (best[1], best[2])
