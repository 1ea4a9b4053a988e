"""One (trace, seed) of the limit: the pods arrived by 100 %, the pattern-LP bound and, when asked, an
offline packing checked placement by placement."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from gpupack.bench.limit.instance import build_instance
from gpupack.bench.limit.node_lp import NodeLp
from gpupack.bench.limit.packing import lay_out
from gpupack.bench.limit.pattern_lp import solve_bound
from gpupack.scoring.facts import NodeFacts
from gpupack.scoring.request import MILLI_PER_GPU, PodRequest

PACKING_MILP_SECONDS = 20.0


@dataclass(frozen=True)
class Limit:
    """Unallocated GPU % at arrived 100 %: at least `bound`; `packing` achieved offline (None: not run)."""

    bound: float
    lp: float
    packing: float | None
    packed_pods: int | None
    gpus: int
    shapes: int
    rounds: int
    columns: int
    seconds: float

    def to_json(self) -> dict[str, object]:
        """The JSON the bench keeps."""
        return {
            "bound_unallocated": round(self.bound, 4), "lp_unallocated": round(self.lp, 4),
            "packing_unallocated": None if self.packing is None else round(self.packing, 4),
            "packed_pods": self.packed_pods, "gpus_total": self.gpus, "shapes": self.shapes,
            "rounds": self.rounds, "columns": self.columns, "seconds": round(self.seconds, 2),
        }  # fmt: skip


def unallocated_pct(placed_milli: float, gpus: int) -> float:
    """Unallocated GPU % when `placed_milli` of `gpus` GPUs is allocated (a plain float, also for NumPy's)."""
    return float(100.0 - 100.0 * placed_milli / (gpus * MILLI_PER_GPU))


def limit_of(requests: Sequence[PodRequest], nodes: Sequence[NodeFacts], packing: bool) -> Limit:
    """The limit of placing `requests` (the pods arrived by 100 %) on `nodes`."""
    started = time.perf_counter()
    instance = build_instance(requests, nodes)
    bound = solve_bound(instance)
    packed: tuple[float, int] | None = None
    if packing:
        node_lp = NodeLp(instance, bound.gpu_patterns)
        node_lp.generate()
        offline = lay_out(requests, nodes, node_lp, node_lp.integer_choice(PACKING_MILP_SECONDS))
        packed = unallocated_pct(offline.placed_milli, instance.gpus), len(offline.placements)
    return Limit(
        bound=unallocated_pct(bound.bound_milli, instance.gpus),
        lp=unallocated_pct(bound.lp_milli, instance.gpus),
        packing=None if packed is None else packed[0],
        packed_pods=None if packed is None else packed[1],
        gpus=instance.gpus,
        shapes=len(instance.wholes) + len(instance.shares),
        rounds=bound.rounds,
        columns=bound.columns,
        seconds=time.perf_counter() - started,
    )
