"""`gpupack simulate`: load a trace, run one policy, print JSON or a summary."""

from __future__ import annotations

import argparse
import sys

import orjson

from gpupack.bench.plots import allocation_curves, time_series_panels
from gpupack.scoring.policies import POLICY_NAMES
from gpupack.sim.churn import ChurnConfig
from gpupack.sim.load import load_trace
from gpupack.sim.runs import simulate
from gpupack.sim.simulate import make_policy, with_dynamic_mig
from gpupack.sim.workload import TraceError


def run(args: argparse.Namespace) -> int:
    """Run `gpupack simulate`; exit code 2 on bad input."""
    if args.policy.removesuffix("+besteffort") not in POLICY_NAMES and not args.policy.startswith("gpupack["):
        print(f"gpupack simulate: unknown policy {args.policy!r}; choose from {', '.join(POLICY_NAMES)}",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        make_policy(args.policy, [])  # weights of gpupack[...] are checked before the trace is read
        trace = load_trace(args.nodes, args.pods)
    except (OSError, TraceError, ValueError) as exc:
        print(f"gpupack simulate: {exc}", file=sys.stderr)
        return 2
    if args.mig == "dynamic":
        trace = with_dynamic_mig(trace)
    try:
        result = simulate(
            trace, args.policy, args.protocol, args.seeds, show_progress=sys.stderr.isatty(), order_file=args.order,
            churn=ChurnConfig(load=getattr(args, "load", ChurnConfig.load)),
        )  # fmt: skip
    except (OSError, TraceError, ValueError) as exc:
        print(f"gpupack simulate: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        plot(result, args.plot)
    if args.json:
        sys.stdout.write(orjson.dumps(result).decode() + "\n")
        return 0
    print("\n".join(summary_lines(result)))
    return 0


def plot(result: dict[str, object], path: str) -> None:
    """Every seed of the run, one line each (a stated choice: no seed is left out): the allocation curve,
    or for churn the rejections, stranded GPUs and GPUs in use over time."""
    policy, protocol, runs = result["policy"], result["protocol"], result["runs"]
    assert isinstance(runs, list)
    if protocol != "churn":
        allocation_curves([result], path, title=f"policy {policy}, protocol {protocol}: allocation vs arrived, "
                          f"every seed ({len(runs)})", xlim=(0, 132), ylim=(0, 100), every_seed=True)  # fmt: skip
        return
    panels: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for key, name in (("rejected", "pods rejected (cumulative)"), ("stranded_gpus", "stranded GPUs"),
                      ("in_use_pct", "GPUs in use %")):  # fmt: skip
        panels[name] = {f"seed {r['seed']}": [(s["time"], s[key]) for s in r["samples"]] for r in runs}
    time_series_panels(panels, path, "time (mean inter-arrival gaps)", f"policy {policy}, protocol churn: every seed")


def summary_lines(result: dict[str, object]) -> list[str]:
    """The human summary of `simulate`'s result: per seed the allocation at arrived = 100 % and 130 %
    (fgd protocol); for a replay, which runs the file once in its order, where it ended."""
    runs = result["runs"]
    median = result["median"]
    assert isinstance(runs, list) and isinstance(median, dict)
    lines = [f"policy {result['policy']}, protocol {result['protocol']}, {result['gpus_total']} GPUs"]
    if result["protocol"] == "replay":
        for run_result in runs:
            arrived, allocated = run_result["curve"][-1] if run_result["curve"] else (0.0, 0.0)
            lines.append(
                f"  file order, once: {run_result['pods_scheduled']}/{run_result['pods_submitted']} pods placed; "
                f"requests add up to {arrived:.1f} % of the GPUs, {allocated:.1f} % allocated at the end"
            )
        lines.append(f"{result['pods_per_second']} pods/s")
        return lines
    if result["protocol"] == "churn":
        return lines + churn_lines(runs, median, result["pods_per_second"])
    for run_result in runs:
        lines.append(
            f"  seed {run_result['seed']}: {run_result['pods_scheduled']}/{run_result['pods_submitted']} pods "
            f"placed, allocated {_pct(run_result['alloc_pct_at_100'])} at arrived 100 %, "
            f"{_pct(run_result['alloc_pct_at_130'])} at 130 %"
        )
    lines.append(
        f"median unallocated: {_pct(median['unallocated_pct_at_100'])} at 100 %, "
        f"{_pct(median['unallocated_pct_at_130'])} at 130 %; {result['pods_per_second']} pods/s"
    )
    return lines


def churn_lines(runs: list, median: dict, pods_per_second: object) -> list[str]:
    """Per seed: pods rejected (by profile), mean stranded GPUs and GPUs in use, large-profile placeability."""
    lines = []
    for r in runs:
        summary = r["summary"]
        by_profile = ", ".join(f"{profile} {count}" for profile, count in r["rejected_by_profile"].items())
        placeable = ", ".join(
            f"{key.removeprefix('placeable_').removesuffix('_pct')} {value} %"
            for key, value in summary.items()
            if key.startswith("placeable_")
        )
        lines.append(
            f"  seed {r['seed']}: {r['pods_scheduled']}/{r['pods_submitted']} pods placed after the warm-up, "
            f"{summary['rejected']} rejected ({by_profile or 'none'}); GPUs in use {summary.get('mean_in_use_pct')} %, "
            f"stranded GPUs {summary.get('mean_stranded_gpus')} (means over time); placeable: {placeable or '-'}"
        )
    lines.append(f"median rejected: {median['rejected']} pods ({median['rejected_pct']} %); {pods_per_second} pods/s")
    return lines


def _pct(value: object) -> str:
    """A percentage, or `-` when the run never got there."""
    return "-" if value is None else f"{value} %"
