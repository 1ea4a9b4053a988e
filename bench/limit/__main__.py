"""`python -m gpupack.bench.limit --trace default --seeds 0-3 [--packing]`: the limit of openb seeds, one
JSON line each (what `make bench` keeps per seed); the trace folder is $GPUPACK_OPENB_TRACES or
../shared/traces/openb, as for `gpupack bench`."""

from __future__ import annotations

import argparse
import sys

import orjson

from gpupack.arguments import seed_list
from gpupack.bench.bench_report import default_traces_dir
from gpupack.bench.jobs import LimitJob


def main(argv: list[str] | None = None) -> int:
    """Print the limit of each seed of the trace."""
    parser = argparse.ArgumentParser(prog="python -m gpupack.bench.limit", description=__doc__)
    parser.add_argument("--trace", default="default", help="openb trace variant (default, cpu050, ...)")
    parser.add_argument("--seeds", type=seed_list, default=[42], help="seeds, e.g. 0-41 or 42,43")
    parser.add_argument("--packing", action="store_true", help="also lay out and check an offline packing")
    args = parser.parse_args(argv)
    traces = default_traces_dir()
    if not (traces / "openb_node_list_gpu_node.csv").is_file():
        print(f"openb trace not found in {traces}", file=sys.stderr)
        return 2
    for seed in args.seeds:
        result = LimitJob(str(traces), args.trace, seed, packing=args.packing).run()
        print(orjson.dumps(result).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
