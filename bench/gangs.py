"""The gang protocol's bench (#29 item 4): gpupack with gangs against pod-by-pod placement.

`python -m gpupack.bench.gangs [--seeds 42-51] [--traces default,multigpu50,gpushare40] [--nvl72 multigpu50]
[--out DIR] [--workers 2]` runs `sim.gangs` for both arms on every seed: on the openb cluster (the gpu node
list, as `bench.jobs` builds it) with each trace's pods, and on a synthetic GB200 NVL72 cluster (8 racks x 18
trays x 4 GPUs, one NVLink domain per rack) with the pods of the `--nvl72` trace. It writes DIR/gangs.md and
DIR/gangs.json (DIR: bench/results).

Each seed gives one paired difference per metric (gangs − pod-by-pod, the same jobs at the same times); a
difference is better or worse only when the exact sign test gives p < 0.05 (`bench.paired`), anything else
is a tie. The protocol has no weights and nothing here was tuned: the seeds are the report's.
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
from gpupack.scoring.facts import NodeFacts
from gpupack.sim.gangs import K_SIZES, K_WEIGHTS, Arm, GangConfig, gang_jobs, nvl72_nodes, run_gangs
from gpupack.sim.simulate import make_policy
from gpupack.sim.workload import gpu_count

NVL72 = "nvl72"  # workloads `nvl72/<trace>`: the trace's pods on the NVL72 cluster
POLICY = "gpupack"  # both arms place with it; only gangs or not differs
# metric key, label, higher is better
METRICS = (
    ("jobs_started", "jobs started", True),
    ("idle_gpu_hours", "GPU-hours held idle by partial jobs", False),
    ("wait_mean", "mean job wait (min)", False),
    ("wait_p95", "p95 job wait (min)", False),
    ("unallocated_pct", "unallocated GPU %", False),
    ("busy_pct", "GPUs running started jobs %", True),
    ("jobs_split", "started jobs split over NVLink domains", False),
)
ARMS = (Arm.GANGS, Arm.POD_BY_POD)
MINUTES = ("wait_mean", "wait_p95")  # the protocol counts hours; the report shows waits in minutes


@dataclass(frozen=True)
class GangJob:
    """One workload, one arm, one seed."""

    traces_dir: str
    workload: str  # an openb trace variant (`default`, ...) or `nvl72/<variant>`
    arm: str
    seed: int
    node_limit: int | None = None  # first N openb nodes (tests)
    racks: int = 8  # NVL72 racks
    horizon: float = GangConfig.horizon

    def nodes(self) -> list[NodeFacts]:
        if self.workload.startswith(f"{NVL72}/"):
            return nvl72_nodes(self.racks)
        return list(_nodes(str(Path(self.traces_dir) / NODE_LIST)))[: self.node_limit]

    def run(self) -> dict[str, object]:
        nodes = self.nodes()
        trace = self.workload.removeprefix(f"{NVL72}/")
        pods = list(_pods(str(Path(self.traces_dir) / pod_file(trace))))
        config = config_for(self.horizon)
        jobs = gang_jobs(pods, nodes, self.seed, config)
        result = run_gangs(nodes, jobs, make_policy(POLICY, pods), Arm(self.arm), self.seed, config)
        fields = {k: v for k, v in asdict(self).items() if k != "traces_dir"}
        return {**fields, "gpus_total": gpu_count(nodes), "run": result.to_json()}


def config_for(horizon: float) -> GangConfig:
    """The protocol's settings for a run to `horizon` hours (the warm-up at most half of it)."""
    return GangConfig(horizon=horizon, warmup=min(GangConfig.warmup, horizon / 2))


def build_jobs(traces_dir: str, workloads: Sequence[str], seeds: Sequence[int], **options: Any) -> list[GangJob]:
    """Every (workload, seed, arm)."""
    return [GangJob(traces_dir, w, arm.value, seed, **options) for w in workloads for seed in seeds for arm in ARMS]


# ----------------------------------------------------------------------------- the report
def _by_arm(results: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], Mapping[str, Any]]:
    return {(str(r["arm"]), int(r["seed"])): _run(r) for r in results}


def _run(result: Mapping[str, Any]) -> dict[str, Any]:
    """The run's metrics with the cluster's GPUs beside them."""
    return {**result["run"], "gpus_total": result["gpus_total"]}


def compare_workload(results: Sequence[Mapping[str, Any]]) -> dict[str, Paired]:
    """Gangs against pod-by-pod on each metric, paired by seed."""
    by = _by_arm(results)
    out = {}
    for key, _, higher in METRICS:
        mine = {s: _value(run, key) for (arm, s), run in by.items() if arm == Arm.GANGS.value}
        theirs = {s: _value(run, key) for (arm, s), run in by.items() if arm == Arm.POD_BY_POD.value}
        out[key] = paired(mine, theirs, higher_is_better=higher)
    return out


def per_seed_table(results: Sequence[Mapping[str, Any]]) -> Table:
    """One row per seed: the jobs arrived, then each arm's started, idle GPU-hours, waits and unallocated %."""
    by = _by_arm(results)
    shown = ("jobs_started", "idle_gpu_hours", "wait_mean", "wait_p95", "unallocated_pct")
    names = ["started", "GPU-h held idle by partial jobs", "mean wait (min)", "p95 wait (min)", "unallocated %"]
    columns = ["seed", "jobs arrived"]
    for arm in ARMS:
        columns += [f"{arm.value}: {names[0]}", *names[1:]]
    table = Table(columns)
    for seed in sorted({s for _, s in by}):
        runs = [by.get((arm.value, seed)) for arm in ARMS]
        if any(run is None for run in runs):
            continue
        row: list[object] = [seed, runs[0]["jobs_arrived"]]  # type: ignore[index]  # checked above
        for run in runs:
            row += [_shown(run, key) for key in shown]  # type: ignore[arg-type]
        table.add(*row)
    return table


def _value(run: Mapping[str, Any], key: str) -> float:
    """A run's metric in the report's unit; `busy_pct`: the GPUs neither free nor held idle by partial jobs."""
    if key == "busy_pct":
        return 100.0 - float(run["unallocated_pct"]) - 100.0 * float(run["mean_idle_gpus"]) / float(run["gpus_total"])
    return float(run[key]) * (60.0 if key in MINUTES else 1.0)


def _shown(run: Mapping[str, Any], key: str) -> object:
    value = run[key]
    return round(_value(run, key), 2) if isinstance(value, float) else value


def summary_table(comparisons: Mapping[str, Mapping[str, Paired]], results: Mapping[str, Sequence[Any]]) -> Table:
    """Per workload and metric: both arms' medians, the paired difference and the verdict."""
    table = Table(["workload", "metric", "gangs (median)", "pod-by-pod (median)", "median difference",
                   "gangs better / worse / equal seeds", "sign test p", "verdict"])  # fmt: skip
    for workload, by_metric in comparisons.items():
        for key, label, _ in METRICS:
            p = by_metric[key]
            table.add(
                workload, label, _median(results[workload], Arm.GANGS, key),
                _median(results[workload], Arm.POD_BY_POD, key), p.median_diff, p.counts(), round(p.p_value, 4),
                p.verdict,
            )  # fmt: skip
    return table


def _median(results: Sequence[Mapping[str, Any]], arm: Arm, key: str) -> float:
    return round(statistics.median(_value(_run(r), key) for r in results if r["arm"] == arm.value), 2)


def acceptance(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """The issue's acceptance, seed by seed: GPU-hours held by partial jobs, gangs beside pod-by-pod."""
    lines = []
    for workload, runs in results.items():
        by = _by_arm(runs)
        seeds = sorted({s for _, s in by})
        gangs = [float(by[(Arm.GANGS.value, s)]["idle_gpu_hours"]) for s in seeds]
        pods = [float(by[(Arm.POD_BY_POD.value, s)]["idle_gpu_hours"]) for s in seeds]
        held = [s for s, v in zip(seeds, gangs, strict=True) if v]
        lines.append(
            f"**{workload}**: gangs held GPUs idle for partial jobs on "
            + (f"seeds {', '.join(map(str, held))}" if held else f"no seed (0 GPU-hours on all {len(seeds)})")
            + f"; pod-by-pod held {min(pods):.1f} to {max(pods):.1f} GPU-hours (median "
            f"{statistics.median(pods):.1f}), more than 0 on {sum(v > 0 for v in pods)} of {len(seeds)} seeds."
        )
    return lines


def protocol_text(config: GangConfig) -> str:
    """The protocol in a paragraph, with its constants."""
    mix = ", ".join(f"{k}: {w}" for k, w in zip(K_SIZES, K_WEIGHTS, strict=True))
    return (
        "**Protocol** (`sim.gangs`). Each job is one GPU pod of the trace, drawn uniformly with replacement from "
        f"its name-sorted GPU pods (seeded); a whole-GPU pod becomes k identical members, k drawn with "
        f"probabilities {{{mix}}} (mean 2.6), a GPU-share pod stays one member; on the NVL72 cluster (4 GPUs "
        "a node) an 8-GPU pod is split into two 4-GPU members. Poisson arrivals at an offered load of "
        f"{config.load:g} x the cluster's GPUs (arriving GPU demand x duration), exponential durations of mean 1 h; "
        "a job runs once all its members are placed, then all leave together. Waiting jobs are retried in "
        "arrival order after every departure (no head-of-line blocking; within a pass, once a job does not "
        "fit the later jobs of its class — same member request, for gangs also the same k — wait for the next "
        "pass). **gangs**: the whole job by `scoring.gang.plan_gang` (smallest topology domain: NVLink clique, "
        "rack, zone, cluster) or nothing. **pod-by-pod**: each member on its own by `Decider.decide` (gpupack "
        "without gangs): placed members hold their GPUs, idle, until the job's last member is placed. Arrivals "
        f"run to the horizon, {config.horizon:g} h, where the run stops (a pod-by-pod deadlock ends with it); "
        f"the first {config.warmup:g} h fill the cluster and are not counted. Counted: jobs arriving in "
        f"[{config.warmup:g}, {config.horizon:g}) h and the time between: jobs started by the horizon, GPU-hours "
        "held by placed members of jobs not started, job wait from arrival to start (a job not started counts "
        "horizon − arrival, a lower bound; shown in minutes), unallocated GPU % time-averaged (shares count "
        "their fraction; a GPU held by a partial job is allocated), GPUs running started jobs % (100 − "
        "unallocated − held idle by partial jobs: the GPUs doing work), and started jobs whose members span "
        "more than one NVLink domain (the node's `nvidia.com/gpu.clique`, "
        "else the node itself)."
    )


PAIRED_TITLE = (
    "## Paired over the seeds (gangs − pod-by-pod; jobs started and GPUs running jobs: higher is better, the others: "
    "lower)"
)


def render(
    results: Mapping[str, Sequence[Mapping[str, Any]]], info: Mapping[str, object], command: str
) -> tuple[str, dict[str, object]]:
    """gangs.md and the JSON beside it."""
    comparisons = {w: compare_workload(runs) for w, runs in results.items()}
    summary = summary_table(comparisons, results)
    seeds = sorted({int(r["seed"]) for runs in results.values() for r in runs})
    clusters = ", ".join(f"{w}: {runs[0]['gpus_total']} GPUs" for w, runs in results.items() if runs)
    parts = [
        "# Gangs: all members or none, against pod-by-pod placement (#29 item 4)",
        f"{provenance(command, 'gangs', 'gangs', info)} Seeds {', '.join(map(str, seeds))}, the report's seeds: the "
        "protocol has no weights and nothing was tuned on them.",
        f"Clusters: openb traces on the openb GPU node list; `{NVL72}/<trace>`: the trace's pods on a synthetic "
        "GB200 NVL72 cluster (8 racks x 18 nodes x 4 GPUs, NVSwitch inside a node, each node labelled with its "
        f"rack as `nvidia.com/gpu.clique` and `gpupack.io/rack`). Sizes: {clusters}.",
        protocol_text(config_for(float(next(iter(results.values()))[0]["horizon"]))),
        "## Acceptance: GPUs held by partial jobs, per seed (the issue's: zero for gangs, pod-by-pod beside it)",
        bullet_list(acceptance(results)),
        *report_tail(summary, results, per_seed_table, PAIRED_TITLE),
    ]
    return "\n\n".join(parts) + "\n", saved_runs(info, command, summary, results)


def main(argv: Sequence[str] | None = None) -> int:
    from gpupack.bench.bench_report import default_traces_dir

    parser = arguments("gangs", __doc__ or "", "default,multigpu50,gpushare40")
    parser.add_argument("--nvl72", default="multigpu50", help="the openb variant run on the NVL72 cluster ('' none)")
    parser.add_argument("--node-limit", type=int, help="only the first N openb nodes (tests)")
    parser.add_argument("--racks", type=int, default=8, help="NVL72 racks")
    parser.add_argument("--horizon", type=float, default=GangConfig.horizon, help="hours (tests: shorter)")
    args = parser.parse_args(argv)
    workloads = [t for t in args.traces.split(",") if t] + ([f"{NVL72}/{args.nvl72}"] if args.nvl72 else [])
    traces = default_traces_dir()
    if not (traces / NODE_LIST).is_file():
        print(f"bench.gangs: openb trace not found in {traces}", file=sys.stderr)
        return 2
    options = {"node_limit": args.node_limit, "racks": args.racks, "horizon": args.horizon}
    jobs = build_jobs(str(traces), workloads, seeds_arg(args.seeds), **options)
    print(f"bench.gangs: {run_and_write('gangs', jobs, workloads, args, argv, render)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
