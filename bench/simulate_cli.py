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
    median = result["median"]
    assert isinstance(median, dict)
    print(f"policy {result['policy']}, protocol {result['protocol']}, {result['gpus_total']} GPUs")
    runs = result["runs"]
    assert isinstance(runs, list)
    for run_result in runs:
        print(
            f"  seed {run_result['seed']}: {run_result['pods_scheduled']}/{run_result['pods_submitted']} pods "
            f"placed, allocated {run_result['alloc_pct_at_100']} % at arrived 100 %, "
            f"{run_result['alloc_pct_at_130']} % at 130 %"
        )
    print(f"median unallocated: {median['unallocated_pct_at_100']} % at 100 %, "
          f"{median['unallocated_pct_at_130']} % at 130 %; {result['pods_per_second']} pods/s")  # fmt: skip
    return 0
