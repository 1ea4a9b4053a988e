"""Filter latency while something scrapes the extender, beside the same soak without (#13 item 8).

`python -m gpupack.bench.soak_scrape [--calls N] [--rounds R] [--out FILE]` runs the soak (`bench/soak.py`)
once per variant and round, alternating variants within each round so that drift of the machine's speed
falls on every variant alike:

- `none`: nobody scrapes;
- `/metrics` back to back, every 0.1 s and every 1 s, from a process of its own;
- `/healthz` back to back: the same scraper on an endpoint that does no work, a control that shows what
  any stream of HTTP requests costs the server and the clients on this machine.

The table gives each variant's filter p50 / p99 as the median over rounds and its change against `none`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gpupack.bench.soak import SoakConfig, SoakResult, run, say


@dataclass(frozen=True)
class Variant:
    """One way of scraping during a soak."""

    name: str
    interval: float | None  # None: nobody scrapes
    path: str = "metrics"

    @property
    def key(self) -> str:
        """The variant's short name on the command line: `none`, `metrics-0.1`, `healthz-0`."""
        return "none" if self.interval is None else f"{self.path}-{self.interval:g}"


VARIANTS = (
    Variant("none", None),
    Variant("/metrics back to back", 0.0),
    Variant("/metrics every 0.1 s", 0.1),
    Variant("/metrics every 1 s", 1.0),
    Variant("/healthz back to back (control)", 0.0, "healthz"),
)


def measure(base: SoakConfig, rounds: int, variants: Sequence[Variant] = VARIANTS) -> dict[str, list[SoakResult]]:
    """Every variant once per round, in order, `rounds` times."""
    results: dict[str, list[SoakResult]] = {v.name: [] for v in variants}
    for round_index in range(rounds):
        for variant in variants:
            say(f"round {round_index + 1}/{rounds}: {variant.name}")
            config = replace(base, scrape_interval=variant.interval, scrape_path=variant.path)
            results[variant.name].append(run(config))
    return results


def median_filter_ms(runs: list[SoakResult], quantile: str) -> float:
    """The median over runs of one filter latency quantile."""
    return statistics.median(r.latency_ms["filter"][quantile] for r in runs)


def change(value: float, base: float) -> str:
    """`value` against `base` in percent, signed."""
    return f"{(value - base) / base * 100:+.1f} %"


def each_run(runs: list[SoakResult], quantile: str) -> str:
    """Every run's filter latency quantile, comma-separated."""
    return ", ".join(f"{r.latency_ms['filter'][quantile]:.1f}" for r in runs)


def table(results: dict[str, list[SoakResult]]) -> list[str]:
    """Markdown rows: change against `none` first, then the medians and the scrapes per run."""
    base = {q: median_filter_ms(results["none"], q) for q in ("p50", "p99")}
    rows = [
        "| scraping | filter p50 change | filter p99 change | p50 ms (runs) | p99 ms (runs) | scrapes per run |",
        "|---|---:|---:|---|---|---:|",
    ]
    for variant in (v for v in VARIANTS if v.name in results):
        runs = results[variant.name]
        changes = [change(median_filter_ms(runs, q), base[q]) if variant.interval is not None else "—" for q in base]
        spreads = [f"{median_filter_ms(runs, q):.1f} ({each_run(runs, q)})" for q in base]
        scrapes = statistics.median(r.latency_ms.get("metrics", {}).get("count", 0) for r in runs)
        rows.append(f"| {variant.name} | {changes[0]} | {changes[1]} | {spreads[0]} | {spreads[1]} | {scrapes:,.0f} |")
    return rows


def provenance() -> str:
    """Commit, date and machine of this run."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"commit {commit.stdout.strip() or 'unknown'}, {when}, {platform.processor() or platform.machine()}, " + (
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}"
    )


def markdown(base: SoakConfig, rounds: int, results: dict[str, list[SoakResult]]) -> str:
    """The report: how it was run, the table, and whether every run passed its own checks."""
    failed = [v for v, runs in results.items() for r in runs if not r.ok]
    return "\n".join(
        [
            "# Soak: filter latency while the extender is scraped",
            "",
            f"`python -m gpupack.bench.soak_scrape --calls {base.calls} --rounds {rounds} --variants "
            f"{','.join(v.key for v in VARIANTS if v.name in results)}` — {provenance()}.",
            f"{base.calls:,} calls per run from {base.clients} closed-loop clients over {base.nodes:,} nodes; "
            "variants alternate within each round; each cell is the median over rounds (each run's value in "
            "brackets).",
            "",
            *table(results),
            "",
            f"Every run's own checks (no errors, no invariant violations, bounded RSS): "
            f"{'pass' if not failed else 'FAILED in ' + ', '.join(sorted(set(failed)))}.",
            "",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the variants and write the report."""
    parser = argparse.ArgumentParser(prog="python -m gpupack.bench.soak_scrape", description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per run (default 20000)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of every variant (default 2)")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--out", default="bench/results/soak-metrics-scrape.md")
    keys = [v.key for v in VARIANTS]
    parser.add_argument("--variants", default=",".join(keys), help=f"comma-separated, `none` first: {', '.join(keys)}")
    args = parser.parse_args(argv)
    chosen = [v for v in VARIANTS if v.key in args.variants.split(",")]
    if not chosen or chosen[0].key != "none" or len(chosen) != len(args.variants.split(",")):
        parser.error(f"--variants: `none` and any of {', '.join(keys[1:])}")
    base = SoakConfig(calls=args.calls, clients=args.clients, nodes=args.nodes)
    results = measure(base, args.rounds, chosen)
    text = markdown(base, args.rounds, results)
    Path(args.out).write_text(text)
    print(text)
    return 0 if all(r.ok for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
