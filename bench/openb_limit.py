"""The limit in the openb section: the pattern-LP bound per trace and seed (bench.limit), the offline
packing where it ran, and every policy's gap to the bound, paired seed by seed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpupack.bench.markdown import Table
from gpupack.bench.paired import PerSeed, spread
from gpupack.bench.sections import Result, group, median

BOUND = "bound_unallocated"
PACKING = "packing_unallocated"


def limit_by_trace(limits: Sequence[Result], key: str = BOUND) -> dict[str, dict[int, float | None]]:
    """`key` of each limit job, by trace and seed."""
    out: dict[str, dict[int, float | None]] = {}
    for (trace,), results in group(limits, "trace").items():
        out[str(trace)] = {int(r["seed"]): _float(r.get(key)) for r in results}
    return out


def _float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def gaps(values: PerSeed, bound: PerSeed) -> dict[int, float | None]:
    """A policy's unallocated % minus the bound, seed by seed (None where either is missing)."""
    return {
        seed: None if v is None or bound.get(seed) is None else v - bound[seed]  # type: ignore[operator]
        for seed, v in values.items()
    }


def limit_table(
    values: Mapping[str, Mapping[str, PerSeed]], limits: Sequence[Result], policies: Sequence[str]
) -> Table:
    """Per trace: the limit (median bound and its seed spread), the offline packing, each policy's median
    gap to the limit (median over seeds of policy − bound, the same seed)."""
    bounds, packings = limit_by_trace(limits), limit_by_trace(limits, PACKING)
    table = Table(["trace", "limit (bound)", "limit IQR", "offline packing", *[f"{p} gap" for p in policies]])
    for trace, by_policy in values.items():
        bound = bounds.get(trace, {})
        if not bound:
            continue
        table.add(
            trace, median(bound.values()), spread(bound.values()), median(packings.get(trace, {}).values()),
            *[median(gaps(by_policy[p], bound).values()) if p in by_policy else None for p in policies],
        )  # fmt: skip
    return table


def limit_seed_table(values: Mapping[str, Mapping[str, PerSeed]], limits: Sequence[Result]) -> Table:
    """Every trace and seed: the bound, the offline packing, gpupack and fgd, and their gaps."""
    bounds, packings = limit_by_trace(limits), limit_by_trace(limits, PACKING)
    table = Table(["trace", "seed", "bound", "offline packing", "gpupack", "gpupack gap", "fgd", "fgd gap"])
    for trace, bound in bounds.items():
        by_policy = values.get(trace, {})
        mine, fgd = by_policy.get("gpupack", {}), by_policy.get("fgd", {})
        for seed, value in sorted(bound.items()):
            table.add(
                trace, seed, _round(value), _round(packings.get(trace, {}).get(seed)),
                _round(mine.get(seed)), _round(_minus(mine.get(seed), value)),
                _round(fgd.get(seed)), _round(_minus(fgd.get(seed), value)),
            )  # fmt: skip
    return table


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2) + 0.0  # + 0.0: no "-0.0" in the report
