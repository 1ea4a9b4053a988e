"""The engine: one call decides where a request goes, by running a policy's kernel over the inventory.

Outside `scoring`, only `scoring.decider.Decider` calls `Engine.decide` (it adds the tie order and the
random policy's noise); the extender's filter, the simulator, `explain` and the report all decide
through it. Benchmarks of the raw kernel time the engine directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from gpupack.scoring import kernels as k
from gpupack.scoring.facts import GpuSlot, Placement
from gpupack.scoring.geometry import FAMILIES, resolve_profile
from gpupack.scoring.inventory import MAX_GPUS, MAX_MODELS, Inventory
from gpupack.scoring.layout import (
    FIRST_UNRESOLVABLE,
    N_REQ,
    N_VERDICTS,
    REQ_CPU,
    REQ_GPUS,
    REQ_INSTANCES,
    REQ_INTERRUPTIBLE,
    REQ_KIND,
    REQ_MEMORY,
    REQ_MILLI,
    SCRATCH_GPU,
    SCRATCH_UNUSABLE,
)
from gpupack.scoring.mix import WorkloadMix
from gpupack.scoring.policies import PolicySpec
from gpupack.scoring.request import Kind, PodRequest, RequestError

VERDICT_REASONS: dict[int, str] = {
    k.NOT_CANDIDATE: "not a candidate",
    k.NO_CPU: "not enough free CPU",
    k.NO_MEMORY: "not enough free memory",
    k.NO_POD_SLOT: "no free pod slot",
    k.MODEL_NOT_ALLOWED: "GPU model not allowed by the pod's node selector / affinity",
    k.NO_GPU: "not enough free GPU capacity",
    k.NO_MIG: "no free MIG placement for the requested profile",
    k.SPOT_FORBIDDEN: "spot node and the pod is not interruptible",
    # unresolvable: `Decision.unresolvable` says what exactly the node lacks
    k.NOT_MIG: "the node has no MIG",
    k.NO_PROFILE: "the node's GPU model has no such MIG profile",
    k.TOO_FEW_GPUS: "the node has fewer GPUs than the pod asks for",
}


def reason_texts(feasible: str) -> tuple[str, ...]:
    """The reason of each verdict code, `feasible` for OK (a feasible node that was not chosen)."""
    return tuple(feasible if code == k.OK else VERDICT_REASONS.get(code, "") for code in range(N_VERDICTS))


def unresolvable_reason(inventory: Inventory, arrays: RequestArrays, row: int, code: int) -> str:
    """What inventory row `row` lacks for the request, for a verdict from FIRST_UNRESOLVABLE on (#18)."""
    model = inventory.models[int(inventory.node_model[row])]
    count = int(inventory.node_gpu_count[row])
    if count == 0:
        return "the node has no GPU"
    if code == k.TOO_FEW_GPUS:
        return f"the node has {count} GPU{'s' if count > 1 else ''}, the pod asks for {arrays.request.gpus}"
    family = model.mig_family
    if family is None:
        return f"{model.product or 'its GPU model'} has no MIG"
    if code == k.NOT_MIG:
        return f"MIG is not enabled on this {model.product} node"
    missing = next((p for p in arrays.instances if not _has_profile(family, p)), "")
    profiles = ", ".join(sorted(family.profiles, key=_profile_order))
    return f"{model.product} has no MIG profile {missing} (its profiles: {profiles})"


@dataclass
class Decision:
    """The chosen node and placement (None when nothing fits), with every node's verdict and score."""

    placement: Placement | None
    candidates: np.ndarray  # bool per inventory row: the rows the verdicts and scores refer to
    verdicts: np.ndarray  # per inventory row: NOT_CANDIDATE for every row outside `rows`
    scores: np.ndarray
    names: list[str | None]
    context: tuple[Inventory, RequestArrays] | None = None  # what `unresolvable` words its reasons from

    @property
    def node(self) -> str | None:
        return self.placement.node if self.placement else None

    @cached_property
    def rows(self) -> np.ndarray:
        """The candidates' inventory rows (a simulator never asks, so it is found on first use)."""
        return np.flatnonzero(self.candidates)

    def reasons(self) -> dict[str, str]:
        """Why each infeasible candidate was rejected, by node name (not the unresolvable ones)."""
        rows, codes = self.verdict_rows(feasible=False)
        return {self.names[row]: VERDICT_REASONS[code] for row, code in zip(rows.tolist(), codes.tolist(), strict=True)}

    def verdict_rows(self, feasible: bool, besides: int = -1) -> tuple[np.ndarray, np.ndarray]:
        """(rows, verdicts) of the candidates other than row `besides`: the infeasible ones but the
        unresolvable, and the feasible ones too (verdict OK) when `feasible`."""
        keep = (self.verdicts != k.NOT_CANDIDATE) & (self.verdicts < FIRST_UNRESOLVABLE)
        if not feasible:
            keep &= self.verdicts != k.OK
        if besides >= 0:
            keep[besides] = False
        rows = np.flatnonzero(keep)
        return rows, self.verdicts[rows]

    def unresolvable(self) -> dict[str, str]:
        """The candidates no preemption can make room on, by node name, with what each lacks."""
        rows = np.flatnonzero(self.verdicts >= FIRST_UNRESOLVABLE)
        if not rows.size:
            return {}
        texts: dict[tuple[int, int, int], str] = {}  # by (model, verdict, GPUs): such nodes read alike
        reasons: dict[str, str] = {}
        for row in rows.tolist():
            code = int(self.verdicts[row])
            if self.context is None:
                reasons[self.names[row]] = VERDICT_REASONS[code]  # type: ignore[index]  # a row with a verdict is named
                continue
            inventory, arrays = self.context
            key = (int(inventory.node_model[row]), code, int(inventory.node_gpu_count[row]))
            if key not in texts:
                texts[key] = unresolvable_reason(inventory, arrays, row, code)
            reasons[self.names[row]] = texts[key]  # type: ignore[index]  # a row with a verdict is named
        return reasons

    def feasible_scores(self) -> dict[str, float]:
        """Score of every feasible candidate, by node name."""
        feasible = self.rows[self.verdicts[self.rows] == k.OK].tolist()
        return {self.names[row]: float(self.scores[row]) for row in feasible}

    def score_of(self, row: int) -> float | None:
        """The score of one inventory row, None when it was not feasible."""
        return float(self.scores[row]) if self.verdicts[row] == k.OK else None


class RequestArrays:
    """A request laid out for the kernels (depends on the inventory's GPU models)."""

    def __init__(self, request: PodRequest, inventory: Inventory) -> None:
        self.request = request
        self.instances: list[str] = []  # MIG profile of each instance, largest first
        for profile, count in request.mig:
            self.instances.extend([profile] * count)
        self.instances.sort(key=_profile_order, reverse=True)
        n_inst = len(self.instances)
        self.scalars = np.zeros(N_REQ, dtype=np.int64)
        self.scalars[REQ_KIND] = int(request.kind)
        self.scalars[REQ_CPU] = request.cpu_milli
        self.scalars[REQ_MEMORY] = request.memory_bytes
        self.scalars[REQ_GPUS] = request.gpus
        self.scalars[REQ_MILLI] = request.milli
        self.scalars[REQ_INTERRUPTIBLE] = int(request.interruptible)
        self.scalars[REQ_INSTANCES] = n_inst
        self.shapes, self.me = _NO_SHAPES, _NO_ME  # read only by the kernels: shared while no MIG is asked
        if n_inst:
            self.shapes, self.me = _mig_shapes(self.instances, inventory)
        self.allowed = inventory.model_ids_for(request.allowed_products)
        self.width = max(n_inst, request.gpus, 1)
        # the kernel's `request` tuple (scoring.layout.REQUEST_*)
        self.kernel = (self.scalars, self.shapes, self.me, self.allowed)


_NO_SHAPES = np.full((1, MAX_MODELS), -1, dtype=np.int64)
_NO_ME = np.zeros(1, dtype=np.bool_)


def _mig_shapes(instances: list[str], inventory: Inventory) -> tuple[np.ndarray, np.ndarray]:
    """(shape id per instance and model id, -1 where the model lacks the profile; +me per instance)."""
    shapes = np.full((len(instances), MAX_MODELS), -1, dtype=np.int64)
    me = np.zeros(len(instances), dtype=np.bool_)
    for q, profile in enumerate(instances):
        if not any(_has_profile(family, profile) for family in FAMILIES.values()):
            raise RequestError(f"MIG profile {profile!r} exists on no known GPU model")
        me[q] = profile.endswith("+me")
        for mid, model in enumerate(inventory.models):
            if model.mig_family is not None and _has_profile(model.mig_family, profile):
                shapes[q, mid] = resolve_profile(model.mig_family, profile)[0]
    return shapes, me


def _empty_sums(nodes: int, types: int) -> tuple[np.ndarray, ...]:
    """The kernel's per-node cache, all invalid, in the order of `scoring.layout.CACHE_*` (the weights
    version, its last column, is added by `Engine.sums_cache`)."""
    return (
        np.full(nodes, -1, dtype=np.int64),
        np.zeros((nodes, types), dtype=np.int64),
        np.zeros((nodes, types), dtype=np.int64),
        np.zeros(nodes, dtype=np.float64),
        np.full(nodes, -1, dtype=np.int64),
        np.zeros(nodes, dtype=np.int64),
        np.zeros(nodes, dtype=np.int64),
        np.zeros(nodes, dtype=np.int64),
        np.zeros((nodes, MAX_GPUS + 1), dtype=np.int64),
        np.full((nodes, MAX_GPUS + 1), -1.0, dtype=np.float64),
        np.zeros(nodes, dtype=np.bool_),
    )


def _empty_memo(nodes: int) -> tuple[np.ndarray, ...]:
    """`schedule`'s per-node memo, all invalid: its per-node columns `scoring.layout.MEMO_STAMP` ..
    `MEMO_SCORE` (`Engine.memo` adds the current epoch and maxima, and the class memo)."""
    return (
        np.full(nodes, -1, dtype=np.int64),
        np.full(nodes, -1, dtype=np.int64),
        np.zeros(nodes, dtype=np.int8),
        np.zeros(nodes, dtype=np.float64),
    )


def _empty_class_memo(classes: int) -> tuple[np.ndarray, ...]:
    """`schedule`'s per-class memo, all invalid: `scoring.layout.MEMO_CLASS_EPOCH` .. `MEMO_CLASS_SCORE`."""
    return (
        np.full(classes, -1, dtype=np.int64),
        np.zeros(classes, dtype=np.int8),
        np.zeros(classes, dtype=np.float64),
    )


def _has_profile(family, profile: str) -> bool:
    try:
        resolve_profile(family, profile)
    except KeyError:
        return False
    return True


def _profile_order(profile: str) -> tuple[int, str]:
    head = profile.split("g.", 1)[0]
    return (int(head) if head.isdigit() else 0, profile)


class Engine:
    """Runs one policy over one inventory.

    An engine keeps per-node caches and the kernel's working arrays between calls, so one engine
    decides one request at a time (the extender's ClusterState calls it under its lock).
    """

    def __init__(self, inventory: Inventory, policy: PolicySpec) -> None:
        self.inventory = inventory
        self.policy = policy
        self._mix_cache: tuple[tuple[WorkloadMix, int, int], tuple] | None = None
        self._sums_cache = _empty_sums(0, 0)
        self._weights_version = 0
        self._scratch: tuple[np.ndarray, ...] | None = None
        self._memo = _empty_memo(0)
        self._class_memo = _empty_class_memo(0)
        self._memo_epoch = np.zeros(1, dtype=np.int64)  # the current epoch, and the maxima it was for
        self._memo_maxima = np.full(2, np.nan)
        self._memo_key: tuple[RequestArrays, tuple] | None = None
        self._last_arrays: tuple[PodRequest, int, RequestArrays] | None = None
        self._defaults = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64))  # rank, noise
        # the kernel's argument tuples as views of the arrays above and the inventory's, kept while the
        # key beside each holds and dropped when the arrays they view are remade: building them is most
        # of a decision's Python time
        self._inputs: tuple[tuple, tuple[tuple, tuple, tuple]] | None = None
        self._sums_view: tuple[tuple, tuple] | None = None
        self._memo_view: tuple[int, tuple] | None = None

    def mix_arrays(self) -> tuple:
        """The policy mix as kernel arrays, rebuilt only when the mix or the model table changed."""
        key = (self.policy.mix, self.policy.mix.version, self.inventory.models_version)  # the mix by identity
        if self._mix_cache is None or self._mix_cache[0] != key:
            arrays = self.policy.mix.arrays(self.inventory.models, MAX_MODELS)
            old = self._mix_cache[1] if self._mix_cache else None
            # the cached sums depend on the task types, not on their weights
            if old is None or not all(np.array_equal(a, b) for a, b in zip(old[1:], arrays[1:], strict=True)):
                self._sums_cache = _empty_sums(self.inventory.size, len(arrays[0]))
                self._sums_view = None
            # a refresh that leaves the weights as they were (a steady workload) keeps every node's
            # fragmentation and the memo valid
            if old is None or not all(np.array_equal(a, b) for a, b in zip(old, arrays, strict=True)):
                self._weights_version += 1
            self._mix_cache = (key, arrays)
        return self._mix_cache[1]

    def sums_cache(self, types: int) -> tuple:
        """Per-node fragmentation sums kept between calls; grows with the inventory."""
        n = self.inventory.size
        stamp, sums = self._sums_cache[0], self._sums_cache[1]
        if len(stamp) < n or sums.shape[1] != types:
            self._sums_cache = _empty_sums(max(n, 2 * len(stamp)), types)
            self._sums_view = None
        key = (n, self._weights_version)
        if self._sums_view is None or self._sums_view[0] != key:
            self._sums_view = (key, (*(array[:n] for array in self._sums_cache), self._weights_version))
        return self._sums_view[1]

    def request_arrays(self, request: PodRequest) -> RequestArrays:
        """`request` laid out for the kernels; the last one is kept (pods often come in runs of one shape)."""
        models = self.inventory.models_version  # model ids are given out and freed: a stale layout is wrong
        held = self._last_arrays
        if held is None or held[0] != request or held[1] != models:
            held = self._last_arrays = (request, models, RequestArrays(request, self.inventory))
        return held[2]

    def memo(self, arrays: RequestArrays) -> tuple:
        """`schedule`'s memo; a new epoch when the request, the policy, the mix weights or the model
        table changed since the last call (call `mix_arrays` first)."""
        inventory = self.inventory
        n = inventory.size
        if len(self._memo[0]) < n:
            self._memo = _empty_memo(max(n, 2 * len(self._memo[0])))
            self._memo_view = None
        if len(self._class_memo[0]) < inventory.class_count:
            self._class_memo = _empty_class_memo(max(inventory.class_count, 2 * len(self._class_memo[0])))
            self._memo_view = None
        policy = self.policy
        # `arrays` is remade whenever the request or the model table changes (`request_arrays`)
        key = (policy.rules.tobytes(), policy.params.tobytes(), self._weights_version)
        if self._memo_key is None or self._memo_key[0] is not arrays or self._memo_key[1] != key:
            self._memo_key = (arrays, key)
            self._memo_epoch[0] += 1
        if self._memo_view is None or self._memo_view[0] != n:
            per_node = tuple(array[:n] for array in self._memo)
            self._memo_view = (n, (*per_node, self._memo_epoch, self._memo_maxima, *self._class_memo))
        return self._memo_view[1]

    def scratch(self, types: int, width: int) -> tuple[np.ndarray, ...]:
        """The kernel's working arrays, remade only when the mix or the request width outgrows them."""
        held = self._scratch
        if held is None or held[SCRATCH_UNUSABLE].shape[1] != types or held[SCRATCH_GPU].shape[0] < width:
            held = self._scratch = k.make_scratch(types, max(width, MAX_GPUS))
        return held

    def kernel_inputs(self) -> tuple[tuple, tuple, tuple]:
        """(node arrays, GPU arrays, model arrays) as the kernels take them (`scoring.layout`: NODE_*,
        GPU_*, MODEL_*): views of the inventory's arrays, remade when it grows."""
        inv = self.inventory
        key = (inv.size, inv.storage_version)
        if self._inputs is None or self._inputs[0] != key:
            self._inputs = (key, _inventory_views(inv))
        return self._inputs[1]

    def candidate_mask(self, candidates: Sequence[str] | np.ndarray | None) -> np.ndarray:
        """Rows allowed by the caller: every active node when None, a boolean mask over the inventory's
        rows as it is, else the rows of the names (unknown names are ignored)."""
        n = self.inventory.size
        if candidates is None:
            return self.inventory.node_active[:n].copy()
        if isinstance(candidates, np.ndarray):
            return candidates
        mask = np.zeros(n, dtype=np.bool_)
        get = self.inventory.index.get
        rows = np.fromiter((get(name, -1) for name in candidates), dtype=np.int64, count=len(candidates))
        mask[rows[rows >= 0]] = True
        return mask

    def decide(
        self,
        request: PodRequest,
        candidates: Sequence[str] | np.ndarray | None = None,
        rank: np.ndarray | None = None,
        noise: np.ndarray | None = None,
    ) -> Decision:
        """Where `request` should go among `candidates`, without changing the inventory.

        `rank` orders tied nodes (lowest first; default: inventory row order); `noise` in [0, 1)
        per node drives the random policy's GPU choice.
        """
        arrays = self.request_arrays(request)
        n = self.inventory.size
        mask = self.candidate_mask(candidates)
        if rank is None or noise is None:
            if len(self._defaults[0]) != n:
                self._defaults = (np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.float64))
            rank = self._defaults[0] if rank is None else rank
            noise = self._defaults[1] if noise is None else noise
        scores = np.empty(n, dtype=np.float64)
        verdicts = np.empty(n, dtype=np.int8)
        best_gpu = np.zeros(arrays.width, dtype=np.int32)
        best_start = np.zeros(arrays.width, dtype=np.int32)
        best_shape = np.zeros(arrays.width, dtype=np.int32)
        nodes, gpus, models = self.kernel_inputs()
        mix = self.mix_arrays()
        best, slots = k.schedule(
            nodes, gpus, models, arrays.kernel, mask, mix, self.policy.kernel_policy, rank, noise,
            self.sums_cache(len(mix[0])), self.memo(arrays), self.scratch(len(mix[0]), arrays.width),
            (scores, verdicts, best_gpu, best_start, best_shape),
        )  # fmt: skip
        placement = None
        if best >= 0:
            placement = self._placement(int(best), int(slots), arrays, best_gpu, best_start)
        names = self.inventory.names
        return Decision(placement, mask, verdicts, scores, names, (self.inventory, arrays))

    def _placement(
        self, row: int, slots: int, arrays: RequestArrays, gpu: np.ndarray, start: np.ndarray
    ) -> Placement:
        return build_placement(self.inventory, row, slots, arrays, gpu, start)

    def observe(self, request: PodRequest) -> None:
        """Tell a learning policy about a request it has been asked to place."""
        if self.policy.learns:
            self.policy.mix.observe(request)


def _inventory_views(inv: Inventory) -> tuple[tuple, tuple, tuple]:
    """The inventory's rows in use as the kernels' (nodes, gpus, models) tuples."""
    n = inv.size
    g = n * MAX_GPUS
    nodes = (
        inv.node_active[:n], inv.node_cpu_free[:n], inv.node_mem_free[:n], inv.node_pods_free[:n],
        inv.node_model[:n], inv.node_mig_mode[:n], inv.node_gpu_count[:n], inv.node_spot[:n],
        inv.node_price[:n], inv.node_cpu_cap[:n], inv.node_mem_cap[:n], inv.node_pods_cap[:n],
        inv.node_tags[: n * (MAX_GPUS + 1)], inv.node_version[:n], inv.node_class[:n],
    )  # fmt: skip
    gpus = (
        inv.gpu_milli_free[:g], inv.gpu_whole[:g], inv.gpu_slices[:g], inv.gpu_compute[:g], inv.gpu_me[:g],
        inv.gpu_static[:g], inv.gpu_static_used[:g], inv.gpu_numa[:g], inv.gpu_link[: g * MAX_GPUS],
    )  # fmt: skip
    return nodes, gpus, (inv.model_memory, inv.model_compute)


def build_placement(
    inventory: Inventory, row: int, slots: int, arrays: RequestArrays, gpu: np.ndarray, start: np.ndarray
) -> Placement:
    """The placement of `arrays.request` on inventory row `row`, from a kernel's chosen slots.

    `gpu[q]` and `start[q]` (q < `slots`) are the local GPU index and MIG start slice of slot q; MIG
    slots follow `arrays.instances`. Shared by `Engine.decide` and `scoring.reference`.
    """
    request = arrays.request
    name = inventory.names[row]
    assert name is not None
    if request.kind == Kind.MIG:
        chosen = tuple(
            GpuSlot(int(gpu[q]), mig=arrays.instances[q], start=int(start[q])) for q in range(slots)
        )
    elif request.kind == Kind.SHARE:
        chosen = (GpuSlot(int(gpu[0]), milli=request.milli),)
    elif request.kind == Kind.WHOLE:
        chosen = tuple(sorted((GpuSlot(int(gpu[q])) for q in range(slots)), key=lambda s: s.index))
    else:
        chosen = ()
    return Placement(name, chosen, request.cpu_milli, request.memory_bytes)
