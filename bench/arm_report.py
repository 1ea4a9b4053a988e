"""What the two-arm benches (bench.preemption, bench.gangs) share: their common arguments, running the jobs,
runs grouped by workload, the tail of the report (the paired summary, then a per-seed table per workload), and the
files."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from gpupack.bench.jobs import Runnable
from gpupack.bench.markdown import Table

Runs = Mapping[str, Sequence[Mapping[str, Any]]]  # workload -> its runs, both arms, every seed


def seeds_arg(text: str) -> list[int]:
    """`42-51` or `42,44`."""
    if "-" in text:
        first, last = text.split("-", 1)
        return list(range(int(first), int(last) + 1))
    return [int(s) for s in text.split(",") if s]


def by_workload(done: Iterable[dict[str, object]], workloads: Sequence[str]) -> dict[str, list[dict[str, object]]]:
    """The finished runs grouped by their `workload`, in the order of `workloads`."""
    grouped: dict[str, list[dict[str, object]]] = {w: [] for w in workloads}
    for result in done:
        grouped[str(result["workload"])].append(result)
    return grouped


def report_tail(
    summary: Table, results: Runs, per_seed_table: Callable[[Sequence[Mapping[str, Any]]], Table], title: str
) -> list[str]:
    """The paired summary under `title`, then each workload's per-seed table."""
    parts = [title, summary.markdown()]
    for workload, runs in results.items():
        parts += [f"## {workload}: per seed", per_seed_table(runs).markdown()]
    return parts


def saved_runs(info: Mapping[str, object], command: str, summary: Table, results: Runs) -> dict[str, object]:
    """The JSON written beside the report: machine, command, summary and every run."""
    return {
        "machine": dict(info),
        "command": command,
        "summary": summary.to_json(),
        "runs": {w: [dict(r) for r in runs] for w, runs in results.items()},
    }


def write_report(out: Path, name: str, text: str, saved: Mapping[str, object]) -> Path:
    """`<out>/<name>.md` (the report's text) and `<out>/<name>.json`; returns the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    report = out / f"{name}.md"
    report.write_text(text, encoding="utf-8")
    (out / f"{name}.json").write_bytes(orjson.dumps(saved, option=orjson.OPT_INDENT_2))
    return report


def arguments(name: str, doc: str, traces: str) -> argparse.ArgumentParser:
    """The parser of `python -m gpupack.bench.<name>` with the arguments both benches take (`traces`: the
    default openb variants)."""
    parser = argparse.ArgumentParser(prog=f"python -m gpupack.bench.{name}", description=doc.split("\n")[0])
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--traces", default=traces, help="openb variants, comma-separated ('' for none)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--workers", type=int, default=2)
    return parser


Render = Callable[[Runs, Mapping[str, object], str], tuple[str, dict[str, object]]]


def run_and_write(name: str, jobs: Sequence[Runnable], workloads: Sequence[str], args: argparse.Namespace,
                  argv: Sequence[str] | None, render: Render) -> Path:  # fmt: skip
    """Run `jobs` on `args.workers`, render the report with the machine, the commit and the command, and
    write it under `args.out`; returns the report's path."""
    from gpupack.bench.bench_report import machine, run_all  # the full bench's imports, only when run

    started = time.perf_counter()
    print(f"bench.{name}: {len(jobs)} runs on {args.workers} workers", file=sys.stderr, flush=True)
    done = run_all(jobs, args.workers, lambda i, n: print(f"  runs done: {i}/{n}", file=sys.stderr, flush=True))
    info = machine() | {"seconds": round(time.perf_counter() - started)}  # its commit says if the tree differs
    command = f"python -m gpupack.bench.{name} " + " ".join(argv if argv is not None else sys.argv[1:])
    text, saved = render(by_workload(done, workloads), info, command.strip())
    return write_report(Path(args.out), name, text, saved)
