"""The bench report's sections: aggregate job results over seeds into tables, findings and plots.

Every section returns a `Section`; the tables hold exactly the numbers REPORT.md shows and results.json
saves. Findings compare gpupack with every baseline on each headline metric and say plainly where
gpupack is not better.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpupack.bench import plots
from gpupack.bench.markdown import Table

# Published FGD-paper figures (ATC'23): unallocated GPU % at arrived = 100 %, median of 10 seeds
PUBLISHED_FGD: dict[str, dict[str, float]] = {
    "default": {
        "random": 13.75,
        "dot-product": 9.45,
        "gpu-clustering": 8.42,
        "gpu-packing": 8.20,
        "best-fit": 7.09,
        "fgd": 4.77,
    },
    "cpu050": {
        "random": 11.02,
        "dot-product": 6.94,
        "gpu-clustering": 6.52,
        "gpu-packing": 6.47,
        "best-fit": 6.42,
        "fgd": 5.00,
    },
    "gpushare40": {
        "random": 15.04,
        "dot-product": 10.66,
        "gpu-clustering": 10.18,
        "gpu-packing": 10.19,
        "best-fit": 8.53,
        "fgd": 6.05,
    },
    "gpuspec10": {
        "random": 13.69,
        "dot-product": 9.75,
        "gpu-clustering": 8.05,
        "gpu-packing": 7.77,
        "best-fit": 6.88,
        "fgd": 5.30,
    },
    "multigpu20": {
        "random": 13.16,
        "dot-product": 8.19,
        "gpu-clustering": 6.62,
        "gpu-packing": 6.49,
        "best-fit": 6.27,
        "fgd": 4.47,
    },
}

Result = Mapping[str, object]


@dataclass
class Section:
    """One scenario's tables, findings (gpupack vs baselines), plots and aggregated data."""

    tables: dict[str, Table] = field(default_factory=dict)
    better: list[str] = field(default_factory=list)
    not_better: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    data: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "tables": {name: t.to_json() for name, t in self.tables.items()},
            "gpupack_better": self.better,
            "gpupack_not_better": self.not_better,
            "plots": self.plots,
            **self.data,
        }


def median(values: Iterable[float | None]) -> float | None:
    """Median of the non-None values, 2 decimals; None when there are none."""
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None


def run_of(result: Result) -> dict[str, object]:
    run = result["run"]
    assert isinstance(run, dict)
    return run


def alloc_at_100(result: Result) -> float | None:
    """Allocation % at arrived 100 % (None when the run never got there)."""
    value = run_of(result)["alloc_pct_at_100"]
    return float(value) if value is not None else None  # type: ignore[arg-type]


def alloc_at_end(result: Result) -> float:
    """Allocation % at the last pod of the run."""
    curve = run_of(result)["curve"]
    assert isinstance(curve, list) and curve
    return float(curve[-1][1])


def group(results: Iterable[Result], *keys: str) -> dict[tuple[object, ...], list[Result]]:
    """Results grouped by the values of `keys`, seeds in ascending order."""
    out: dict[tuple[object, ...], list[Result]] = defaultdict(list)
    for r in sorted(results, key=lambda r: int(r["seed"])):  # type: ignore[call-overload]
        out[tuple(r[k] for k in keys)].append(r)
    return out


def curve_entry(label: str, results: Sequence[Result]) -> dict[str, object]:
    """What plots.allocation_curves takes: the first seed's curve under `label`."""
    return {"policy": label, "runs": [run_of(results[0])]}


def compare(
    section: Section, what: str, values: Mapping[str, float | None], higher_is_better: bool, unit: str = " %"
) -> None:
    """Add one finding per baseline: gpupack's value of `what` against the baseline's."""
    mine = values.get("gpupack")
    if mine is None:
        return
    for name, theirs in values.items():
        if name == "gpupack" or theirs is None:
            continue
        diff = round(mine - theirs, 2)
        gain = diff if higher_is_better else -diff
        text = f"{what}: gpupack {mine}{unit} vs {name} {theirs}{unit}"
        if gain > 0:
            section.better.append(f"{text} (better by {abs(diff)})")
        elif gain == 0:
            section.not_better.append(f"{text} (equal)")
        else:
            section.not_better.append(f"{text} (worse by {abs(diff)})")


# ----------------------------------------------------------------------------- openb
def openb_section(results: Sequence[Result], traces: Sequence[str], policies: Sequence[str], out: Path) -> Section:
    """Median unallocated GPU % at arrived 100 % per policy and trace, beside the published figures."""
    section = Section()
    by = group(results, "trace", "policy")
    table = Table(["policy", *[c for t in traces for c in (t, f"{t} paper")]])
    medians: dict[str, dict[str, float | None]] = {t: {} for t in traces}
    seconds = Table(["policy", "runs", "mean seconds per run", "mean pods per run"])
    for policy in policies:
        cells: list[float | None] = []
        for trace in traces:
            runs = by.get((trace, policy), [])
            value = median(100.0 - a for a in (alloc_at_100(r) for r in runs) if a is not None)
            medians[trace][policy] = value
            cells += [value, PUBLISHED_FGD.get(trace, {}).get(policy)]
        table.add(policy, *cells)
        runs = [r for t in traces for r in by.get((t, policy), [])]
        if runs:
            seconds.add(
                policy,
                len(runs),
                round(statistics.mean(float(run_of(r)["seconds"]) for r in runs), 2),  # type: ignore[arg-type]
                round(statistics.mean(int(run_of(r)["pods_submitted"]) for r in runs)),  # type: ignore[call-overload]
            )
    section.tables = {"openb_unallocated": table, "openb_seconds": seconds}
    for trace in traces:
        compare(section, f"openb {trace}, unallocated GPU % at arrived 100 %", medians[trace], higher_is_better=False)
        entries = [curve_entry(p, by[(trace, p)]) for p in policies if by.get((trace, p))]
        if entries:
            name = f"openb_curves_{trace}.png"
            plots.allocation_curves(entries, out / name, title=f"openb {trace}: allocation vs arrived (first seed)")
            section.plots.append(name)
    plots.grouped_bars(
        {t: {p: v for p, v in medians[t].items() if v is not None} for t in traces},
        out / "openb_unallocated.png",
        "unallocated GPU % at arrived 100 % (median)",
        "openb: unallocated GPUs (lower is better)",
    )
    section.plots.append("openb_unallocated.png")
    section.data["runs"] = {
        f"{t}/{p}": [_slim(run_of(r), keep_curve=i == 0) for i, r in enumerate(by[(t, p)])] for (t, p) in by
    }
    return section


def _slim(run: Mapping[str, object], keep_curve: bool) -> dict[str, object]:
    """A run as saved in results.json: the curve only for the first seed."""
    return {k: v for k, v in run.items() if k != "curve" or keep_curve}


def readme_block(section: Section, report_link: str, seeds: str, stamp: str) -> str:
    """The README's openb headline: the policies x traces table and a link to the full report."""
    table = section.tables["openb_unallocated"].markdown()
    return (
        f"Median unallocated GPU % at arrived = 100 % on the openb traces (fgd protocol, seeds {seeds}; "
        f"lower is better), beside the published FGD-paper figures (`paper`). {stamp}\n\n{table}\n\n"
        f"Full report (MIG, NVLink, cost and speed scenarios): [{report_link}]({report_link})"
    )


# ----------------------------------------------------------------------------- MIG
def mig_section(results: Sequence[Result], labels: Sequence[str], out: Path) -> Section:
    """Compute-slice allocation, failures by profile and stranded GPUs on the MIG cluster."""
    section = Section()
    by = group(results, "label")
    table = Table(
        [
            "policy",
            "alloc % at arrived 100 %",
            "pods failed",
            "GPUs with free slices",
            "stranded GPUs",
            "stranded % of GPUs",
        ]
    )
    failed: dict[str, dict[str, float]] = {}
    alloc: dict[str, float | None] = {}
    stranded: dict[str, float | None] = {}
    for label in labels:
        runs = by.get((label,), [])
        if not runs:
            continue
        alloc[label] = median(alloc_at_100(r) for r in runs)
        strand = [r["stranding"] for r in runs]
        stranded[label] = median(s["stranded_pct"] for s in strand)  # type: ignore[index]
        table.add(
            label,
            alloc[label],
            median(int(run_of(r)["pods_submitted"]) - int(run_of(r)["pods_scheduled"]) for r in runs),  # type: ignore[call-overload]
            median(s["with_free_slices"] for s in strand),
            median(s["stranded"] for s in strand),  # type: ignore[index]
            stranded[label],
        )
        totals: dict[str, int] = defaultdict(int)
        for r in runs:
            for profile, count in r["failed_by_profile"].items():  # type: ignore[attr-defined]
                totals[profile] += count
        failed[label] = {p: round(c / len(runs), 1) for p, c in totals.items()}
    profiles = sorted({p for f in failed.values() for p in f}, key=_profile_order)
    by_profile = Table(["failed pods (mean per seed)", *failed])
    for profile in profiles:
        by_profile.add(profile, *[failed[label].get(profile, 0) for label in failed])
    section.tables = {"mig": table, "mig_failed_by_profile": by_profile}
    compare(section, "MIG, compute-slice allocation % at arrived 100 %", alloc, higher_is_better=True)
    compare(section, "MIG, stranded GPUs % (free slices no pending profile fits)", stranded, higher_is_better=False)
    entries = [curve_entry(label, by[(label,)]) for label in labels if by.get((label,))]
    top = max(float(e["runs"][0]["curve"][-1][0]) for e in entries) + 2  # type: ignore[index]
    plots.allocation_curves(
        entries,
        out / "mig_curves.png",
        "MIG: compute-slice allocation vs arrived (first seed)",
        xlim=(0, top),
        ylim=(0, 100),
    )
    plots.bar_chart(
        {k: v for k, v in alloc.items() if v is not None},
        out / "mig_alloc.png",
        "allocation % at arrived 100 %",
        "MIG: compute-slice allocation (higher is better)",
    )
    plots.bar_chart(
        {k: v for k, v in stranded.items() if v is not None},
        out / "mig_stranded.png",
        "stranded GPUs %",
        "MIG: GPUs whose free slices fit no pending profile (lower is better)",
    )
    section.plots += ["mig_curves.png", "mig_alloc.png", "mig_stranded.png"]
    firsts = {label: by[(label,)][0] for label in labels if by.get((label,))}
    grids = {label: first["occupancy"] for label, first in firsts.items() if "occupancy" in first}
    if grids:
        plots.mig_occupancy(grids, out / "mig_occupancy.png", "MIG slot occupancy of a sample of partitioned GPUs")  # type: ignore[arg-type]
        section.plots.append("mig_occupancy.png")
    section.data["runs"] = {label: [_slim(run_of(r), i == 0) for i, r in enumerate(by[(label,)])] for (label,) in by}
    return section


def _profile_order(label: str) -> tuple[int, str]:
    head = label.split("g.", 1)[0].split(" ", 1)[0]
    return (int(head), label) if head.isdigit() else (99, label)


# ----------------------------------------------------------------------------- NVLink
def nvlink_section(results: Sequence[Result], policies: Sequence[str], out: Path) -> Section:
    """NVLink quality of multi-GPU sets and allocation on the mixed-topology cluster."""
    section = Section()
    by = group(results, "policy")
    table = Table(
        [
            "policy",
            "alloc % at arrived 100 %",
            "multi-GPU pods placed",
            "all pairs NVLinked %",
            "link score vs best free set %",
        ]
    )
    metrics: dict[str, dict[str, float | None]] = {"alloc": {}, "linked": {}, "score": {}}
    for policy in policies:
        runs = by.get((policy,), [])
        if not runs:
            continue
        links = [r["links"] for r in runs]
        metrics["alloc"][policy] = median(alloc_at_100(r) for r in runs)
        metrics["linked"][policy] = median(x["all_nvlinked_pct"] for x in links)  # type: ignore[index]
        metrics["score"][policy] = median(x["mean_link_score_vs_best_pct"] for x in links)  # type: ignore[index]
        table.add(
            policy,
            metrics["alloc"][policy],
            median(x["multi_gpu_pods"] for x in links),  # type: ignore[index]
            metrics["linked"][policy],
            metrics["score"][policy],
        )
    section.tables = {"nvlink": table}
    compare(section, "NVLink, allocation % at arrived 100 %", metrics["alloc"], higher_is_better=True)
    compare(section, "NVLink, multi-GPU pods with all pairs NVLinked %", metrics["linked"], higher_is_better=True)
    compare(section, "NVLink, link score vs best free set %", metrics["score"], higher_is_better=True)
    entries = [curve_entry(p, by[(p,)]) for p in policies if by.get((p,))]
    plots.allocation_curves(entries, out / "nvlink_curves.png", "NVLink cluster: allocation vs arrived (first seed)")
    plots.grouped_bars(
        {
            "all pairs NVLinked %": {p: v for p, v in metrics["linked"].items() if v is not None},
            "link score vs best %": {p: v for p, v in metrics["score"].items() if v is not None},
        },
        out / "nvlink_links.png",
        "%",
        "NVLink quality of multi-GPU pods (higher is better)",
    )
    section.plots += ["nvlink_curves.png", "nvlink_links.png"]
    section.data["runs"] = {p: [_slim(run_of(r), i == 0) for i, r in enumerate(by[(p,)])] for (p,) in by}
    return section


# ----------------------------------------------------------------------------- cost
COST_COLUMNS = (
    ("busy_nodes", "busy nodes"),
    ("busy_node_cost_per_hour", "busy-node cost $/h"),
    ("busy_cost_pct", "% of cluster cost"),
    ("non_interruptible_pods_on_spot_pct", "non-interruptible pods on spot %"),
    ("interruptible_gpu_demand_on_spot_pct", "interruptible GPU demand on spot %"),
)


def cost_section(results: Sequence[Result], policies: Sequence[str], ratios: Sequence[float], out: Path) -> Section:
    """Hourly cost of the nodes in use and spot placement, per load level and policy."""
    section = Section()
    by = group(results, "ratio", "policy")
    table = Table(["load (x capacity)", "policy", "alloc % at end", *[label for _, label in COST_COLUMNS]])
    busy: dict[str, dict[str, float]] = {}
    for ratio in ratios:
        values: dict[str, dict[str, float | None]] = defaultdict(dict)
        for policy in policies:
            runs = by.get((ratio, policy), [])
            if not runs:
                continue
            row = {key: median(r["cost"][key] for r in runs) for key, _ in COST_COLUMNS}  # type: ignore[index]
            values["alloc"][policy] = median(alloc_at_end(r) for r in runs)
            for key, _ in COST_COLUMNS:
                values[key][policy] = row[key]
            table.add(ratio, policy, values["alloc"][policy], *[row[key] for key, _ in COST_COLUMNS])
        where = f"cost, load {ratio}"
        compare(section, f"{where}, busy-node cost $/h", values["busy_node_cost_per_hour"], False, unit="")
        compare(
            section,
            f"{where}, non-interruptible pods on spot %",
            values["non_interruptible_pods_on_spot_pct"],
            higher_is_better=False,
        )
        compare(
            section,
            f"{where}, interruptible GPU demand on spot %",
            values["interruptible_gpu_demand_on_spot_pct"],
            higher_is_better=True,
        )
        compare(section, f"{where}, allocation % at end", values["alloc"], higher_is_better=True)
        busy[f"load {ratio}"] = {p: v for p, v in values["busy_node_cost_per_hour"].items() if v is not None}
        entries = [curve_entry(p, by[(ratio, p)]) for p in policies if by.get((ratio, p))]
        name = f"cost_curves_{ratio}.png"
        plots.allocation_curves(
            entries,
            out / name,
            f"cost cluster, load {ratio}: allocation vs arrived (first seed)",
            xlim=(0, 100 * ratio + 2),
            ylim=(0, 100),
        )
        section.plots.append(name)
    section.tables = {"cost": table}
    plots.grouped_bars(
        busy, out / "cost_busy.png", "$ per hour", "Hourly cost of nodes holding a pod (lower is better)"
    )
    section.plots.append("cost_busy.png")
    section.data["runs"] = {
        f"{ratio}/{p}": [_slim(run_of(r), i == 0) for i, r in enumerate(by[(ratio, p)])] for (ratio, p) in by
    }
    return section


# ----------------------------------------------------------------------------- speed
def speed_section(kernel: Sequence[Mapping[str, object]], http: Sequence[Mapping[str, object]], out: Path) -> Section:
    """Kernel time per decision (numba vs reference) and HTTP filter latency (gpupack vs a bare handler)."""
    section = Section()
    k_table = Table(
        [
            "nodes", "policy", "numba ms", "numba ms, shape changed", "numba cold ms", "reference ms",
            "reference / numba (shape changed)", "reference calls", "same node chosen",
        ]
    )  # fmt: skip
    for r in kernel:
        k_table.add(
            r["nodes"], r["policy"], r["numba_ms"], r.get("numba_shape_changed_ms"), r.get("numba_cold_ms"),
            r["reference_ms"], r["ratio"], r["reference_calls"], r["same_choice"],
        )  # type: ignore[arg-type]  # fmt: skip
    h_table = Table(
        ["nodes", "mode", "server", "body KiB", "requests", "p50 ms", "p99 ms", "p50 / bare", "p99 / bare"]
    )
    by = group_rows(http)
    for (nodes, mode), rows in by.items():
        for server, r in rows.items():
            h_table.add(
                nodes, mode, server, r.get("body_kib"), r.get("requests"), r.get("p50_ms"), r.get("p99_ms"),
                r.get("p50_vs_bare"), r.get("p99_vs_bare"),
            )  # type: ignore[arg-type]  # fmt: skip
    section.tables = {"speed_kernel": k_table, "speed_http": h_table}
    if kernel:
        plots.speed_lines(kernel, out / "speed_kernel.png", "Kernel time per decision (1-GPU pod)")
        section.plots.append("speed_kernel.png")
    if http:
        plots.grouped_bars(
            {f"{n} nodes, {m}": {s: float(v.get("p50_ms", 0)) for s, v in rows.items()} for (n, m), rows in by.items()},  # type: ignore[arg-type]
            out / "speed_http.png",
            "p50 ms",
            "/filter latency over loopback (p50)",
        )
        section.plots.append("speed_http.png")
    section.data = {"kernel": list(kernel), "http": list(http)}
    return section


def group_rows(rows: Iterable[Mapping[str, object]]) -> dict[tuple[object, object], dict[str, Mapping[str, object]]]:
    """HTTP rows keyed by (nodes, mode), then by server."""
    out: dict[tuple[object, object], dict[str, Mapping[str, object]]] = defaultdict(dict)
    for r in rows:
        out[(r["nodes"], r["mode"])][str(r["server"])] = r
    return out
