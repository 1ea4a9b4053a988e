"""The priority protocol's bench (#28 item 3): gpupack's victim choice against kube-scheduler's counting.

`python -m gpupack.bench.preemption [--seeds 42-51] [--traces default,multigpu20] [--no-mig] [--out DIR]
[--workers 2] [--scale 1]` runs `sim.priority` for both choosers on every seed, on the openb traces (fgd order, the
gpu node list) and on the MIG-heavy mix (sim.churn's inference pods, drawn to `MIG_RATIO` x the GPUs of
the churn cluster: A100, H100 and H200 nodes in dynamic MIG mode), and writes DIR/preemption.md and
DIR/preemption.json (DIR: bench/results). `gpupack bench` puts preemption.md into REPORT.md as its
section 8 when it finds it there (`report_text.separate_runs_text`); this run never writes REPORT.md.

Each seed gives one paired difference per metric (gpupack − count, same submission order and the same
high-priority pods); a difference is better or worse only when the exact sign test gives p < 0.05
(`bench.paired`). The protocol has no weights and nothing here was tuned: the seeds are the report's.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpupack.bench.arm_report import arguments, report_tail, run_and_write, saved_runs, seeds_arg
from gpupack.bench.jobs import NODE_LIST, _nodes, _pods, pod_file
from gpupack.bench.markdown import Table, bullet_list, provenance
from gpupack.bench.paired import Paired, paired
from gpupack.sim.churn import inference_pods
from gpupack.sim.priority import Chooser, PriorityConfig, drawn_order, run_priority
from gpupack.sim.protocol import fgd_order
from gpupack.sim.scenarios import churn_cluster
from gpupack.sim.simulate import make_policy
from gpupack.sim.workload import Trace, TracePod, gpu_count, gpu_milli_capacity

OPENB_RATIO = 1.3  # the fgd protocol's: arrivals to 130 % of the GPUs, the last 30 % after the fill
MIG_RATIO = 2.0  # the MIG mix on the smaller churn cluster: more arrivals after the fill
MIG = "mig-inference"  # the report's name for the MIG-heavy workload
POLICY = "gpupack"  # places every pod in both runs; only the victim choice differs
MIG_NOTE = "sim.churn inference pods on the churn cluster (A100/H100/H200 x 8, dynamic MIG)"
# metric key, label, shown with decimals
METRICS = (
    ("evictions_per_placed_high", "evictions per placed high-priority pod", True),
    ("wasted_evictions", "wasted evictions", False),
    ("evictions", "evictions", False),
    ("high_pending", "high-priority pods pending", False),
)


@dataclass(frozen=True)
class PriorityJob:
    """One workload, one chooser, one seed."""

    traces_dir: str
    workload: str  # an openb trace variant (`default`, ...) or MIG
    chooser: str
    seed: int
    high_fraction: float = PriorityConfig.high_fraction
    node_limit: int | None = None  # first N openb nodes (tests)
    scale: float = 1.0  # the churn cluster's size (MIG)

    def trace_and_order(self) -> tuple[Trace, list[TracePod]]:
        if self.workload == MIG:
            nodes = churn_cluster().scaled(self.scale).build()
            pods = inference_pods()
            return Trace(nodes, pods), drawn_order(pods, gpu_count(nodes), self.seed, MIG_RATIO)
        nodes = list(_nodes(str(Path(self.traces_dir) / NODE_LIST)))[: self.node_limit]
        pods = list(_pods(str(Path(self.traces_dir) / pod_file(self.workload))))
        return Trace(nodes, pods), fgd_order(pods, gpu_milli_capacity(nodes), self.seed, OPENB_RATIO)

    def run(self) -> dict[str, object]:
        trace, order = self.trace_and_order()
        config = PriorityConfig(high_fraction=self.high_fraction)
        result = run_priority(trace, order, make_policy(POLICY, order), Chooser(self.chooser), self.seed, config)
        fields = {k: v for k, v in asdict(self).items() if k != "traces_dir"}
        return {**fields, "gpus_total": gpu_count(trace.nodes), "run": result.to_json()}


def build_jobs(traces_dir: str, workloads: Sequence[str], seeds: Sequence[int], **options: Any) -> list[PriorityJob]:
    """Every (workload, seed, chooser), gpupack's (the slower) first."""
    return [
        PriorityJob(traces_dir, workload, chooser, seed, **options)
        for chooser in (Chooser.GPUPACK, Chooser.COUNT)
        for workload in workloads
        for seed in seeds
    ]


# ----------------------------------------------------------------------------- the report
def _value(result: Mapping[str, Any], key: str) -> float:
    return float(result["run"][key])


def compare_workload(results: Sequence[Mapping[str, Any]]) -> dict[str, Paired]:
    """gpupack against count on each metric, paired by seed (lower is better on every one)."""
    by = {(r["chooser"], r["seed"]): r for r in results}
    seeds = sorted({int(r["seed"]) for r in results})
    out = {}
    for key, _, _ in METRICS:
        mine = {s: _value(by[(Chooser.GPUPACK.value, s)], key) for s in seeds if (Chooser.GPUPACK.value, s) in by}
        theirs = {s: _value(by[(Chooser.COUNT.value, s)], key) for s in seeds if (Chooser.COUNT.value, s) in by}
        out[key] = paired(mine, theirs, higher_is_better=False)
    return out


def per_seed_table(results: Sequence[Mapping[str, Any]]) -> Table:
    """One row per seed: the high-priority pods, then each chooser's placed, pending, evictions, wasted."""
    by = {(r["chooser"], r["seed"]): r["run"] for r in results}
    table = Table([
        "seed", "high-priority pods",
        "gpupack: placed", "pending", "evictions", "wasted", "evictions / placed",
        "count: placed", "pending", "evictions", "wasted", "evictions / placed",
    ])  # fmt: skip
    for seed in sorted({int(r["seed"]) for r in results}):
        mine, theirs = by.get((Chooser.GPUPACK.value, seed)), by.get((Chooser.COUNT.value, seed))
        if mine is None or theirs is None:
            continue
        row: list[object] = [seed, mine["high_submitted"]]
        for run in (mine, theirs):
            row += [run["high_placed"], run["high_pending"], run["evictions"], run["wasted_evictions"],
                    round(float(run["evictions_per_placed_high"]), 2)]  # fmt: skip
        table.add(*row)
    return table


def summary_table(comparisons: Mapping[str, Mapping[str, Paired]], results: Mapping[str, Sequence[Any]]) -> Table:
    """Per workload and metric: the medians of both choosers, the paired difference and the verdict."""
    table = Table(["workload", "metric", "gpupack (median)", "count (median)", "median difference",
                   "gpupack better / worse / equal seeds", "sign test p", "verdict"])  # fmt: skip
    for workload, by_metric in comparisons.items():
        for key, label, _ in METRICS:
            p = by_metric[key]
            table.add(
                workload, label,
                _median(results[workload], Chooser.GPUPACK, key), _median(results[workload], Chooser.COUNT, key),
                p.median_diff, p.counts(), round(p.p_value, 4), p.verdict,
            )  # fmt: skip
    return table


def _median(results: Sequence[Mapping[str, Any]], chooser: Chooser, key: str) -> float:
    return round(statistics.median(_value(r, key) for r in results if r["chooser"] == chooser.value), 2)


def goals(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """The issue's goals, checked seed by seed on every workload, as the report states them."""
    lines = []
    for workload, runs in results.items():
        by = {(r["chooser"], r["seed"]): r["run"] for r in runs}
        seeds = sorted({int(r["seed"]) for r in runs})
        pairs = [(s, by[(Chooser.GPUPACK.value, s)], by[(Chooser.COUNT.value, s)]) for s in seeds]
        wasted = [s for s, mine, _ in pairs if mine["wasted_evictions"]]
        fewer = sum(mine["evictions"] < theirs["evictions"] for _, mine, theirs in pairs)
        equal = sum(mine["evictions"] == theirs["evictions"] for _, mine, theirs in pairs)
        per_placed = sum(
            mine["evictions_per_placed_high"] < theirs["evictions_per_placed_high"] for _, mine, theirs in pairs
        )
        totals = {
            key: (sum(mine[key] for _, mine, _ in pairs), sum(theirs[key] for _, _, theirs in pairs))
            for key in ("high_placed", "evictions", "wasted_evictions")
        }
        lines.append(
            f"**{workload}**, over the {len(pairs)} seeds: gpupack placed {totals['high_placed'][0]} high-priority "
            f"pods with {totals['evictions'][0]} evictions ({totals['wasted_evictions'][0]} wasted); count placed "
            f"{totals['high_placed'][1]} with {totals['evictions'][1]} ({totals['wasted_evictions'][1]} wasted)."
        )
        lines.append(
            f"**{workload}**: gpupack wasted evictions on "
            + (f"seeds {', '.join(map(str, wasted))}" if wasted else f"no seed (0 on all {len(pairs)})")
            + f"; fewer evictions than count on {fewer} of {len(pairs)} seeds (equal on {equal}, more on "
            f"{len(pairs) - fewer - equal}); fewer evictions per placed high-priority pod on {per_placed} of "
            f"{len(pairs)}."
        )
    return lines


PAIRED_TITLE = "## Paired over the seeds (gpupack − count; lower is better on every metric)"


def render(
    results: Mapping[str, Sequence[Mapping[str, Any]]], info: Mapping[str, object], command: str
) -> tuple[str, dict[str, object]]:
    """preemption.md and the JSON beside it."""
    comparisons = {w: compare_workload(runs) for w, runs in results.items()}
    summary = summary_table(comparisons, results)
    seeds = sorted({int(r["seed"]) for runs in results.values() for r in runs})
    parts = [
        "# Preemption: gpupack's victim choice against kube-scheduler's counting (#28 item 3)",
        f"{provenance(command, 'preemption', 'priority', info)} Seeds {', '.join(map(str, seeds))}. The protocol "
        "has no weights and nothing was tuned on these seeds.",
        "**Protocol.** Pods arrive one at a time in the seeded order of each workload (openb: the fgd protocol's "
        f"order to {int(OPENB_RATIO * 100)} % of the GPUs; {MIG}: {MIG_NOTE}, drawn to {int(MIG_RATIO * 100)} %). "
        "Until the arrived demand reaches 100 % of the GPUs every pod is low priority (the fill); after it each "
        f"pod is high priority with probability {PriorityConfig.high_fraction}. A high-priority pod that fits "
        "nowhere preempts: the chooser picks a node and victims among its lower-priority pods; they are evicted "
        "at once and the pod is placed on that node by gpupack's rules, or not at all (then its victims are "
        "*wasted evictions*). One attempt per pod; evicted pods are not resubmitted. **gpupack**: "
        "`scoring.preemption.plan_victims` on each node, cheapest plan by `plan_cost`. **count**: kube-scheduler's "
        "DefaultPreemption: all lower-priority pods out, fit by counts (CPU, memory, pod slots, GPU capacity "
        "pooled per node: 1000 per GPU, compute slices on MIG nodes), reprieve most important first while the "
        "count fit holds; node by lowest top victim priority, priority sum, fewest victims. Both walk the nodes "
        "as DryRunPreemption does (seeded offset, up to max(10 %, 100) candidates). openb BE pods are "
        "interruptible (gpupack evicts those first; counting does not know the label); no PodDisruptionBudgets.",
        "## Goals (the issue's: zero wasted evictions for gpupack on every seed, fewer evictions than count on "
        "every seed)",
        bullet_list(goals(results)),
        *report_tail(summary, results, per_seed_table, PAIRED_TITLE),
    ]
    return "\n\n".join(parts) + "\n", saved_runs(info, command, summary, results)


def main(argv: Sequence[str] | None = None) -> int:
    from gpupack.bench.bench_report import default_traces_dir

    parser = arguments("preemption", __doc__ or "", "default")
    parser.add_argument("--no-mig", action="store_true", help="leave out the MIG-heavy workload")
    parser.add_argument("--scale", type=float, default=1.0, help="the MIG workload's churn cluster size")
    args = parser.parse_args(argv)
    workloads = [t for t in args.traces.split(",") if t] + ([] if args.no_mig else [MIG])
    traces = default_traces_dir()
    if any(w != MIG for w in workloads) and not (traces / NODE_LIST).is_file():
        print(f"bench.preemption: openb trace not found in {traces}", file=sys.stderr)
        return 2
    jobs = build_jobs(str(traces), workloads, seeds_arg(args.seeds), scale=args.scale)
    print(f"bench.preemption: {run_and_write('preemption', jobs, workloads, args, argv, render)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
