"""`python -m gpupack.bench.throughput_cli`: a throughput run of chosen sizes and extenders (`bench.throughput`),
printed as the report's markdown, for experiments; `gpupack bench --throughput` writes the committed report."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpupack.bench.bench_report import machine
from gpupack.bench.throughput import DIAGNOSTICS, EXTENDERS, ThroughputConfig, render_markdown, run_throughput


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print; exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, action="append", help="cluster size (repeat; default 500 and 5000)")
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    choices = (*EXTENDERS, *DIAGNOSTICS)
    parser.add_argument("--extenders", default=",".join(EXTENDERS), help="comma-separated, of " + ", ".join(choices))
    args = parser.parse_args(argv)
    extenders = tuple(e for e in args.extenders.split(",") if e)
    if not extenders or any(e not in choices for e in extenders):
        parser.error(f"--extenders: choose from {', '.join(choices)}")
    config = ThroughputConfig(tuple(args.nodes or (500, 5000)), args.pods, args.rounds, extenders=extenders)
    results = run_throughput(config, log=lambda text: print(text, file=sys.stderr, flush=True))
    print(render_markdown(results, machine(), config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
