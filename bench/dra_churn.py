"""The DRA churn bench (#30 item 4): gpupack against kube-scheduler's DRA first fit, MIG churn on H100 nodes.

`python -m gpupack.bench.dra_churn [--seeds 42-51] [--out DIR] [--workers 2] [--nodes 32] [--load 0.95]
[--measure 6]` runs `sim.dra_churn` for both arms on every seed (the same arrivals for both) and writes
DIR/dra-churn.md and DIR/dra-churn.json (DIR: bench/results).

Each seed gives one paired difference per metric (gpupack − first fit); a difference is better or worse only
when the exact sign test gives p < 0.05 (`bench.paired`). The load and the cluster size were chosen on
seeds 0–41 (`sim.dra_churn.CONFIG`); the report's seeds are 42–51.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from gpupack.bench.arm_report import seeds_arg, write_report
from gpupack.bench.markdown import Table, bullet_list, provenance
from gpupack.bench.paired import Paired, paired
from gpupack.sim.churn import INFERENCE_SIZES
from gpupack.sim.dra_churn import CONFIG, NODES, PROBES, PUBLISHED_PROFILES, Arm, run_dra_churn

NAME = "dra-churn"  # the report's file name
Run = Mapping[str, Any]  # one arm on one seed, as DraChurnJob.run returns it
Pair = tuple[int, Run, Run]  # seed, gpupack's run, first fit's run
# metric, label, higher is better
METRICS = (
    ("rejected", "pods rejected", False),
    *((f"placeable_{p}", f"{p} placeable (% of samples)", True) for p in PROBES),
)


@dataclass(frozen=True)
class DraChurnJob:
    """One arm, one seed."""

    arm: str
    seed: int
    nodes: int = NODES
    load: float = CONFIG.load
    measure: float = CONFIG.measure

    def run(self) -> dict[str, object]:
        """The run's numbers (`DraChurnResult.to_json`) and the job's settings."""
        config = replace(CONFIG, load=self.load, measure=self.measure)
        result = run_dra_churn(Arm(self.arm), self.seed, self.nodes, config)
        return asdict(self) | result.to_json()


def build_jobs(seeds: Sequence[int], nodes: int, load: float, measure: float) -> list[DraChurnJob]:
    """Every (arm, seed), gpupack's first."""
    return [DraChurnJob(arm.value, seed, nodes, load, measure) for arm in Arm for seed in seeds]


# ----------------------------------------------------------------------------- the report
def pairs(runs: Sequence[Run]) -> list[Pair]:
    """The seeds both arms ran, with each arm's run."""
    by = {(r["arm"], int(r["seed"])): r for r in runs}
    seeds = sorted({s for _, s in by})
    arms = (Arm.GPUPACK.value, Arm.FIRST_FIT.value)
    return [(s, by[(arms[0], s)], by[(arms[1], s)]) for s in seeds if all((a, s) in by for a in arms)]


def value(run: Run, metric: str) -> float:
    """A metric of one run: `rejected` or `placeable_<profile>` (% of samples)."""
    if metric.startswith("placeable_"):
        return float(run["placeable_pct"][metric.removeprefix("placeable_")])
    return float(run[metric])


def ratio(theirs: float, mine: float) -> float | None:
    """first fit / gpupack, 2 decimals; None when gpupack's is 0."""
    return round(theirs / mine, 2) if mine else None


def compare(seeds: Sequence[Pair]) -> dict[str, Paired]:
    """gpupack against first fit on each metric, paired by seed."""
    return {
        key: paired({s: value(m, key) for s, m, _ in seeds}, {s: value(t, key) for s, _, t in seeds}, better)
        for key, _, better in METRICS
    }


def per_seed_table(seeds: Sequence[Pair]) -> Table:
    """One row per seed, then the totals: rejections of both arms, their difference and ratio, and how often
    7g.80gb was placeable."""
    table = Table(["seed", "pods submitted", "rejected: gpupack", "rejected: first fit", "difference",
                   "ratio first fit / gpupack", "7g placeable %: gpupack", "7g placeable %: first fit"])  # fmt: skip
    for seed, mine, theirs in seeds:
        table.add(
            seed, mine["submitted"], mine["rejected"], theirs["rejected"], mine["rejected"] - theirs["rejected"],
            ratio(theirs["rejected"], mine["rejected"]), value(mine, "placeable_7g.80gb"),
            value(theirs, "placeable_7g.80gb"),
        )  # fmt: skip
    ours, upstream = (sum(int(run["rejected"]) for run in arm) for arm in _arms(seeds))
    table.add(
        "total", sum(int(m["submitted"]) for _, m, _ in seeds), ours, upstream, ours - upstream,
        ratio(upstream, ours), *(_mean(value(run, "placeable_7g.80gb") for run in arm) for arm in _arms(seeds)),
    )  # fmt: skip
    return table


def _arms(seeds: Sequence[Pair]) -> tuple[list[Run], list[Run]]:
    return [m for _, m, _ in seeds], [t for _, _, t in seeds]


def _mean(values: Iterable[float]) -> float:
    return round(statistics.fmean(values), 2)


def profile_table(seeds: Sequence[Pair]) -> Table:
    """Pods submitted and rejected by profile, summed over the seeds."""
    table = Table(["profile", "submitted", "rejected: gpupack", "rejected: first fit"])
    mine, theirs = _arms(seeds)
    profiles = sorted({p for run in mine for p in run["submitted_by_profile"]}, key=PUBLISHED_PROFILES.index)
    for profile in profiles:
        table.add(
            profile, sum(int(r["submitted_by_profile"].get(profile, 0)) for r in mine),
            *(sum(int(r["rejected_by_profile"].get(profile, 0)) for r in arm) for arm in (mine, theirs)),
        )  # fmt: skip
    return table


def paired_table(seeds: Sequence[Pair], comparisons: Mapping[str, Paired]) -> Table:
    """Per metric: both arms' medians, the median paired difference, the seed counts, p and the verdict."""
    table = Table(["metric", "gpupack (median)", "first fit (median)", "median difference",
                   "gpupack better / worse / equal seeds", "sign test p", "verdict"])  # fmt: skip
    mine, theirs = _arms(seeds)
    for key, label, _ in METRICS:
        p = comparisons[key]
        table.add(
            label, _median(mine, key), _median(theirs, key), p.median_diff, p.counts(), round(p.p_value, 4),
            p.verdict,
        )  # fmt: skip
    return table


def _median(runs: Sequence[Run], key: str) -> float:
    return round(statistics.median(value(r, key) for r in runs), 2)


def findings(seeds: Sequence[Pair], comparisons: Mapping[str, Paired]) -> list[str]:
    """The comparison in sentences, ratios first, then the sign test, then where gpupack is not better."""
    mine, theirs = _arms(seeds)
    ours, upstream = sum(int(r["rejected"]) for r in mine), sum(int(r["rejected"]) for r in theirs)
    ratios = [r for _, m, t in seeds if (r := ratio(t["rejected"], m["rejected"])) is not None]
    fewer = sum(m["rejected"] < t["rejected"] for _, m, t in seeds)
    equal = sum(m["rejected"] == t["rejected"] for _, m, t in seeds)
    n, rejected = len(seeds), comparisons["rejected"]
    spread = (
        f" (per seed from {min(ratios):.2f}x to {max(ratios):.2f}x, median {statistics.median(ratios):.2f}x)"
        if ratios
        else ""
    )
    return [
        f"Rejected pods over the {n} seeds: first fit {upstream}, gpupack {ours}; first fit rejected "
        f"{_times(ratio(upstream, ours))} as many{spread}.",
        f"gpupack rejected fewer pods than first fit on {fewer} of {n} seeds (equal on {equal}, more on "
        f"{n - fewer - equal}); sign test p = {rejected.p_value:.3g} ({rejected.verdict})."
        + ("" if fewer == n else " **gpupack did not reject fewer on every seed.**"),
        f"7g.80gb placeable at the samples: gpupack {_mean(value(r, 'placeable_7g.80gb') for r in mine)} %, "
        f"first fit {_mean(value(r, 'placeable_7g.80gb') for r in theirs)} % (mean over seeds). GPUs in use "
        f"(compute slices, mean over the samples): gpupack {_mean(float(r['mean_in_use_pct']) for r in mine)} %, "
        f"first fit {_mean(float(r['mean_in_use_pct']) for r in theirs)} %.",
        *not_better(seeds, comparisons),
        _same_arrivals(seeds),
    ]


def not_better(seeds: Sequence[Pair], comparisons: Mapping[str, Paired]) -> list[str]:
    """Every metric on which gpupack is not better by the sign test, and every profile it rejected more of."""
    lines = [
        f"**Not better: {label}** ({comparisons[key].verdict}), {comparisons[key].describe()}."
        for key, label, _ in METRICS
        if comparisons[key].verdict != "better"
    ]
    table = profile_table(seeds)
    more = [f"{row[0]} ({row[2]} against {row[3]})" for row in table.rows if int(row[2] or 0) > int(row[3] or 0)]
    if more:
        lines.append(f"**gpupack rejected more pods than first fit of:** {', '.join(more)} (sum over the seeds).")
    return lines


def _times(r: float | None) -> str:
    return "infinitely" if r is None else f"{r:.2f}x"


def _same_arrivals(seeds: Sequence[Pair]) -> str:
    differ = [s for s, m, t in seeds if m["arrivals_digest"] != t["arrivals_digest"]]
    if differ:
        return f"**The arms saw different arrivals on seeds {', '.join(map(str, differ))}** (a bug)."
    return f"Both arms saw the same arrivals on every seed (arrival digests equal on all {len(seeds)})."


def protocol_text(run: Run) -> str:
    """The protocol in a paragraph, with this run's settings."""
    mix = ", ".join(f"{size}g: {weight:.0%}" for size, weight in INFERENCE_SIZES)
    return (
        f"**Protocol** (`sim.dra_churn`, on `sim.churn`'s machinery). {run['nodes']} nodes of 8 H100-80GB GPUs "
        f"({run['gpus_total']} GPUs) in dynamic MIG mode, 192 cores and 2 TiB each. Pods: `sim.churn`'s "
        f"inference mix on the 80 GB profiles ({mix} by compute slices: 1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb, "
        "7g.80gb), one instance each, every pod asking 2 CPU and 16 GiB. Poisson arrivals, exponential "
        f"lifetimes set for an offered load of {run['load']:g} x the GPUs (by compute slices); the first "
        f"{CONFIG.warmup:g} mean lifetimes warm up and are not counted, the next {run['measure']:g} are, "
        f"sampled {CONFIG.samples} times. A pod that fits nowhere at arrival is rejected (no retry). "
        "**gpupack**: `Decider.seeded` with the default policy picks node, GPU and placement, as the extender "
        "does. **upstream-first-fit**: kube-scheduler with DRA: node by the default score "
        "(NodeResourcesFit LeastAllocated + NodeResourceBalancedAllocation over CPU and memory, integer "
        "arithmetic as upstream; with equal pods, the node with the fewest pods), seeded random among ties; "
        "device by the allocator's first fit in the driver's published order, modelled as: GPUs by minor "
        f"0..n-1; per GPU the profiles {', '.join(PUBLISHED_PROFILES)}; per profile the placements by increasing "
        "start (`scoring.geometry`). A device is allocatable when its memory slices are free and its GPU has "
        "the multiprocessors left. Both arms commit into their own `Inventory`. Placeable: at a sample, some "
        "node has room for a pod of the profile (a test of the state alone, the same for both arms)."
    )


PAIRED_TITLE = "## Paired over the seeds (gpupack − first fit; rejected: lower is better, placeable: higher)"


def render(runs: Sequence[Run], info: Mapping[str, object], command: str) -> tuple[str, dict[str, object]]:
    """dra-churn.md and the JSON beside it."""
    seeds = pairs(runs)
    comparisons = compare(seeds)
    summary = paired_table(seeds, comparisons)
    parts = [
        "# DRA first fit against gpupack: MIG churn on H100 nodes (#30 item 4)",
        f"{provenance(command, 'dra_churn', 'dra_churn', info)} Seeds {', '.join(str(s) for s, _, _ in seeds)}. The "
        "load and the cluster size were chosen on seeds 0–41 only (the lowest load, in steps of 0.05, at which "
        "both arms rejected pods on every one of those seeds); nothing was tuned on seeds 42–51.",
        protocol_text(seeds[0][1]) if seeds else "(no runs)",
        "## Findings",
        bullet_list(findings(seeds, comparisons)),
        "## Per seed",
        per_seed_table(seeds).markdown(),
        PAIRED_TITLE,
        summary.markdown(),
        "## Rejected by profile (sum over the seeds)",
        profile_table(seeds).markdown(),
    ]
    saved: dict[str, object] = {
        "machine": dict(info),
        "command": command,
        "summary": summary.to_json(),
        "runs": [dict(r) for r in runs],
    }
    return "\n\n".join(parts) + "\n", saved


def command_line() -> argparse.ArgumentParser:
    """The command line (module docstring)."""
    description = (__doc__ or "").split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m gpupack.bench.dra_churn", description=description)
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=NODES, help="H100 x 8 nodes (tests: fewer)")
    parser.add_argument("--load", type=float, default=CONFIG.load, help="offered load, share of the GPUs")
    parser.add_argument("--measure", type=float, default=CONFIG.measure, help="mean lifetimes counted (tests: fewer)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from gpupack.bench.bench_report import machine, run_all  # the full bench's imports, only when run

    args = command_line().parse_args(argv)
    jobs = build_jobs(seeds_arg(args.seeds), args.nodes, args.load, args.measure)
    started = time.perf_counter()
    print(f"bench.dra_churn: {len(jobs)} runs on {args.workers} workers", file=sys.stderr, flush=True)
    done = run_all(jobs, args.workers, lambda i, n: print(f"  runs done: {i}/{n}", file=sys.stderr, flush=True))
    info = machine() | {"seconds": round(time.perf_counter() - started)}
    command = "python -m gpupack.bench.dra_churn " + " ".join(argv if argv is not None else sys.argv[1:])
    text, saved = render(done, info, command.strip())
    print(f"bench.dra_churn: {write_report(Path(args.out), NAME, text, saved)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
