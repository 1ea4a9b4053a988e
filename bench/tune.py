"""Measure gpupack variants on the openb traces, on tuning seeds only (#15: never tune on what you report).

    python -m gpupack.bench.tune --seeds 0-41 --traces default,gpushare60 \
        --variant base='{}' --variant slow='{"mix_half_life": 8000}'

Each variant is a JSON object of `scoring.policies.GpupackArgs` fields (`weights` as a nested object);
`fgd` (oracle mix) always runs beside them. Every run stops at arrived = 100 % (the figure read) and is
cached in --cache (one JSON file per trace, resolved arguments, seed and code version: `cache_key`), so a
repeated or widened run only simulates what is new. Prints, per trace, each variant's median unallocated
GPU % and its paired comparison with fgd (`bench.paired`); the report seeds 42–51 are refused unless
--allow-report-seeds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gpupack.arguments import seed_list
from gpupack.bench.job_cache import code_fingerprint
from gpupack.bench.jobs import NODE_LIST, _nodes, _pods, pod_file, prefix_to_arrived
from gpupack.bench.paired import paired
from gpupack.scoring.policies import GpupackArgs, PolicySpec, gpupack
from gpupack.sim.protocol import fgd_order
from gpupack.sim.simulate import make_policy, run_once
from gpupack.sim.workload import Trace, gpu_milli_capacity

REPORT_SEEDS = frozenset(range(42, 52))
FGD = "fgd"
BASE = "base"  # a variant of this name is also compared with every other one


def policy_for(variant: str, args_json: str, pods: list) -> PolicySpec:
    """`fgd` with its oracle mix, or gpupack with the variant's arguments."""
    return make_policy(FGD, pods) if variant == FGD else gpupack(GpupackArgs(**json.loads(args_json)))


def cache_key(trace: str, variant: str, args_json: str, seed: int) -> str:
    """Names one run's result: the arguments as they resolve (so `{}` follows the defaults) and the source
    of the code that decides it (`bench.job_cache.code_fingerprint`), so a changed default or kernel runs
    again instead of reading back a stale figure."""
    fgd = "fgd, oracle of the submitted pods"
    what = fgd if variant == FGD else GpupackArgs(**json.loads(args_json)).model_dump_json()
    return hashlib.sha256(f"{trace}|{what}|{seed}|{code_fingerprint()}".encode()).hexdigest()[:20]


def run_one(job: tuple[str, str, str, str, int, str]) -> float | None:
    """Unallocated GPU % at arrived 100 % of one (traces folder, trace, variant, args, seed), cached."""
    traces_dir, trace, variant, args_json, seed, cache = job
    path = Path(cache) / f"{trace}-{seed}-{cache_key(trace, variant, args_json, seed)}.json"
    if path.exists():
        return json.loads(path.read_text())["unallocated"]
    nodes = list(_nodes(str(Path(traces_dir) / NODE_LIST)))
    pods = list(_pods(str(Path(traces_dir) / pod_file(trace))))
    workload = fgd_order(pods, gpu_milli_capacity(nodes), seed)
    order = prefix_to_arrived(workload, nodes, 100.0)
    result = run_once(Trace(nodes, pods), order, policy_for(variant, args_json, workload), seed)
    value = None if result.alloc_pct_at_100 is None else round(100.0 - result.alloc_pct_at_100, 4)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"trace": trace, "args": args_json, "seed": seed, "unallocated": value,
                                "seconds": round(result.seconds, 3)}))  # fmt: skip
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Run the variants and print the per-trace comparison with fgd."""
    from gpupack.bench.bench_report import OPENB_TRACES, default_traces_dir

    parser = argparse.ArgumentParser(prog="python -m gpupack.bench.tune")
    parser.add_argument("--seeds", type=seed_list, default=list(range(0, 42)))
    parser.add_argument("--traces", default=",".join(OPENB_TRACES))
    parser.add_argument("--variant", action="append", default=[], help="NAME=JSON of GpupackArgs fields")
    parser.add_argument("--cache", default="/tmp/gpupack-tune")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--allow-report-seeds", action="store_true")
    args = parser.parse_args(argv)
    if REPORT_SEEDS & set(args.seeds) and not args.allow_report_seeds:
        print("tune: seeds 42-51 are the report's; tune on others (or --allow-report-seeds)", file=sys.stderr)
        return 2
    variants = {FGD: "{}"}
    for item in args.variant:
        name, _, text = item.partition("=")
        GpupackArgs(**json.loads(text))  # bad fields fail before anything runs
        variants[name] = json.dumps(json.loads(text), sort_keys=True)
    traces = [t for t in args.traces.split(",") if t]
    jobs = [(str(default_traces_dir()), t, v, a, s, args.cache) for t in traces for v, a in variants.items()
            for s in args.seeds]  # fmt: skip
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        values = list(pool.map(run_one, jobs, chunksize=4))
    table: dict[tuple[str, str], dict[int, float | None]] = {}
    for (_, trace, variant, _, seed, _), value in zip(jobs, values, strict=True):
        table.setdefault((trace, variant), {})[seed] = value
    print(report(table, traces, list(variants)))
    return 0


def report(table: dict[tuple[str, str], dict[int, float | None]], traces: list[str], variants: list[str]) -> str:
    """Per trace and variant: median unallocated %, and gpupack − fgd paired (median, wins/losses/ties, p);
    then the same against the variant named `base`, when there is one."""
    lines = [f"{'trace':<12} {'variant':<16} {'median':>7} {'vs fgd':>7} {'W/L/T':>8} {'p':>7}"
             + (f" {'vs base':>7} {'W/L/T':>8} {'p':>7}" if BASE in variants else "")]  # fmt: skip
    sums: dict[str, list[float]] = {}
    for trace in traces:
        fgd = table[(trace, FGD)]
        for variant in variants:
            mine = table[(trace, variant)]
            med = statistics.median(v for v in mine.values() if v is not None)
            sums.setdefault(variant, []).append(med)
            if variant == FGD:
                lines.append(f"{trace:<12} {variant:<16} {med:7.3f}")
                continue
            line = f"{trace:<12} {variant:<16} {med:7.3f}" + _paired_columns(mine, fgd)
            if BASE in variants and variant != BASE:
                line += _paired_columns(mine, table[(trace, BASE)])
            lines.append(line)
    lines += [f"mean of medians {v:<16} {statistics.fmean(m):7.3f}" for v, m in sums.items()]
    return "\n".join(lines)


def _paired_columns(mine: dict[int, float | None], other: dict[int, float | None]) -> str:
    """mine − other paired by seed: median difference, wins/losses/ties, sign-test p."""
    pair = paired(mine, other, higher_is_better=False)
    return f" {pair.median_diff:+7.2f} {pair.counts():>8} {pair.p_value:7.3f}"


if __name__ == "__main__":
    raise SystemExit(main())
