"""Workload mixes: the task types fragmentation is measured against, with their probabilities.

FGD (ATC'23) measures a node's fragmentation as the GPU capacity that the *typical* tasks of the
workload could not use. FGD is handed that mix in advance (an oracle built from the whole trace);
`LearnedMix` learns it online from the requests it sees, as a production scheduler must.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass

import numpy as np

from gpupack.scoring.geometry import resolve_profile
from gpupack.scoring.request import Kind, PodRequest

MAX_TYPES = 64


@dataclass(frozen=True)
class TaskType:
    """One request shape of the workload (FGD's "typical pod": CPU, GPU share, GPU count, model)."""

    kind: Kind
    cpu_milli: int = 0
    memory_bytes: int = 0
    gpus: int = 0
    milli: int = 0
    mig_profile: str = ""
    allowed_products: frozenset[str] | None = None

    @staticmethod
    def of(request: PodRequest, with_memory: bool = False) -> TaskType:
        """The type of a request; a multi-profile MIG request counts as its first (largest) profile."""
        return TaskType(
            request.kind,
            request.cpu_milli,
            request.memory_bytes if with_memory else 0,
            request.gpus,
            request.milli,
            request.mig[0][0] if request.mig else "",
            request.allowed_products,
        )


class WorkloadMix:
    """A fixed set of task types with weights; `arrays` lays them out for the kernels."""

    def __init__(self, types: list[TaskType], weights: Iterable[float]) -> None:
        self.types = list(types)
        self.weights = np.asarray(list(weights), dtype=np.float64)
        self.version = 0

    def current(self) -> tuple[list[TaskType], np.ndarray]:
        """Types and weights normalised to sum to 1 (empty when the mix knows nothing)."""
        total = float(self.weights.sum())
        if total <= 0:
            return [], np.zeros(0)
        return self.types, self.weights / total

    def observe(self, request: PodRequest) -> None:
        """A fixed mix learns nothing."""

    def arrays(self, models: list, max_models: int) -> tuple:
        """Kernel arrays: (weight[T], [kind, cpu, mem, gpus, milli][T, 5], shape[T, M], allowed[T, M])."""
        types, weights = self.current()
        t = len(types)
        shape = np.full((t, max_models), -1, dtype=np.int64)
        allowed = np.zeros((t, max_models), dtype=np.bool_)
        for i, task in enumerate(types):
            for mid, model in enumerate(models):
                allowed[i, mid] = task.allowed_products is None or model.product in task.allowed_products
                if task.mig_profile and model.mig_family is not None:
                    with suppress(KeyError):  # the profile does not exist on this model
                        shape[i, mid] = resolve_profile(model.mig_family, task.mig_profile)[0]
        ints = np.array(
            [[int(task.kind), task.cpu_milli, task.memory_bytes, task.gpus, task.milli] for task in types],
            dtype=np.int64,
        ).reshape(t, 5)
        return weights.astype(np.float64), ints, shape, allowed


def empty_mix() -> WorkloadMix:
    """A mix with no types (for policies that ignore fragmentation)."""
    return WorkloadMix([], [])


def typical_mix(requests: Iterable[PodRequest], coverage: float = 0.95) -> WorkloadMix:
    """FGD's oracle: the most frequent shapes covering `coverage` of the requests, renormalised.

    Ties in frequency go to the larger shape first, as in the ATC'23 simulator.
    """
    counts = Counter(TaskType.of(r) for r in requests)
    total = sum(counts.values())
    ordered = sorted(
        counts.items(),
        key=lambda item: (item[1], item[0].cpu_milli, item[0].milli, item[0].gpus, _spec_key(item[0])),
        reverse=True,
    )
    chosen: list[tuple[TaskType, int]] = []
    covered = 0
    for task, count in ordered:
        if covered >= coverage * total:
            break
        chosen.append((task, count))
        covered += count
    return WorkloadMix([t for t, _ in chosen], [c for _, c in chosen])


def _spec_key(task: TaskType) -> str:
    return "|".join(sorted(task.allowed_products)) if task.allowed_products else ""


class LearnedMix(WorkloadMix):
    """A decayed histogram of the request shapes seen so far, over a small prior.

    Each observation adds weight 1 (plus `gpu_weight` per whole GPU it asks for, so rare large jobs
    still count; all of it times `whole_weight` for a whole-GPU request) to its shape after every older
    weight has decayed by 2^(-1/half_life), so the mix follows the workload as it drifts. The kernels
    get the most weighted shapes that cover `coverage` of the total (at most MAX_TYPES).
    """

    def __init__(
        self,
        prior: list[TaskType],
        prior_weight: float = 1.0,
        half_life: float = 2000.0,
        coverage: float = 0.95,
        refresh_every: int = 64,
        gpu_weight: float = 0.0,
        with_memory: bool = False,
        whole_weight: float = 1.0,
    ) -> None:
        super().__init__([], [])
        self._gpu_weight = gpu_weight
        self._whole_weight = whole_weight
        self._with_memory = with_memory
        self._decay = 0.5 ** (1.0 / half_life)
        self._scale = 1.0  # weights are stored divided by the accumulated decay
        self._counts: dict[TaskType, float] = {t: prior_weight / max(len(prior), 1) for t in prior}
        self._coverage = coverage
        self._refresh_every = refresh_every
        self._since_refresh = refresh_every
        self._refresh()

    def observe(self, request: PodRequest) -> None:
        """Count one request; the kernel view is refreshed every `refresh_every` observations."""
        self._scale /= self._decay
        key = TaskType.of(request, with_memory=self._with_memory)
        weight = 1.0
        if request.kind == Kind.WHOLE:
            weight = self._whole_weight * (1.0 + self._gpu_weight * request.gpus)
        self._counts[key] = self._counts.get(key, 0.0) + weight * self._scale
        if self._scale > 1e100:
            self._counts = {k: v / self._scale for k, v in self._counts.items() if v / self._scale > 1e-12}
            self._scale = 1.0
        self._since_refresh += 1
        if self._since_refresh >= self._refresh_every:
            self._refresh()

    def _refresh(self) -> None:
        self._since_refresh = 0
        ordered = sorted(self._counts.items(), key=lambda item: item[1], reverse=True)
        total = sum(v for _, v in ordered)
        chosen: set[TaskType] = set()
        covered = 0.0
        for task, weight in ordered[:MAX_TYPES]:
            if covered >= self._coverage * total:
                break
            chosen.add(task)
            covered += weight
        # types keep the order they were first seen in, so a refresh that only moves weights leaves
        # the kernel's per-node sums (one per type, by position) valid
        self.types = [task for task in self._counts if task in chosen]
        self.weights = np.asarray([self._counts[task] for task in self.types], dtype=np.float64)
        self.version += 1


def default_prior() -> list[TaskType]:
    """Shapes a GPU cluster commonly sees, so a fresh scheduler keeps room for each of them."""
    return [
        TaskType(Kind.WHOLE, gpus=1),
        TaskType(Kind.WHOLE, gpus=2),
        TaskType(Kind.WHOLE, gpus=4),
        TaskType(Kind.WHOLE, gpus=8),
        TaskType(Kind.SHARE, milli=250),
        TaskType(Kind.SHARE, milli=500),
        TaskType(Kind.MIG, mig_profile="1g.10gb"),
        TaskType(Kind.MIG, mig_profile="2g.20gb"),
        TaskType(Kind.MIG, mig_profile="3g.40gb"),
        TaskType(Kind.MIG, mig_profile="4g.40gb"),
        TaskType(Kind.MIG, mig_profile="7g.80gb"),
    ]
