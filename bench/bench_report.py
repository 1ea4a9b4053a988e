"""`gpupack bench [--quick] [--out DIR]`: the standard comparison, written to DIR/REPORT.md + PNGs + results.json.

Scenarios (details in the report itself): openb (all policies x the 13 openb traces, fgd protocol), MIG (a
mixed H100/A100/A30 cluster in dynamic MIG mode against static all-balanced partitions), NVLink (NVSwitch,
hybrid cube-mesh and bridged PCIe nodes), cost (on-demand + spot), speed (kernel and HTTP filter).
Simulation runs are independent jobs spread over a process pool (2 workers: one per core of the bench
machine); the speed benchmarks run afterwards, alone.

The openb trace is read from ../shared/traces/openb/ (or $GPUPACK_OPENB_TRACES). DIR defaults to bench/results
(the committed report); with --quick, to a new temporary folder.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TypeVar

import orjson

from gpupack.bench import job_cache, speed
from gpupack.bench.churn_report import churn_section
from gpupack.bench.equal_risk import ZERO_RISK
from gpupack.bench.jobs import (
    ChurnJob,
    CostJob,
    CostSpotJob,
    Job,
    LimitJob,
    MigJob,
    NvlinkJob,
    OpenbJob,
    Runnable,
    run_job,
)
from gpupack.bench.markdown import update_readme
from gpupack.bench.openb_report import openb_section, readme_block
from gpupack.bench.report_text import render, seeds_text, separate_runs_text, soak_text
from gpupack.bench.sections import cost_section, mig_section, nvlink_section, speed_section
from gpupack.sim.scenarios import churn_cluster, cost_cluster, mig_cluster, nvlink_cluster

R = TypeVar("R", bound=Runnable)  # a job of any bench: run_all only calls its run()

ROOT = Path(__file__).resolve().parents[1]
TRACES_ENV = "GPUPACK_OPENB_TRACES"
RESULTS = "bench/results"  # the full run's report folder: the committed report and plots

# every openb variant of ../shared/traces/openb (the first five are the ones the paper's main figures use)
OPENB_TRACES = (
    "default", "cpu050", "gpushare40", "gpuspec10", "multigpu20", "cpu100", "cpu250", "gpushare60",
    "gpushare100", "gpuspec20", "gpuspec33", "multigpu30", "multigpu50",
)  # fmt: skip
OPENB_POLICIES = (
    "gpupack",
    "fgd",
    "best-fit",
    "gpu-packing",
    "gpu-clustering",
    "dot-product",
    "random",
    "kube-default",
    "first-fit",
)
# MIG runs: (report label, cluster variant, policy)
MIG_RUNS = (
    ("gpupack", "dynamic", "gpupack"),
    ("first-fit", "dynamic", "first-fit"),
    ("best-fit", "dynamic", "best-fit"),
    ("static-balanced (best-fit)", "static-balanced", "best-fit"),
    ("kube-default", "dynamic", "kube-default"),
)
GRID_LABELS = ("gpupack", "first-fit")
NVLINK_POLICIES = ("gpupack", "kube-default", "kube-default+besteffort", "best-fit")
# gpupack[spot_avoid=0]: the same policy without the spot rule, to separate price from the rule
COST_POLICIES = ("gpupack", "gpupack[spot_avoid=0]", "kube-default", "best-fit")
# fgd (given the mix in advance) as a reference; the goal is fewer rejections than the three baselines
CHURN_POLICIES = ("gpupack", "first-fit", "best-fit", "kube-default", "fgd")
SLOW_POLICIES = ("gpupack", "fgd")  # scheduled first so the pool ends evenly
SECTIONS = ("openb", "churn", "mig", "nvlink", "cost", "speed")
SCENARIO_SECTION = {"cost-spot": "cost", "limit": "openb"}  # job scenario -> report section, where they differ


@dataclass(frozen=True)
class BenchConfig:
    """What one bench run covers."""

    label: str
    traces_dir: str
    openb_traces: tuple[str, ...] = OPENB_TRACES
    openb_policies: tuple[str, ...] = OPENB_POLICIES
    openb_seeds: tuple[int, ...] = tuple(range(42, 52))
    openb_node_limit: int | None = None  # first N nodes of the openb node list (tiny runs)
    limit_packing_traces: tuple[str, ...] = ("default",)  # where the limit also lays out an offline packing
    scenario_seeds: tuple[int, ...] = tuple(range(42, 52))
    scale: float = 1.0  # node counts of the MIG / NVLink / cost clusters
    cost_ratios: tuple[float, ...] = (1.0, 0.6)
    kernel_nodes: tuple[int, ...] = (1000, 5000, 10000)
    kernel_calls: int = 200
    reference_calls: int = 5  # at 1,000 nodes; proportionally fewer on larger clusters
    http_nodes: tuple[int, ...] = (1000, 5000)
    http_requests: int = 1000  # p99 then rests on the 10 slowest, not 3
    workers: int = 2
    update_readme: bool = False
    sections: tuple[str, ...] = SECTIONS  # `--only`: the others are not run, and the report says so
    cache_dir: str | None = None  # `--cache`: finished jobs kept there (bench.job_cache)


def default_traces_dir() -> Path:
    """$GPUPACK_OPENB_TRACES, else ../shared/traces/openb next to the repository."""
    return Path(os.environ.get(TRACES_ENV) or ROOT.parent / "shared" / "traces" / "openb")


def full_config(traces_dir: Path) -> BenchConfig:
    """Everything the issue asks for: seeds 42-51 on openb, full-size scenario clusters."""
    return BenchConfig("full", str(traces_dir), update_readme=True)


def quick_config(traces_dir: Path) -> BenchConfig:
    """CI-adjacent: openb default trace, 2 seeds, 4 policies; full-size scenario clusters, one seed."""
    return BenchConfig(
        "quick",
        str(traces_dir),
        openb_traces=("default",),
        openb_policies=("gpupack", "fgd", "best-fit", "random"),
        openb_seeds=(42, 43),
        scenario_seeds=(42,),
        scale=1.0,
        kernel_calls=20,
        reference_calls=2,
        http_requests=100,
    )


def tiny_config(traces_dir: Path) -> BenchConfig:
    """A few nodes and pods per scenario (the test of the report machinery)."""
    return BenchConfig(
        "tiny",
        str(traces_dir),
        openb_traces=("default", "multigpu20"),
        openb_policies=("gpupack", "fgd", "best-fit"),
        openb_seeds=(42, 43),
        openb_node_limit=12,
        scenario_seeds=(42,),
        scale=0.02,
        cost_ratios=(1.0, 0.6),
        kernel_nodes=(20, 40),
        kernel_calls=3,
        reference_calls=20,
        http_nodes=(20,),
        http_requests=5,
    )


# ----------------------------------------------------------------------------- jobs
def build_jobs(config: BenchConfig) -> list[Job]:
    """Every simulation run of the bench, the slow policies first."""
    t = config.traces_dir
    first = config.openb_seeds[0]
    jobs: list[Job] = [
        OpenbJob(t, trace, policy, seed, config.openb_node_limit, stop_at_100=seed != first)
        for trace in config.openb_traces
        for policy in config.openb_policies
        for seed in config.openb_seeds
    ]
    jobs += [  # the physical limit of the same seeds (bench.limit); the offline packing where asked
        LimitJob(t, trace, seed, config.openb_node_limit, packing=trace in config.limit_packing_traces)
        for trace in config.openb_traces
        for seed in config.openb_seeds
    ]
    s0 = config.scenario_seeds[0]
    for seed in config.scenario_seeds:
        jobs += [
            MigJob(t, label, variant, policy, seed, config.scale, grid=seed == s0 and label in GRID_LABELS)
            for label, variant, policy in MIG_RUNS
        ]
        jobs += [NvlinkJob(t, policy, seed, config.scale) for policy in NVLINK_POLICIES]
        jobs += [ChurnJob(t, policy, seed, config.scale) for policy in CHURN_POLICIES]
        jobs += [
            CostJob(t, policy, seed, ratio, config.scale) for ratio in config.cost_ratios for policy in COST_POLICIES
        ]
        jobs += [  # the same cluster with the spot practice of bench.equal_risk: cost at equal risk (#16)
            CostSpotJob(t, policy, seed, ratio, config.scale) for ratio in config.cost_ratios for policy in ZERO_RISK
        ]
    jobs = [j for j in jobs if SCENARIO_SECTION.get(j.scenario, j.scenario) in config.sections]
    return sorted(jobs, key=lambda j: (j.policy not in SLOW_POLICIES, j.scenario != "openb"))


def run_jobs(
    jobs: Sequence[Job],
    workers: int,
    progress: Callable[[int, int], None] | None = None,
    cache: Path | None = None,
) -> list[dict[str, object]]:
    """Run every job, in a process pool of `workers` (inline when 1); results in job order. With `cache`,
    jobs finished there before are read back, and every new one is kept there as soon as it ends."""
    if cache is None:
        return run_all(jobs, workers, progress)
    kept = [job_cache.load(cache, job) for job in jobs]
    todo = [job for job, result in zip(jobs, kept, strict=True) if result is None]

    def keep(done: int, total: int, job: Job, result: dict[str, object]) -> None:
        job_cache.store(cache, job, result)
        if progress:
            progress(len(jobs) - total + done, len(jobs))

    fresh = iter(run_all(todo, workers, None, keep))
    return [result if result is not None else next(fresh) for result in kept]


def run_all(
    jobs: Sequence[R],
    workers: int,
    progress: Callable[[int, int], None] | None = None,
    each: Callable[[int, int, R, dict[str, object]], None] | None = None,
) -> list[dict[str, object]]:
    """`run_jobs` without a cache, for any runnable job; `each(done, total, job, result)` sees every result as
    it is collected."""
    if each is None and progress is not None:
        each = lambda done, total, _job, _result: progress(done, total)  # noqa: E731
    if workers <= 1:
        results = []
        for i, job in enumerate(jobs):
            results.append(run_job(job))
            if each:
                each(i + 1, len(jobs), job, results[-1])
        return results
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [pool.submit(run_job, job) for job in jobs]
        results = []
        for i, (job, future) in enumerate(zip(jobs, futures, strict=True)):
            results.append(future.result())
            if each:
                each(i + 1, len(jobs), job, results[-1])
        return results


# ----------------------------------------------------------------------------- machine
def machine() -> dict[str, object]:
    """CPU model, cores, RAM, Python, date and git commit of this run."""
    cpu = "unknown"
    ram_gib = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    try:
        # the reports and plots a bench writes are not changes to the code it ran
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude){RESULTS}"], cwd=ROOT,
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        changed = ""
    if changed:
        commit += f" (+ uncommitted changes in {len(changed.splitlines())} files of the working tree)"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": ram_gib,
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
    }


# ----------------------------------------------------------------------------- the run
def run(args: argparse.Namespace) -> int:
    """`gpupack bench`: run the full (or --quick) bench and write the report; exit code."""
    if args.throughput:
        return run_throughput_report(args)
    traces = default_traces_dir()
    if not (traces / "openb_node_list_gpu_node.csv").is_file():
        print(f"gpupack bench: openb trace not found in {traces} (set {TRACES_ENV})", file=sys.stderr)
        return 2
    config = base = quick_config(traces) if args.quick else full_config(traces)
    only = tuple(name for name in (getattr(args, "only", None) or "").split(",") if name)
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        print(f"gpupack bench: unknown section {unknown[0]!r}; choose from {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    config = replace(config, sections=only or config.sections, cache_dir=getattr(args, "cache", None))
    policies = tuple(name for name in (getattr(args, "policies", None) or "").split(",") if name)
    if policies:
        config = replace(config, openb_policies=policies)
    partial = is_partial(config, base)
    if partial:
        config = as_partial(config)
    if partial and args.out and Path(args.out).resolve() in {Path(RESULTS).resolve(), (ROOT / RESULTS).resolve()}:
        print(f"gpupack bench: a partial run (--only, --policies) never writes to {RESULTS}", file=sys.stderr)
        return 2
    out = output_folder(args, partial)
    started = time.perf_counter()
    run_report(config, out, log=lambda text: print(text, file=sys.stderr, flush=True))
    print(f"gpupack bench ({config.label}): {out / 'REPORT.md'} in {time.perf_counter() - started:.0f} s")
    return 0


def is_partial(config: BenchConfig, base: BenchConfig) -> bool:
    """Whether `config` runs other sections or openb policies than `base`, the run it narrows (`--only`,
    `--policies`)."""
    return set(config.sections) != set(base.sections) or set(config.openb_policies) != set(base.openb_policies)


def as_partial(config: BenchConfig) -> BenchConfig:
    """`config` titled a partial run, leaving the README's results table alone (#27: a partial run had cut
    it from 9 policies to 3)."""
    label = "partial" if config.label == "full" else f"{config.label} partial"
    return replace(config, label=label, update_readme=False)


def output_folder(args: argparse.Namespace, partial: bool = False) -> Path:
    """`--out`; else bench/results for the full run, a new temporary folder for `--quick` or a `partial` run
    (#17, #27: neither may overwrite the committed full-run report and plots)."""
    if args.out:
        return Path(args.out)
    if args.quick or partial:
        return Path(tempfile.mkdtemp(prefix=f"gpupack-bench-{'partial' if partial else 'quick'}-"))
    return Path(RESULTS)


def run_throughput_report(args: argparse.Namespace) -> int:
    """`gpupack bench --throughput`: gpupack beside a trivial extender under the real kube-scheduler."""
    from gpupack.bench import throughput
    from gpupack.harness.controlplane import ControlPlaneError

    quick = throughput.ThroughputConfig(node_counts=(500,), pods=500, rounds=1)
    config = quick if args.quick else throughput.ThroughputConfig()
    out = output_folder(args)
    out.mkdir(parents=True, exist_ok=True)
    try:
        results = throughput.run_throughput(config, log=lambda text: print(text, file=sys.stderr, flush=True))
    except ControlPlaneError as exc:
        print(f"gpupack bench --throughput: {exc}", file=sys.stderr)
        return 2
    info = machine()
    (out / "throughput.md").write_text(throughput.render_markdown(results, info, config))
    (out / "throughput.json").write_bytes(
        orjson.dumps(throughput.result_json(results, info), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    )
    print(f"gpupack bench --throughput: {out / 'throughput.md'}")
    return 0


def run_report(config: BenchConfig, out: Path, log: Callable[[str], None] = lambda _: None) -> dict[str, object]:
    """Run `config`, write out/REPORT.md, out/results.json and the PNGs; returns the results."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    jobs = build_jobs(config)
    log(f"bench {config.label}: {len(jobs)} simulation runs on {config.workers} workers")
    cache = Path(config.cache_dir) if config.cache_dir else None
    cached = sum(job_cache.load(cache, job) is not None for job in jobs) if cache else 0
    results = run_jobs(jobs, config.workers, lambda done, total: log(f"  runs done: {done}/{total}"), cache)
    sim_seconds = time.perf_counter() - started
    by_scenario: dict[str, list[dict[str, object]]] = {}
    for r in results:
        by_scenario.setdefault(str(r["scenario"]), []).append(r)
    build = {
        "openb": lambda: openb_section(
            by_scenario.get("openb", []), config.openb_traces, config.openb_policies, out, by_scenario.get("limit", [])
        ),
        "churn": lambda: churn_section(by_scenario.get("churn", []), CHURN_POLICIES, out),
        "mig": lambda: mig_section(by_scenario.get("mig", []), [label for label, _, _ in MIG_RUNS], out),
        "nvlink": lambda: nvlink_section(by_scenario.get("nvlink", []), NVLINK_POLICIES, out),
        "cost": lambda: cost_section(
            by_scenario.get("cost", []), COST_POLICIES, config.cost_ratios, out, by_scenario.get("cost-spot", [])
        ),
    }
    sections = {name: make() for name, make in build.items() if name in config.sections}
    speed_started = time.perf_counter()
    if "speed" in config.sections:
        log("speed: kernel")
        kernel = speed.kernel_times(config.kernel_nodes, config.kernel_calls, config.reference_calls)
        log("speed: HTTP")
        http = speed.http_latency(config.http_nodes, config.http_requests)
        sections["speed"] = speed_section(kernel, http, out)
    info = machine()
    info.update(
        {
            "simulation_seconds": round(sim_seconds, 1),
            "simulation_runs": len(jobs),
            "runs_from_cache": cached,
            "speed_seconds": round(time.perf_counter() - speed_started, 1),
            "total_seconds": round(time.perf_counter() - started, 1),
        }
    )
    clusters = {
        "mig": mig_cluster().scaled(config.scale).describe(),
        "nvlink": nvlink_cluster().scaled(config.scale).describe(),
        "cost": cost_cluster().scaled(config.scale).describe(),
        "churn": churn_cluster().scaled(config.scale).describe(),
    }
    report: dict[str, object] = {
        "config": asdict(config),
        "machine": info,
        "clusters": clusters,
        "sections": {name: s.to_json() for name, s in sections.items()},
    }
    (out / "results.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    text = render(asdict(config), info, sections, clusters) + soak_text(out, ROOT) + separate_runs_text(out)
    (out / "REPORT.md").write_text(text, encoding="utf-8")
    if config.update_readme and "openb" in sections:
        link = _relative_link(out / "REPORT.md")
        stamp = f"({info['date']}, commit `{str(info['commit'])[:12]}`.)"
        block = readme_block(sections["openb"], link, seeds_text(config.openb_seeds), stamp)
        if not update_readme(ROOT / "README.md", block):
            log("README.md has no bench:openb markers; not updated")
    log(f"bench {config.label}: done in {info['total_seconds']} s")
    return report


def _relative_link(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.resolve().as_posix()
