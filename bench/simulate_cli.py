"""`gpupack simulate`: load a trace, run one policy, print JSON or a summary."""

from __future__ import annotations

import argparse
import sys

import orjson

from gpupack.bench.load import load_trace
from gpupack.bench.plots import allocation_curves
from gpupack.bench.simulate import make_policy, simulate, with_dynamic_mig
from gpupack.bench.workload import TraceError
from gpupack.scoring.policies import POLICY_NAMES


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
            trace, args.policy, args.protocol, args.seeds, show_progress=sys.stderr.isatty(), order_file=args.order
        )
    except (OSError, TraceError) as exc:
        print(f"gpupack simulate: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        allocation_curves([result], args.plot, title=f"{args.policy} ({args.protocol})")
    if args.json:
        sys.stdout.write(orjson.dumps(result).decode() + "\n")
        return 0
    print("\n".join(summary_lines(result)))
    return 0


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


def _pct(value: object) -> str:
    """A percentage, or `-` when the run never got there."""
    return "-" if value is None else f"{value} %"
