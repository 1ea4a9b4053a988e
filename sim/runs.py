"""`gpupack simulate`'s runs: a policy over a trace under a protocol and seeds, as the simulator JSON.

The protocols: `fgd` and `replay` (sim.simulate, one pod at a time) and `churn` (sim.churn, pods that
arrive and complete); docs/contracts.md#simulator-json gives the answer's keys.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

from gpupack.sim.churn import ChurnConfig, run_churn
from gpupack.sim.protocol import fgd_order, read_order_file, replay_order
from gpupack.sim.simulate import RunResult, make_policy, round_pct, run_once
from gpupack.sim.workload import Trace, gpu_count, gpu_milli_capacity


def simulate(
    trace: Trace,
    policy_name: str,
    protocol: str = "fgd",
    seeds: list[int] | None = None,
    ratio: float = 1.3,
    show_progress: bool = False,
    order_file: str | None = None,
    churn: ChurnConfig | None = None,
) -> dict[str, object]:
    """Run a policy over a trace with a protocol and seeds; the JSON object of docs/contracts.md#simulator-json.

    `order_file` (fgd protocol) replaces the seeded shuffle and inflation by a submission order read
    from a file, e.g. the published Go simulator's (`default_seed42_order.txt`), for an exact
    side-by-side check; the run's seed is then the first of `seeds` (it only orders ties).
    `replay` runs once, without a seed; `churn` (sim.churn) runs every seed with `churn`'s settings.
    """
    if protocol == "churn":
        return _simulate_churn(trace, policy_name, seeds or [42], churn or ChurnConfig())
    started = time.perf_counter()
    capacity_milli = gpu_milli_capacity(trace.nodes)
    runs: list[RunResult] = []
    seed_list: list[int | None] = list(seeds) if protocol == "fgd" and seeds else [None]
    if order_file is not None:
        seed_list = seed_list[:1]
    for seed in seed_list:
        if protocol == "fgd" and order_file is not None:
            order = read_order_file(order_file, trace.pods)
        elif protocol == "fgd":
            order = fgd_order(trace.pods, capacity_milli, int(seed or 0), ratio)
        else:
            order = replay_order(trace.pods)
        policy = make_policy(policy_name, order)
        runs.append(
            run_once(
                trace, order, policy, seed, keep_placements=protocol == "replay",
                progress=_progress_bar(policy_name, seed) if show_progress else None,
                ends_at_130=protocol == "fgd" and ratio >= 1.3,
            )
        )  # fmt: skip
        if show_progress:
            print(file=sys.stderr)
    unalloc_100 = [100.0 - r.alloc_pct_at_100 for r in runs if r.alloc_pct_at_100 is not None]
    unalloc_130 = [100.0 - r.alloc_pct_at_130 for r in runs if r.alloc_pct_at_130 is not None]
    return {
        "policy": policy_name,
        "protocol": protocol,
        "gpus_total": gpu_count(trace.nodes),
        "runs": [r.to_json(with_placements=protocol == "replay") for r in runs],
        "median": {
            "unallocated_pct_at_100": round_pct(statistics.median(unalloc_100)) if unalloc_100 else None,
            "unallocated_pct_at_130": round_pct(statistics.median(unalloc_130)) if unalloc_130 else None,
        },
        "pods_per_second": round(sum(r.pods_submitted for r in runs) / max(time.perf_counter() - started, 1e-9), 1),
        "seconds": round(time.perf_counter() - started, 3),
    }


def _simulate_churn(trace: Trace, policy_name: str, seeds: list[int], config: ChurnConfig) -> dict[str, object]:
    """`simulate` for the churn protocol: one run per seed, medians of the rejections."""
    started = time.perf_counter()
    runs = [run_churn(trace, make_policy(policy_name, trace.pods), seed, config) for seed in seeds]
    return {
        "policy": policy_name,
        "protocol": "churn",
        "gpus_total": gpu_count(trace.nodes),
        "churn": {"load": config.load, "warmup_lifetimes": config.warmup, "measured_lifetimes": config.measure},
        "runs": [r.to_json() for r in runs],
        "median": {
            "unallocated_pct_at_100": None,
            "unallocated_pct_at_130": None,
            "rejected": statistics.median(r.rejected for r in runs),
            "rejected_pct": statistics.median(r.summary()["rejected_pct"] for r in runs),
        },
        "pods_per_second": round(sum(r.pods_submitted for r in runs) / max(time.perf_counter() - started, 1e-9), 1),
        "seconds": round(time.perf_counter() - started, 3),
    }


def _progress_bar(label: str, seed: int | None) -> Callable[[int, int], None]:
    def show(done: int, total: int) -> None:
        width = 30
        filled = int(width * done / max(total, 1))
        print(f"\r{label} seed {seed}: [{'#' * filled}{'.' * (width - filled)}] {done}/{total}", end="",
              file=sys.stderr, flush=True)  # fmt: skip

    return show
