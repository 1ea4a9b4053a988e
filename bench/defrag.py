"""The defragmentation churn bench (#31 item 3): gpupack alone, with the defrag planner, or with a count rule.

`python -m gpupack.bench.defrag [--seeds 42-51] [--out DIR] [--workers 2] [--nodes 16] [--load L]
[--measure M] [--period P] [--max-evictions E] [--patience T] [--arms a,b,c]` runs `sim.defrag_churn` for every
arm on every seed (the same arrivals for all) and writes DIR/defrag.md and DIR/defrag.json (DIR:
bench/results).

The key figure is the utilisation gain per eviction of each moving arm over plain gpupack on the same seed,
(GPUs in use by the arm − by gpupack) / the arm's evictions, compared between defrag and the count rule seed by
seed with the exact sign test (`bench.paired.sign_test`); a difference is better or worse only when p < 0.05.
The settings were chosen on seeds 0–41 (`sim.defrag_churn.CONFIG`, `TUNING`); the report's seeds are 42–51.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from gpupack.bench.arm_report import seeds_arg, write_report
from gpupack.bench.markdown import Table, bullet_list, provenance
from gpupack.bench.paired import SIGNIFICANCE, Paired, paired, sign_test
from gpupack.sim.defrag_churn import CONFIG, NODES, OPENB_WHOLE_GPU_PODS, Arm, DefragConfig, run_defrag_churn

NAME = "defrag"  # the report's file name
Run = Mapping[str, Any]  # one arm on one seed, as DefragJob.run returns it
Seed = tuple[int, dict[str, Run]]  # seed, arm -> run
MOVING = (Arm.DEFRAG.value, Arm.COUNT_RULE.value)
# metric, label, higher is better
METRICS = (
    ("mean_in_use_pct", "GPUs in use %", True),
    ("net_in_use_pct", "GPUs in use % net of restarted work", True),
    ("mean_stranded_slices", "stranded MIG slices", False),
    ("mean_large_pending", "large pods pending", False),
    ("mean_large_wait", "large pods' wait (s)", False),
    ("rejected", "pods rejected", False),
    ("evictions", "evictions", False),
    ("restarted_gpu_seconds", "restarted GPU-seconds", False),
)
# How the settings of sim.defrag_churn.CONFIG were chosen, all on seeds 0-41 (python -m gpupack.bench.defrag
# --seeds 0-41 --out /tmp/... with the option named); see the report's first paragraph.
TUNING = (
    "load: the lowest offered load in steps of 0.05 from 0.9 at which plain gpupack had large pods pending on every "
    "one of seeds 0–41 (1.0); period and max evictions per period: of (0.1, 4), (0.25, 4), (0.25, 8), (0.5, 4), "
    "(0.5, 8), the pair with the highest median net utilisation gain of gpupack+defrag over gpupack on seeds 0–41 "
    "((0.1, 4): +0.37 pp; 0.05 and (0.1, 8) not run for time); the count rule runs at the same period; patience: "
    "1 mean lifetime, not tuned"
)


@dataclass(frozen=True)
class DefragJob:
    """One arm, one seed, one setting."""

    arm: str
    seed: int
    nodes: int = NODES
    load: float = CONFIG.churn.load
    measure: float = CONFIG.churn.measure
    period: float = CONFIG.period
    max_evictions: int = CONFIG.max_evictions
    patience: float = CONFIG.patience

    def config(self) -> DefragConfig:
        """The simulation's settings for this job."""
        churn = replace(CONFIG.churn, load=self.load, measure=self.measure)
        return DefragConfig(churn, self.period, self.max_evictions, self.patience)

    def run(self) -> dict[str, object]:
        """The run's numbers (`DefragChurnResult.to_json`) and the job's settings."""
        result = run_defrag_churn(Arm(self.arm), self.seed, self.nodes, self.config())
        return asdict(self) | result.to_json()


def build_jobs(seeds: Sequence[int], arms: Sequence[str], **settings: Any) -> list[DefragJob]:
    """Every (arm, seed), the slow defrag arm's first so the workers finish together."""
    order = sorted(arms, key=lambda arm: arm != Arm.DEFRAG.value)
    return [DefragJob(arm, seed, **settings) for arm in order for seed in seeds]


# ----------------------------------------------------------------------------- the numbers
def by_seed(runs: Sequence[Run]) -> list[Seed]:
    """The seeds every arm ran, with each arm's run."""
    arms = sorted({str(r["arm"]) for r in runs})
    by = {(str(r["arm"]), int(r["seed"])): r for r in runs}
    seeds = sorted({s for _, s in by})
    return [(s, {a: by[(a, s)] for a in arms}) for s in seeds if all((a, s) in by for a in arms)]


def gain_per_eviction(run: Run, base: Run, key: str = "mean_in_use_pct") -> float | None:
    """(the arm's `key` − gpupack's) / the arm's evictions, in percentage points per eviction; None: none."""
    evictions = int(run["evictions"])
    return (float(run[key]) - float(base[key])) / evictions if evictions else None


def gains(seeds: Sequence[Seed], arm: str, key: str = "mean_in_use_pct") -> dict[int, float | None]:
    """Per seed: the arm's gain per eviction over gpupack."""
    return {s: gain_per_eviction(runs[arm], runs[Arm.GPUPACK.value], key) for s, runs in seeds}


@dataclass(frozen=True)
class SignTest:
    """Defrag against the count rule on one per-seed figure: seeds where it is higher, lower, equal; p."""

    higher: int
    lower: int
    equal: int
    p_value: float

    @property
    def verdict(self) -> str:
        if self.p_value >= SIGNIFICANCE:
            return "tie"
        return "defrag better" if self.higher > self.lower else "defrag worse"


def gain_test(seeds: Sequence[Seed], key: str = "mean_in_use_pct") -> SignTest:
    """Defrag's gain per eviction against the count rule's, seed by seed (exact: these are small numbers)."""
    mine, theirs = gains(seeds, Arm.DEFRAG.value, key), gains(seeds, Arm.COUNT_RULE.value, key)
    both = [(m, t) for s in mine if (m := mine[s]) is not None and (t := theirs[s]) is not None]
    higher, lower = sum(m > t for m, t in both), sum(m < t for m, t in both)
    return SignTest(higher, lower, len(both) - higher - lower, sign_test(higher, lower))


def compare(seeds: Sequence[Seed], arm: str, baseline: str) -> dict[str, Paired]:
    """`arm` against `baseline` on each metric, paired by seed."""
    return {
        key: paired({s: float(r[arm][key]) for s, r in seeds}, {s: float(r[baseline][key]) for s, r in seeds}, better)
        for key, _, better in METRICS
    }


def _total(seeds: Sequence[Seed], arm: str, key: str) -> float:
    return round(sum(float(runs[arm][key]) for _, runs in seeds), 1)


def _mean(values: Iterable[float]) -> float:
    return round(statistics.fmean(values), 3)


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "—"


# ----------------------------------------------------------------------------- the report
def per_seed_table(seeds: Sequence[Seed]) -> Table:
    """One row per seed: GPUs in use of every arm (gross and net), evictions and gains per eviction."""
    g, d, c = Arm.GPUPACK.value, Arm.DEFRAG.value, Arm.COUNT_RULE.value
    table = Table(["seed", "in use %: gpupack", "defrag", "count rule", "net in use %: defrag", "net: count rule",
                   "evictions: defrag", "count rule", "gain / eviction (pp): defrag", "count rule",
                   "net gain / eviction: defrag", "net: count rule", "rejected: gpupack", "defrag",
                   "count rule"])  # fmt: skip
    for seed, runs in seeds:
        table.add(
            seed, runs[g]["mean_in_use_pct"], runs[d]["mean_in_use_pct"], runs[c]["mean_in_use_pct"],
            runs[d]["net_in_use_pct"], runs[c]["net_in_use_pct"], runs[d]["evictions"], runs[c]["evictions"],
            *(_round(gain_per_eviction(runs[a], runs[g])) for a in MOVING),
            *(_round(gain_per_eviction(runs[a], runs[g], "net_in_use_pct")) for a in MOVING),
            *(runs[a]["rejected"] for a in (g, d, c)),
        )  # fmt: skip
    table.add(
        "mean / total", *(_mean(float(r[a]["mean_in_use_pct"]) for _, r in seeds) for a in (g, d, c)),
        *(_mean(float(r[a]["net_in_use_pct"]) for _, r in seeds) for a in MOVING),
        *(int(_total(seeds, a, "evictions")) for a in MOVING),
        *(_median(gains(seeds, a).values()) for a in MOVING),
        *(_median(gains(seeds, a, "net_in_use_pct").values()) for a in MOVING),
        *(int(_total(seeds, a, "rejected")) for a in (g, d, c)),
    )  # fmt: skip
    return table


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def arm_table(seeds: Sequence[Seed]) -> Table:
    """Per arm: the means over the seeds of the sampled figures, the totals of the counts."""
    table = Table(["arm", *(label for _, label, _ in METRICS)])
    for arm in (a.value for a in Arm):
        table.add(arm, *(_arm_value(seeds, arm, key) for key, _, _ in METRICS))
    return table


def _arm_value(seeds: Sequence[Seed], arm: str, key: str) -> float:
    if key in ("rejected", "evictions", "restarted_gpu_seconds"):
        return _total(seeds, arm, key)
    return _mean(float(r[arm][key]) for _, r in seeds)


def paired_table(seeds: Sequence[Seed]) -> Table:
    """Per comparison and metric: the median paired difference, the seed counts, p and the verdict."""
    table = Table(["comparison", "metric", "median difference", "better / worse / equal seeds", "sign test p",
                   "verdict"])  # fmt: skip
    for arm, baseline in ((Arm.DEFRAG, Arm.GPUPACK), (Arm.COUNT_RULE, Arm.GPUPACK), (Arm.DEFRAG, Arm.COUNT_RULE)):
        comparisons = compare(seeds, arm.value, baseline.value)
        for key, label, _ in METRICS:
            p = comparisons[key]
            verdict = {"better": f"{arm.value} better", "worse": f"{arm.value} worse"}.get(p.verdict, p.verdict)
            table.add(f"{arm.value} − {baseline.value}", label, p.median_diff, p.counts(), round(p.p_value, 4), verdict)
    for key, label in (("mean_in_use_pct", "gain per eviction"), ("net_in_use_pct", "net gain per eviction")):
        test = gain_test(seeds, key)
        mine, theirs = gains(seeds, Arm.DEFRAG.value, key), gains(seeds, Arm.COUNT_RULE.value, key)
        diffs = [m - t for s in mine if (m := mine[s]) is not None and (t := theirs[s]) is not None]
        median = round(statistics.median(diffs), 4) if diffs else None
        table.add("defrag − count rule", label, median, f"{test.higher}/{test.lower}/{test.equal}",
                  round(test.p_value, 4), test.verdict)  # fmt: skip
    return table


def findings(seeds: Sequence[Seed]) -> list[str]:
    """The comparison in sentences: ratios first, then the sign tests, then where defrag is not better."""
    g, d, c = Arm.GPUPACK.value, Arm.DEFRAG.value, Arm.COUNT_RULE.value
    n = len(seeds)
    ev_d, ev_c = _total(seeds, d, "evictions"), _total(seeds, c, "evictions")
    lost_d, lost_c = _total(seeds, d, "restarted_gpu_seconds"), _total(seeds, c, "restarted_gpu_seconds")
    gross, net = gain_test(seeds), gain_test(seeds, "net_in_use_pct")
    lines = [
        f"Evictions over the {n} seeds: count rule {ev_c:g}, defrag {ev_d:g} ({_ratio(ev_c, ev_d)}); restarted "
        f"GPU-seconds: count rule {lost_c:g}, defrag {lost_d:g} ({_ratio(lost_c, lost_d)}).",
        f"Utilisation gain per eviction over plain gpupack (GPUs in use, percentage points per eviction, median "
        f"over seeds): defrag {_median(gains(seeds, d).values())}, count rule {_median(gains(seeds, c).values())}; "
        f"defrag higher on {gross.higher} of {n} seeds, lower on {gross.lower}, equal on {gross.equal}; sign test "
        f"p = {gross.p_value:.3g} ({gross.verdict}).",
        f"Net of the restarted work (a restarted pod holds GPUs again for work done once): gain per eviction "
        f"defrag {_median(gains(seeds, d, 'net_in_use_pct').values())}, count rule "
        f"{_median(gains(seeds, c, 'net_in_use_pct').values())}; defrag higher on {net.higher} of {n}, lower on "
        f"{net.lower}; sign test p = {net.p_value:.3g} ({net.verdict}).",
        "GPUs in use (mean over seeds): "
        + ", ".join(
            f"{a} {_arm_value(seeds, a, 'mean_in_use_pct')} % (net {_arm_value(seeds, a, 'net_in_use_pct')} %)"
            for a in (g, d, c)
        )
        + "; pods rejected (patience ran out): "
        + ", ".join(f"{a} {_total(seeds, a, 'rejected'):g}" for a in (g, d, c))
        + ".",
        *not_better(seeds),
        _same_arrivals(seeds),
    ]
    return lines


def not_better(seeds: Sequence[Seed]) -> list[str]:
    """Every metric on which defrag is not better than plain gpupack, or than the count rule, by the sign test."""
    lines = []
    for baseline in (Arm.GPUPACK.value, Arm.COUNT_RULE.value):
        comparisons = compare(seeds, Arm.DEFRAG.value, baseline)
        for key, label, _ in METRICS:
            p = comparisons[key]
            if p.verdict != "better" and not (
                baseline == Arm.GPUPACK.value and key in ("evictions", "restarted_gpu_seconds")
            ):
                lines.append(
                    f"**Not better than {baseline}: {label}** ({p.verdict}): median difference {p.median_diff:+g}, "
                    f"defrag better on {p.wins}, worse on {p.losses}, equal on {p.ties}; p = {p.p_value:.3g}."
                )
    return lines


def _same_arrivals(seeds: Sequence[Seed]) -> str:
    differ = [s for s, runs in seeds if len({r["arrivals_digest"] for r in runs.values()}) != 1]
    if differ:
        return f"**The arms saw different arrivals on seeds {', '.join(map(str, differ))}** (a bug)."
    return f"Every arm saw the same arrivals on every seed (arrival digests equal on all {len(seeds)})."


def protocol_text(run: Run) -> str:
    """The protocol in a paragraph, with this run's settings."""
    whole = ", ".join(f"{gpus} GPU: {count}" for gpus, count in OPENB_WHOLE_GPU_PODS)
    return (
        f"**Protocol** (`sim.defrag_churn`, on `sim.churn`'s machinery). {run['nodes']} nodes of 8 H100-80GB GPUs "
        f"({run['gpus_total']} GPUs) in dynamic MIG mode. Pods: half MIG instances of `sim.churn`'s inference mix "
        "(1g.10gb 35 %, 2g.20gb 25 %, 3g.40gb 20 %, 4g.40gb 12 %, 7g.80gb 8 %), half whole-GPU pods in the openb "
        f"default trace's proportions ({whole} pods). Poisson arrivals, exponential lifetimes for an offered load of "
        f"{run['load']:g} x the GPUs; the first {CONFIG.churn.warmup:g} mean lifetimes warm up, the next "
        f"{run['measure']:g} are measured ({CONFIG.churn.samples} samples). A pod that does not fit waits in a FIFO "
        "queue, retried in order after every departure and eviction and at every period; after "
        f"{run['patience']:g} mean lifetime(s) of waiting it leaves (rejected). Every {run['period']:g} mean "
        f"lifetimes: **gpupack+defrag** runs `scoring.defrag.plan_defrag` (all goals, at most {run['max_evictions']} "
        "evictions) and carries its moves out as planned; **gpupack+count-rule** evicts every pod of the node with "
        "the fewest GPUs allocated, to the front of the queue. **gpupack** never moves a pod. An evicted pod "
        "restarts from scratch (restarted GPU-seconds: GPUs held x time run). GPUs in use count MIG by compute "
        "slices / 7; net: less the restarted GPU-seconds over the measured GPU-seconds. Stranded MIG slices: free "
        "compute slices on MIG GPUs in use on which 7g.80gb cannot go. Large pods: ≥ 4 GPUs or ≥ 4g; their wait "
        "runs from entering the queue to starting, giving up, or the run's end."
    )


PAIRED_TITLE = "## Paired over the seeds (each row: first arm − second; the sign test decides)"


def render(runs: Sequence[Run], info: Mapping[str, object], command: str) -> tuple[str, dict[str, object]]:
    """defrag.md and the JSON beside it."""
    seeds = by_seed(runs)
    summary = paired_table(seeds)
    parts = [
        "# Defragmentation under churn: gpupack, gpupack+defrag, gpupack+count-rule (#31 item 3)",
        f"{provenance(command, 'defrag', 'defrag_churn', info)} Seeds {', '.join(str(s) for s, _ in seeds)}. Settings "
        f"chosen on seeds 0–41 only ({TUNING}); nothing was tuned on the seeds reported.",
        protocol_text(seeds[0][1][Arm.GPUPACK.value]) if seeds else "(no runs)",
        "## Findings",
        bullet_list(findings(seeds)),
        "## Per arm (means over the seeds; rejected, evictions and restarted GPU-seconds: totals)",
        arm_table(seeds).markdown(),
        "## Per seed",
        per_seed_table(seeds).markdown(),
        PAIRED_TITLE,
        summary.markdown(),
    ]
    saved: dict[str, object] = {
        "machine": dict(info),
        "command": command,
        "tuning": TUNING,
        "summary": summary.to_json(),
        "runs": [dict(r) for r in runs],
    }
    return "\n\n".join(parts) + "\n", saved


def command_line() -> argparse.ArgumentParser:
    """The command line (module docstring)."""
    description = (__doc__ or "").split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m gpupack.bench.defrag", description=description)
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=NODES, help="H100 x 8 nodes (tests: fewer)")
    parser.add_argument("--load", type=float, default=CONFIG.churn.load, help="offered load, share of the GPUs")
    parser.add_argument("--measure", type=float, default=CONFIG.churn.measure, help="mean lifetimes counted")
    parser.add_argument("--period", type=float, default=CONFIG.period, help="mean lifetimes between moves")
    parser.add_argument("--max-evictions", type=int, default=CONFIG.max_evictions, help="per defrag plan")
    parser.add_argument("--patience", type=float, default=CONFIG.patience, help="mean lifetimes a pod waits")
    parser.add_argument("--arms", default=",".join(a.value for a in Arm), help="comma-separated (tuning: fewer)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from gpupack.bench.bench_report import machine, run_all  # the full bench's imports, only when run

    args = command_line().parse_args(argv)
    settings = {
        "nodes": args.nodes, "load": args.load, "measure": args.measure, "period": args.period,
        "max_evictions": args.max_evictions, "patience": args.patience,
    }  # fmt: skip
    jobs = build_jobs(seeds_arg(args.seeds), [Arm(a).value for a in args.arms.split(",") if a], **settings)
    started = time.perf_counter()
    print(f"bench.defrag: {len(jobs)} runs on {args.workers} workers", file=sys.stderr, flush=True)
    done = run_all(jobs, args.workers, lambda i, n: print(f"  runs done: {i}/{n}", file=sys.stderr, flush=True))
    info = machine() | {"seconds": round(time.perf_counter() - started)}
    command = "python -m gpupack.bench.defrag " + " ".join(argv if argv is not None else sys.argv[1:])
    if len({j.arm for j in jobs}) < len(Arm):  # a tuning run: the numbers only
        path = Path(args.out) / f"{NAME}-runs.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"command": command, "runs": done}), encoding="utf-8")
        print(f"bench.defrag: {path}")
        return 0
    text, saved = render(done, info, command.strip())
    print(f"bench.defrag: {write_report(Path(args.out), NAME, text, saved)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
