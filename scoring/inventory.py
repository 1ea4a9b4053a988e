"""The cluster's GPU inventory as flat numpy arrays (struct of arrays), the kernels' only input.

Node i owns GPU rows i*MAX_GPUS .. i*MAX_GPUS + gpu_count[i] - 1, so adding, updating or removing
a node and committing or releasing a placement touch O(GPUs of that node) entries. Removed nodes
leave a free row that the next added node reuses.

GPU models (product, memory) get small ids the kernels index by. An id is held by the nodes of that
model and freed with the last of them, so a cluster whose products change over time never runs out
of the MAX_MODELS - 1 ids (#13); `models_version` changes whenever an id is given or freed, so
whatever is cached per model id is rebuilt.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupack.errors import GpupackError
from gpupack.scoring.facts import GpuSlot, MigMode, NodeFacts, Placement
from gpupack.scoring.geometry import (
    PLACEMENT_ID,
    SHAPE_COMPUTE,
    SHAPE_SIZE,
    SHAPES,
    MigFamily,
    resolve_profile,
    slice_bits,
)
from gpupack.scoring.gpu_models import GpuModel, lookup_model
from gpupack.scoring.layout import MAX_GPUS
from gpupack.scoring.names import NameIndex
from gpupack.scoring.request import MILLI_PER_GPU

MAX_MODELS = 64
NO_MODEL = 0  # model id of nodes without GPUs
FREE_MODEL = GpuModel("", 0, None)  # what a free model id (and NO_MODEL) stands for


class InventoryError(GpupackError, ValueError):
    """Facts or placements that would make the inventory inconsistent; the inventory is unchanged."""


class Inventory:
    """Free and used capacity of every node and GPU, kept as arrays for the scoring kernels."""

    def __init__(self, capacity: int = 64) -> None:
        self.models: list[GpuModel] = [FREE_MODEL]
        self._model_ids: dict[tuple[str, int], int] = {}
        self._model_nodes = np.zeros(MAX_MODELS, dtype=np.int64)  # nodes holding each model id
        self._free_model_ids: list[int] = []
        self.models_version = 0  # changes whenever a model id is given out or freed
        self.model_memory = np.zeros(MAX_MODELS, dtype=np.float64)
        self.model_slices = np.zeros(MAX_MODELS, dtype=np.int8)  # 0: not MIG-capable
        self.model_compute = np.full(MAX_MODELS, 7, dtype=np.int64)  # compute slices of a whole GPU
        self.names: list[str | None] = []
        self.index: dict[str, int] = {}
        self.facts: list[NodeFacts | None] = []
        self._free_rows: list[int] = []
        self._version_clock = 0
        self.layout_version = 0  # changes whenever a name moves to or from a row
        self._name_index: tuple[int, NameIndex] | None = None
        self._allowed: dict[frozenset[str] | None, tuple[int, np.ndarray]] = {}  # model_ids_for's answers
        self._classes: dict[tuple, int] = {}  # a node's class key (`_class_key`) -> its NODE_CLASS id
        self.storage_version = 0  # changes whenever the arrays are reallocated (views of them go stale)
        self._allocate(capacity)

    # ----------------------------------------------------------------- storage
    def _allocate(self, capacity: int) -> None:
        g = capacity * MAX_GPUS
        self.node_active = np.zeros(capacity, dtype=np.bool_)
        self.node_cpu_cap = np.zeros(capacity, dtype=np.int64)
        self.node_cpu_free = np.zeros(capacity, dtype=np.int64)
        self.node_mem_cap = np.zeros(capacity, dtype=np.int64)
        self.node_mem_free = np.zeros(capacity, dtype=np.int64)
        self.node_pods_cap = np.zeros(capacity, dtype=np.int64)
        self.node_pods_free = np.zeros(capacity, dtype=np.int64)
        self.node_model = np.zeros(capacity, dtype=np.int32)
        self.node_mig_mode = np.zeros(capacity, dtype=np.int8)
        self.node_gpu_count = np.zeros(capacity, dtype=np.int32)
        self.node_spot = np.zeros(capacity, dtype=np.bool_)
        self.node_price = np.full(capacity, np.nan, dtype=np.float64)
        # bumped on every change of a node, so kernels can cache per-node sums
        self.node_version = np.zeros(capacity, dtype=np.int64)
        self.node_class = np.zeros(capacity, dtype=np.int64)  # same class: same hardware, capacity and price
        # pods by GPU tag (0: shares, k: pods of k whole GPUs), for the GpuClustering baseline
        self.node_tags = np.zeros(capacity * (MAX_GPUS + 1), dtype=np.int32)
        self.gpu_milli_free = np.zeros(g, dtype=np.int32)  # 1000 = untouched
        self.gpu_whole = np.zeros(g, dtype=np.bool_)  # taken whole by one pod
        self.gpu_slices = np.zeros(g, dtype=np.int32)  # dynamic MIG: occupied memory-slice mask
        self.gpu_compute = np.zeros(g, dtype=np.int32)  # dynamic MIG: compute slices in use
        # media-extension (+me) instances: dynamic MIG, 1 while the GPU holds one (at most one fits);
        # static MIG, the placement-id mask of the layout's +me instances (only +me requests take them)
        self.gpu_me = np.zeros(g, dtype=np.int32)
        # dynamic MIG: memory slices where an instance starts, so a release names one whole instance
        self.gpu_starts = np.zeros(g, dtype=np.int32)
        self.gpu_static = np.zeros(g, dtype=np.int32)  # static MIG: placement-id mask of instances
        self.gpu_static_used = np.zeros(g, dtype=np.int32)  # static MIG: instances in use
        self.gpu_numa = np.zeros(g, dtype=np.int32)
        self.gpu_link = np.zeros(g * MAX_GPUS, dtype=np.int32)  # row g: NVLink count to each peer
        self.storage_version += 1

    def _grow(self) -> None:
        old = {name: value for name, value in vars(self).items() if isinstance(value, np.ndarray)}
        capacity = len(self.node_active)
        self._allocate(capacity * 2)
        for name, value in old.items():
            if name.startswith(("node_", "gpu_")):
                getattr(self, name)[: len(value)] = value
            else:
                setattr(self, name, value)

    @property
    def class_count(self) -> int:
        """Node classes given out so far (NODE_CLASS ids are below it)."""
        return len(self._classes)

    def _classify(self, row: int) -> None:
        """Give row `row` the class of every node with the same hardware, capacity, price and spot: the
        kernels score one pristine node of a class for all of them."""
        facts = self.facts[row]
        assert facts is not None
        gpus = slice(row * MAX_GPUS, (row + 1) * MAX_GPUS)
        static = int(self.node_mig_mode[row]) == MigMode.STATIC
        model = self.models[int(self.node_model[row])]
        key = (
            model.product, model.memory_mib, int(self.node_mig_mode[row]), int(self.node_gpu_count[row]),
            facts.spot, facts.hourly_cost, facts.cpu_milli, facts.memory_bytes, facts.pods,
            self.gpu_static[gpus].tobytes(), self.gpu_me[gpus].tobytes() if static else b"",
            self.gpu_numa[gpus].tobytes(), self.gpu_link[gpus.start * MAX_GPUS : gpus.stop * MAX_GPUS].tobytes(),
        )  # fmt: skip
        self.node_class[row] = self._classes.setdefault(key, len(self._classes))

    @property
    def size(self) -> int:
        """Rows in use or reusable (the kernels iterate 0..size-1 and skip inactive rows)."""
        return len(self.names)

    def name_index(self) -> NameIndex:
        """The node names laid out for byte-level lookups, rebuilt after a node is added or removed."""
        if self._name_index is None or self._name_index[0] != self.layout_version:
            self._name_index = (self.layout_version, NameIndex(self.names))
        return self._name_index[1]

    def _touch(self, row: int) -> None:
        """Give the node a version no row has had before (kernels cache per-node sums by it)."""
        self._version_clock += 1
        self.node_version[row] = self._version_clock

    def gpu_rows(self, node: int) -> slice:
        """Rows of the GPU arrays that belong to a node."""
        return slice(node * MAX_GPUS, node * MAX_GPUS + int(self.node_gpu_count[node]))

    # ----------------------------------------------------------------- models
    def model_id(self, product: str, memory_mib: int = 0) -> int:
        """Id of a GPU product (registered on first sight, in a freed id when there is one)."""
        if not product:
            return NO_MODEL
        key = (product, memory_mib)
        found = self._model_ids.get(key)
        if found is not None:
            return found
        if not self._free_model_ids and len(self.models) >= MAX_MODELS:
            raise InventoryError(f"more than {MAX_MODELS - 1} GPU products in one cluster")
        model = lookup_model(product, memory_mib or None)
        if self._free_model_ids:
            mid = self._free_model_ids.pop()
            self.models[mid] = model
        else:
            mid = len(self.models)
            self.models.append(model)
        self._model_ids[key] = mid
        self._describe_model(mid, model)
        return mid

    def _describe_model(self, mid: int, model: GpuModel) -> None:
        """Fill the kernels' per-model arrays for id `mid` and announce the change."""
        self.model_memory[mid] = model.memory_mib
        self.model_slices[mid] = model.mig_family.slices if model.mig_family else 0
        self.model_compute[mid] = model.mig_family.compute_total if model.mig_family else 7
        self.models_version += 1

    def _release_model(self, mid: int) -> None:
        """One node fewer holds model `mid`; the last one frees the id."""
        self._model_nodes[mid] -= 1
        if mid == NO_MODEL or self._model_nodes[mid] > 0:
            return
        self._model_ids = {key: i for key, i in self._model_ids.items() if i != mid}
        self.models[mid] = FREE_MODEL
        self._describe_model(mid, FREE_MODEL)
        self._free_model_ids.append(mid)

    def model_ids_for(self, products: frozenset[str] | None) -> np.ndarray:
        """Boolean mask over model ids allowed by a product constraint (None allows all); the same array
        for the same constraint while the model table is unchanged, so it must not be written to."""
        held = self._allowed.get(products)
        if held is not None and held[0] == self.models_version:
            return held[1]
        allowed = np.full(MAX_MODELS, products is None, dtype=np.bool_)
        for mid, model in enumerate(self.models):
            if products is not None and model.product in products:
                allowed[mid] = True
        if len(self._allowed) >= 256:  # constraints seen long ago are dropped
            self._allowed.clear()
        self._allowed[products] = (self.models_version, allowed)
        return allowed

    # ----------------------------------------------------------------- nodes
    def add_node(self, facts: NodeFacts) -> int:
        """Add a node with nothing allocated; returns its row. Raises InventoryError on bad facts."""
        if facts.name in self.index:
            raise InventoryError(f"node {facts.name} already exists")
        gpu_state = self._gpu_state_for(facts)  # validates before anything is touched
        try:
            model = self.model_id(facts.gpu_product, facts.gpu_memory_mib) if facts.gpu_count else NO_MODEL
        except InventoryError as exc:
            raise InventoryError(f"node {facts.name}: {exc}") from None
        self._model_nodes[model] += 1
        if self._free_rows:
            row = self._free_rows.pop()
            self.names[row] = facts.name
            self.facts[row] = facts
        else:
            if len(self.names) >= len(self.node_active):
                self._grow()
            row = len(self.names)
            self.names.append(facts.name)
            self.facts.append(facts)
        self.index[facts.name] = row
        self.layout_version += 1
        self._touch(row)
        self.node_active[row] = True
        self.node_cpu_cap[row] = self.node_cpu_free[row] = facts.cpu_milli
        self.node_mem_cap[row] = self.node_mem_free[row] = facts.memory_bytes
        self.node_pods_cap[row] = self.node_pods_free[row] = facts.pods
        self.node_model[row] = model
        self.node_mig_mode[row] = int(facts.mig_mode) if facts.gpu_count else 0
        self.node_gpu_count[row] = facts.gpu_count
        self.node_spot[row] = facts.spot
        self.node_price[row] = facts.hourly_cost if facts.hourly_cost is not None else np.nan
        self.node_tags[row * (MAX_GPUS + 1) : (row + 1) * (MAX_GPUS + 1)] = 0
        base = row * MAX_GPUS
        static, static_me, numa, links = gpu_state
        span = slice(base, base + MAX_GPUS)
        self.gpu_milli_free[span] = 0
        self.gpu_milli_free[base : base + facts.gpu_count] = MILLI_PER_GPU
        for arr in (
            self.gpu_whole, self.gpu_slices, self.gpu_compute, self.gpu_starts, self.gpu_static_used
        ):
            arr[span] = 0
        self.gpu_static[span] = static
        self.gpu_me[span] = static_me
        self.gpu_numa[span] = numa
        self.gpu_link[base * MAX_GPUS : (base + MAX_GPUS) * MAX_GPUS] = links
        self._classify(row)
        return row

    def _gpu_state_for(self, facts: NodeFacts) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(static instances, their +me subset, NUMA nodes, NVLink matrix) per GPU; InventoryError if bad."""
        count = facts.gpu_count
        if not 0 <= count <= MAX_GPUS:
            raise InventoryError(f"node {facts.name}: {count} GPUs is out of range 0..{MAX_GPUS}")
        for value, what in ((facts.cpu_milli, "cpu"), (facts.memory_bytes, "memory"), (facts.pods, "pods")):
            if value < 0:
                raise InventoryError(f"node {facts.name}: negative {what} capacity")
        static = np.zeros(MAX_GPUS, dtype=np.int32)
        static_me = np.zeros(MAX_GPUS, dtype=np.int32)
        if facts.mig_mode == MigMode.STATIC and count:
            family = lookup_model(facts.gpu_product).mig_family
            if family is None:
                raise InventoryError(f"node {facts.name}: product {facts.gpu_product!r} has no MIG")
            for gpu, instances in facts.mig_layout.items():
                if not 0 <= gpu < count:
                    raise InventoryError(f"node {facts.name}: mig-layout names GPU {gpu} of {count}")
                used = 0
                compute = 0
                for profile, start in instances:
                    try:
                        shape, is_me = resolve_profile(family, profile)
                    except KeyError:
                        raise InventoryError(
                            f"node {facts.name}: MIG profile {profile!r} does not exist on {family.name}"
                        ) from None
                    pid = PLACEMENT_ID.get((shape, start))
                    bits = slice_bits(int(SHAPE_SIZE[shape]), start) if pid is not None else 0
                    if pid is None or used & bits:
                        raise InventoryError(f"node {facts.name}: GPU {gpu} cannot hold {profile}@{start}")
                    used |= bits
                    compute += int(SHAPE_COMPUTE[shape])
                    static[gpu] |= 1 << pid
                    if is_me:
                        static_me[gpu] |= 1 << pid
                if compute > family.compute_total:
                    raise InventoryError(f"node {facts.name}: GPU {gpu} layout exceeds its compute slices")
        numa = np.zeros(MAX_GPUS, dtype=np.int32)
        if facts.numa is not None:
            if len(facts.numa) != count:
                raise InventoryError(f"node {facts.name}: topology numa has {len(facts.numa)} entries")
            numa[:count] = facts.numa
        links = np.zeros(MAX_GPUS * MAX_GPUS, dtype=np.int32)
        if facts.nvlink is not None:
            matrix = facts.nvlink
            if len(matrix) != count or any(len(row) != count for row in matrix):
                raise InventoryError(f"node {facts.name}: NVLink matrix is not {count}x{count}")
            for i, row in enumerate(matrix):
                for j, value in enumerate(row):
                    if value < 0 or value > 64:
                        raise InventoryError(f"node {facts.name}: NVLink count {value} out of range")
                    if i != j:
                        links[i * MAX_GPUS + j] = value
        return static, static_me, numa, links

    def update_node(self, facts: NodeFacts) -> None:
        """Change a node's CPU, memory, pod slots, capacity type or price, keeping what is allocated.

        Raises InventoryError (and changes nothing) when the GPUs changed (count, product, MIG mode,
        layout, topology: remove and re-add the node instead) or the new capacity is below what is in use.
        """
        row = self.index.get(facts.name)
        if row is None:
            raise InventoryError(f"node {facts.name} is unknown")
        old = self.facts[row]
        assert old is not None
        gpu_fields = ("gpu_product", "gpu_count", "gpu_memory_mib", "mig_mode", "mig_layout", "nvlink", "numa")
        if any(getattr(old, f) != getattr(facts, f) for f in gpu_fields):
            raise InventoryError(f"node {facts.name}: GPUs changed; remove and re-add the node")
        used = (
            self.node_cpu_cap[row] - self.node_cpu_free[row],
            self.node_mem_cap[row] - self.node_mem_free[row],
            self.node_pods_cap[row] - self.node_pods_free[row],
        )
        if facts.cpu_milli < used[0] or facts.memory_bytes < used[1] or facts.pods < used[2]:
            raise InventoryError(f"node {facts.name}: new capacity is below what is allocated")
        self.node_cpu_cap[row], self.node_cpu_free[row] = facts.cpu_milli, facts.cpu_milli - used[0]
        self.node_mem_cap[row], self.node_mem_free[row] = facts.memory_bytes, facts.memory_bytes - used[1]
        self.node_pods_cap[row], self.node_pods_free[row] = facts.pods, facts.pods - used[2]
        self.node_spot[row] = facts.spot
        self.node_price[row] = facts.hourly_cost if facts.hourly_cost is not None else np.nan
        self.facts[row] = facts
        self._classify(row)
        self._touch(row)

    def remove_node(self, name: str) -> None:
        """Forget a node and everything allocated on it."""
        row = self.index.pop(name)
        self.layout_version += 1
        self._release_model(int(self.node_model[row]))
        self.node_active[row] = False
        self.node_gpu_count[row] = 0
        self.names[row] = None
        self.facts[row] = None
        self._free_rows.append(row)

    def node_is_empty(self, row: int) -> bool:
        """True when nothing is allocated on the node."""
        rows = self.gpu_rows(row)
        return bool(
            self.node_cpu_free[row] == self.node_cpu_cap[row]
            and self.node_mem_free[row] == self.node_mem_cap[row]
            and self.node_pods_free[row] == self.node_pods_cap[row]
            and np.all(self.gpu_milli_free[rows] == MILLI_PER_GPU)
            and not self.gpu_whole[rows].any()
            and not self.gpu_slices[rows].any()
            and not self.gpu_static_used[rows].any()
        )

    def hourly_price(self, row: int) -> float:
        """The node's price in $/h; 0.0 when it has none."""
        price = float(self.node_price[row])
        return 0.0 if np.isnan(price) else price

    # ----------------------------------------------------------------- placements
    def commit(self, placement: Placement) -> None:
        """Take the placement's capacity. Raises InventoryError (and changes nothing) if it does not fit."""
        row = self.index.get(placement.node)
        if row is None:
            raise InventoryError(f"node {placement.node} is unknown")
        if placement.cpu_milli > self.node_cpu_free[row]:
            raise InventoryError(f"node {placement.node}: not enough CPU")
        if placement.memory_bytes > self.node_mem_free[row]:
            raise InventoryError(f"node {placement.node}: not enough memory")
        if self.node_pods_free[row] < placement.pod_slots:
            raise InventoryError(f"node {placement.node}: no pod slot left")
        changes = self._slot_changes(row, placement, taking=True)
        self.node_cpu_free[row] -= placement.cpu_milli
        self.node_mem_free[row] -= placement.memory_bytes
        self.node_pods_free[row] -= placement.pod_slots
        self._apply(changes)
        self._touch(row)
        tag = _gpu_tag(placement)
        if tag >= 0:
            self.node_tags[row * (MAX_GPUS + 1) + tag] += 1

    def release(self, placement: Placement) -> None:
        """Give back what `commit(placement)` took. Raises InventoryError if it was not taken."""
        row = self.index.get(placement.node)
        if row is None:
            raise InventoryError(f"node {placement.node} is unknown")
        if (
            self.node_cpu_free[row] + placement.cpu_milli > self.node_cpu_cap[row]
            or self.node_mem_free[row] + placement.memory_bytes > self.node_mem_cap[row]
            or self.node_pods_free[row] + placement.pod_slots > self.node_pods_cap[row]
        ):
            raise InventoryError(f"node {placement.node}: releasing more than is allocated")
        changes = self._slot_changes(row, placement, taking=False)
        self.node_cpu_free[row] += placement.cpu_milli
        self.node_mem_free[row] += placement.memory_bytes
        self.node_pods_free[row] += placement.pod_slots
        self._apply(changes)
        self._touch(row)
        tag = _gpu_tag(placement)
        if tag >= 0:
            self.node_tags[row * (MAX_GPUS + 1) + tag] -= 1

    def _apply(self, changes: list[tuple[np.ndarray, slice, np.ndarray]]) -> None:
        for array, rows, values in changes:
            array[rows] = values

    def _slot_changes(self, row: int, placement: Placement, taking: bool) -> list[tuple[np.ndarray, slice, np.ndarray]]:
        """The array writes a placement makes (the node's GPUs, whole), checked on a scratch copy of them."""
        rows = self.gpu_rows(row)
        # shares and whole GPUs change only free milli and the whole flag: the MIG arrays are passed
        # as they are (nothing writes them) and not written back
        mig = any(slot.mig for slot in placement.slots)
        copies = _GpuCopies(
            milli=self.gpu_milli_free[rows].copy(),
            whole=self.gpu_whole[rows].copy(),
            slices=self.gpu_slices[rows].copy() if mig else self.gpu_slices[rows],
            compute=self.gpu_compute[rows].copy() if mig else self.gpu_compute[rows],
            me=self.gpu_me[rows].copy() if mig else self.gpu_me[rows],
            starts=self.gpu_starts[rows].copy() if mig else self.gpu_starts[rows],
            static_used=self.gpu_static_used[rows].copy() if mig else self.gpu_static_used[rows],
            static=self.gpu_static[rows],
            mode=MigMode(int(self.node_mig_mode[row])),
            family=self.models[int(self.node_model[row])].mig_family,
            where=f"node {placement.node}",
            taking=taking,
        )
        count = int(self.node_gpu_count[row])
        for slot in placement.slots:
            if not 0 <= slot.index < count:
                raise InventoryError(f"{copies.where}: GPU {slot.index} does not exist")
            if slot.mig:
                copies.change_mig(slot)
            elif slot.milli:
                copies.change_share(slot)
            else:
                copies.change_whole(slot.index)
        if not mig:
            return [(self.gpu_milli_free, rows, copies.milli), (self.gpu_whole, rows, copies.whole)]
        return [
            (self.gpu_milli_free, rows, copies.milli),
            (self.gpu_whole, rows, copies.whole),
            (self.gpu_slices, rows, copies.slices),
            (self.gpu_compute, rows, copies.compute),
            (self.gpu_me, rows, copies.me),
            (self.gpu_starts, rows, copies.starts),
            (self.gpu_static_used, rows, copies.static_used),
        ]

    def free_slots(self, name: str) -> tuple[GpuSlot, ...]:
        """Slots that take every bit of GPU capacity still free on a node (what a bound pod whose
        request gpupack cannot read is charged): untouched GPUs whole, the rest of a shared GPU as a
        share, free static MIG instances, and the free slices of a dynamic-MIG GPU as 1g instances."""
        row = self.index[name]
        facts = self.facts[row]
        assert facts is not None
        family = self.models[int(self.node_model[row])].mig_family
        slots: list[GpuSlot] = []
        for g in range(int(self.node_gpu_count[row])):
            slots.extend(self._free_slots_of_gpu(row * MAX_GPUS + g, g, facts, family))
        return tuple(slots)

    def _free_slots_of_gpu(self, i: int, g: int, facts: NodeFacts, family: MigFamily | None) -> list[GpuSlot]:
        """The free capacity of GPU `g` (array row `i`) as slots; see `free_slots`."""
        if self.gpu_whole[i]:
            return []
        if self.gpu_static[i] and family is not None:
            used = int(self.gpu_static_used[i])
            return [
                GpuSlot(g, mig=profile, start=start)
                for profile, start in facts.mig_layout.get(g, ())
                if not used >> PLACEMENT_ID[(resolve_profile(family, profile)[0], start)] & 1
            ]
        if self.gpu_slices[i] and family is not None:
            profile, shape = min(family.profiles.items(), key=lambda item: SHAPE_SIZE[item[1]])
            compute_left = family.compute_total - int(self.gpu_compute[i])
            free_starts = [s for s in SHAPES[shape].starts if not int(self.gpu_slices[i]) >> s & 1]
            return [GpuSlot(g, mig=profile, start=start) for start in free_starts[: max(compute_left, 0)]]
        milli = int(self.gpu_milli_free[i])
        if milli == MILLI_PER_GPU:
            return [GpuSlot(g)]
        return [GpuSlot(g, milli=milli)] if milli else []

    # ----------------------------------------------------------------- read-outs
    def gpus_total(self) -> int:
        """GPUs on active nodes."""
        return int(self.node_gpu_count[: self.size][self.node_active[: self.size]].sum())


def _is_instance(slices: int, starts: int, start: int, size: int) -> bool:
    """Whether memory slices [start, start + size) hold exactly one instance: it starts there, no
    other starts inside, and the slice after it is free or starts the next one."""
    inside = slice_bits(size, start)
    after = 1 << (start + size)
    return (
        slices & inside == inside
        and starts & inside == 1 << start
        and (not slices & after or bool(starts & after))
    )


def _gpu_tag(placement: Placement) -> int:
    """GpuClustering's pod tag: 0 for a share, k for k whole GPUs, -1 for MIG, no GPU or a mix of kinds."""
    kinds = {(bool(slot.mig), bool(slot.milli)) for slot in placement.slots}
    if len(kinds) != 1 or placement.slots[0].mig:
        return -1
    return 0 if placement.slots[0].milli else len(placement.slots)


def _state(taking: bool) -> str:
    return "in use" if taking else "free"



@dataclass
class _GpuCopies:
    """Scratch copies of one node's GPU arrays that a placement's slots are taken from (`taking`) or
    given back to, one slot at a time; each change is checked first and raises InventoryError."""

    milli: np.ndarray
    whole: np.ndarray
    slices: np.ndarray
    compute: np.ndarray
    me: np.ndarray
    starts: np.ndarray
    static_used: np.ndarray
    static: np.ndarray  # read only: the static MIG layout
    mode: MigMode
    family: MigFamily | None
    where: str  # "node NAME", for the errors
    taking: bool

    def change_mig(self, slot: GpuSlot) -> None:
        """Take or give back one MIG instance."""
        g, where = slot.index, self.where
        if self.mode == MigMode.NONE or self.family is None:
            raise InventoryError(f"{where}: MIG is not enabled")
        try:
            shape, is_me = resolve_profile(self.family, slot.mig)
        except KeyError:
            raise InventoryError(f"{where}: MIG profile {slot.mig} unknown on {self.family.name}") from None
        pid = PLACEMENT_ID.get((shape, slot.start))
        if pid is None:
            raise InventoryError(f"{where}: {slot.mig} cannot start at slice {slot.start}")
        if self.mode == MigMode.STATIC:
            bit = 1 << pid
            if not self.static[g] & bit or bool(self.me[g] & bit) != is_me:
                raise InventoryError(f"{where}: GPU {g} has no {slot.mig}@{slot.start} instance")
            if bool(self.static_used[g] & bit) == self.taking:
                raise InventoryError(f"{where}: GPU {g} {slot.mig}@{slot.start} already {_state(self.taking)}")
            self.static_used[g] ^= bit
        elif self.taking:
            self._take_dynamic(slot, shape, is_me)
        else:
            self._give_back_dynamic(slot, shape, is_me)

    def _take_dynamic(self, slot: GpuSlot, shape: int, is_me: bool) -> None:
        g = slot.index
        bits = slice_bits(int(SHAPE_SIZE[shape]), slot.start)
        compute = int(SHAPE_COMPUTE[shape])
        if self.whole[g] or self.milli[g] != MILLI_PER_GPU or self.slices[g] & bits:
            raise InventoryError(f"{self.where}: GPU {g} slices for {slot.mig}@{slot.start} are in use")
        assert self.family is not None  # change_mig checked
        if self.compute[g] + compute > self.family.compute_total or (is_me and self.me[g]):
            raise InventoryError(f"{self.where}: GPU {g} has no room for {slot.mig}")
        self.slices[g] |= bits
        self.compute[g] += compute
        self.me[g] |= is_me
        self.starts[g] |= 1 << slot.start

    def _give_back_dynamic(self, slot: GpuSlot, shape: int, is_me: bool) -> None:
        g = slot.index
        if not _is_instance(int(self.slices[g]), int(self.starts[g]), slot.start, int(SHAPE_SIZE[shape])):
            raise InventoryError(f"{self.where}: GPU {g} {slot.mig}@{slot.start} is not allocated")
        self.slices[g] &= ~slice_bits(int(SHAPE_SIZE[shape]), slot.start)
        self.compute[g] -= int(SHAPE_COMPUTE[shape])
        self.starts[g] &= ~(1 << slot.start)
        if is_me:
            self.me[g] = 0

    def change_share(self, slot: GpuSlot) -> None:
        """Take or give back a share of one GPU."""
        g, where = slot.index, self.where
        if not 1 <= slot.milli <= 999:
            raise InventoryError(f"{where}: share {slot.milli} out of range")
        if self.whole[g] or self.slices[g] or self.static[g]:
            raise InventoryError(f"{where}: GPU {g} is not shareable")
        if self.taking:
            if self.milli[g] < slot.milli:
                raise InventoryError(f"{where}: GPU {g} has {self.milli[g]} milli free, not {slot.milli}")
            self.milli[g] -= slot.milli
        else:
            if self.milli[g] + slot.milli > MILLI_PER_GPU:
                raise InventoryError(f"{where}: GPU {g} share {slot.milli} is not allocated")
            self.milli[g] += slot.milli

    def change_whole(self, g: int) -> None:
        """Take or give back GPU g whole."""
        if self.taking:
            if self.whole[g] or self.milli[g] != MILLI_PER_GPU or self.slices[g] or self.static[g]:
                raise InventoryError(f"{self.where}: GPU {g} is not free")
            self.whole[g] = True
            self.milli[g] = 0
        else:
            if not self.whole[g]:
                raise InventoryError(f"{self.where}: GPU {g} is not allocated whole")
            self.whole[g] = False
            self.milli[g] = MILLI_PER_GPU
