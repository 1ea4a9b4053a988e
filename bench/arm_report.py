"""What the two-arm benches (bench.preemption, bench.gangs) share: seeds from the command line, runs grouped by
workload, the tail of the report (the paired summary, then a per-seed table per workload) and its files."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

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
