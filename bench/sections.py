"""The bench report's sections: aggregate job results over seeds into tables, findings and plots.

Every section returns a `Section`; the tables hold exactly the numbers REPORT.md shows and results.json
saves. Findings compare gpupack with every baseline on each headline metric and say plainly where
gpupack is not better.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from gpupack.bench import plots
from gpupack.bench.markdown import Table
from gpupack.bench.paired import PerSeed, paired

Result = Mapping[str, Any]  # one run's results as JSON gives them back: values untyped, as from json.loads


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


def run_of(result: Result) -> dict[str, Any]:
    run = result["run"]
    assert isinstance(run, dict)
    return run


def alloc_at_100(result: Result) -> float | None:
    """Allocation % at arrived 100 % (None when the run never got there)."""
    value = run_of(result)["alloc_pct_at_100"]
    return float(value) if value is not None else None


def alloc_at_end(result: Result) -> float:
    """Allocation % at the last pod of the run."""
    curve = run_of(result)["curve"]
    assert isinstance(curve, list) and curve
    return float(curve[-1][1])


def group(results: Iterable[Result], *keys: str) -> dict[tuple[object, ...], list[Result]]:
    """Results grouped by the values of `keys`, seeds in ascending order."""
    out: dict[tuple[object, ...], list[Result]] = defaultdict(list)
    for r in sorted(results, key=lambda r: int(r["seed"])):
        out[tuple(r[k] for k in keys)].append(r)
    return out


def curve_entry(label: str, results: Sequence[Result]) -> dict[str, Any]:
    """What plots.allocation_curves takes: the first seed's curve under `label`."""
    return {"policy": label, "runs": [run_of(results[0])]}


def medians(values: Mapping[str, PerSeed]) -> dict[str, float]:
    """The median of each policy's per-seed values (policies without any left out), for the plots."""
    out = {name: median(seeds.values()) for name, seeds in values.items()}
    return {name: value for name, value in out.items() if value is not None}


def per_seed(results: Iterable[Result], value: Callable[[Result], float | None]) -> dict[int, float | None]:
    """`value` of each run, by seed (what `compare` pairs)."""
    return {int(r["seed"]): value(r) for r in results}


def compare(
    section: Section,
    what: str,
    values: Mapping[str, PerSeed],
    higher_is_better: bool,
    unit: str = " %",
) -> None:
    """Add one finding per baseline: gpupack's per-seed values of `what` paired with the baseline's.

    A finding is `better` / `worse` only when the paired sign test says so (`bench.paired`); a
    difference inside the seed noise is a tie, listed with the not-better ones.
    """
    mine = values.get("gpupack")
    if not mine:
        return
    for name, theirs in values.items():
        if name == "gpupack" or not theirs:
            continue
        result = paired(mine, theirs, higher_is_better)
        if not result.diffs:
            continue
        text = (
            f"{what}: gpupack {median(mine.values())}{unit} vs {name} {median(theirs.values())}{unit} "
            f"(medians): **{result.verdict}**; {result.describe(unit)}"
        )
        (section.better if result.verdict == "better" else section.not_better).append(text)


def slim(run: Mapping[str, object], keep_curve: bool) -> dict[str, object]:
    """A run as saved in results.json: the curve only for the first seed."""
    return {k: v for k, v in run.items() if k != "curve" or keep_curve}


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
    failed: dict[str, list[Mapping[str, int]]] = {}
    alloc: dict[str, PerSeed] = {}
    stranded: dict[str, PerSeed] = {}
    for label in labels:
        runs = by.get((label,), [])
        if not runs:
            continue
        alloc[label] = per_seed(runs, alloc_at_100)
        stranded[label] = per_seed(runs, lambda r: r["stranding"]["stranded_pct"])
        strand = [r["stranding"] for r in runs]
        table.add(
            label,
            median(alloc[label].values()),
            median(int(run_of(r)["pods_submitted"]) - int(run_of(r)["pods_scheduled"]) for r in runs),
            median(s["with_free_slices"] for s in strand),
            median(s["stranded"] for s in strand),
            median(stranded[label].values()),
        )
        failed[label] = [r["failed_by_profile"] for r in runs]
    by_profile = mean_per_profile_table("failed pods (mean per seed)", failed)
    section.tables = {"mig": table, "mig_failed_by_profile": by_profile}
    compare(section, "MIG, compute-slice allocation % at arrived 100 %", alloc, higher_is_better=True)
    compare(section, "MIG, stranded GPUs % (free slices no pending profile fits)", stranded, higher_is_better=False)
    entries = [curve_entry(label, by[(label,)]) for label in labels if by.get((label,))]
    top = max(float(e["runs"][0]["curve"][-1][0]) for e in entries) + 2
    plots.allocation_curves(
        entries,
        out / "mig_curves.png",
        "MIG: compute-slice allocation vs arrived (first seed)",
        xlim=(0, top),
        ylim=(0, 100),
    )
    plots.bar_chart(
        medians(alloc),
        out / "mig_alloc.png",
        "allocation % at arrived 100 %",
        "MIG: compute-slice allocation (higher is better)",
    )
    plots.bar_chart(
        medians(stranded),
        out / "mig_stranded.png",
        "stranded GPUs %",
        "MIG: GPUs whose free slices fit no pending profile (lower is better)",
    )
    section.plots += ["mig_curves.png", "mig_alloc.png", "mig_stranded.png"]
    firsts = {label: by[(label,)][0] for label in labels if by.get((label,))}
    grids = {label: first["occupancy"] for label, first in firsts.items() if "occupancy" in first}
    if grids:
        plots.mig_occupancy(grids, out / "mig_occupancy.png", "MIG slot occupancy of a sample of partitioned GPUs")
        section.plots.append("mig_occupancy.png")
    section.data["runs"] = {label: [slim(run_of(r), i == 0) for i, r in enumerate(by[(label,)])] for (label,) in by}
    return section


def profile_order(label: str) -> tuple[int, str]:
    """MIG profiles smallest first (`1g.10gb` before `7g.80gb`); anything else after them."""
    head = label.split("g.", 1)[0].split(" ", 1)[0]
    return (int(head), label) if head.isdigit() else (99, label)


def mean_per_profile_table(title: str, counts: Mapping[str, Sequence[Mapping[str, int]]]) -> Table:
    """One row per MIG profile, one column per label: the label's count per run (`counts[label]`, one
    mapping of profile -> count per run), as a mean over its runs."""
    means: dict[str, dict[str, float]] = {}
    for label, runs in counts.items():
        totals: Counter[str] = Counter()
        for run in runs:
            totals.update(run)
        means[label] = {profile: round(count / len(runs), 1) for profile, count in totals.items()}
    table = Table([title, *means])
    for profile in sorted({p for m in means.values() for p in m}, key=profile_order):
        table.add(profile, *[means[label].get(profile, 0) for label in means])
    return table


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
    metrics: dict[str, dict[str, PerSeed]] = {"alloc": {}, "linked": {}, "score": {}}
    for policy in policies:
        runs = by.get((policy,), [])
        if not runs:
            continue
        metrics["alloc"][policy] = per_seed(runs, alloc_at_100)
        metrics["linked"][policy] = per_seed(runs, lambda r: r["links"]["all_nvlinked_pct"])
        metrics["score"][policy] = per_seed(runs, lambda r: r["links"]["mean_link_score_vs_best_pct"])
        table.add(
            policy,
            median(metrics["alloc"][policy].values()),
            median(r["links"]["multi_gpu_pods"] for r in runs),
            median(metrics["linked"][policy].values()),
            median(metrics["score"][policy].values()),
        )
    section.tables = {"nvlink": table}
    compare(section, "NVLink, allocation % at arrived 100 %", metrics["alloc"], higher_is_better=True)
    compare(section, "NVLink, multi-GPU pods with all pairs NVLinked %", metrics["linked"], higher_is_better=True)
    compare(section, "NVLink, link score vs best free set %", metrics["score"], higher_is_better=True)
    entries = [curve_entry(p, by[(p,)]) for p in policies if by.get((p,))]
    plots.allocation_curves(entries, out / "nvlink_curves.png", "NVLink cluster: allocation vs arrived (first seed)")
    plots.grouped_bars(
        {
            "all pairs NVLinked %": medians(metrics["linked"]),
            "link score vs best %": medians(metrics["score"]),
        },
        out / "nvlink_links.png",
        "%",
        "NVLink quality of multi-GPU pods (higher is better)",
    )
    section.plots += ["nvlink_curves.png", "nvlink_links.png"]
    section.data["runs"] = {p: [slim(run_of(r), i == 0) for i, r in enumerate(by[(p,)])] for (p,) in by}
    return section


# ----------------------------------------------------------------------------- cost
COST_COLUMNS = (
    ("busy_nodes", "busy nodes"),
    ("busy_node_cost_per_hour", "busy-node cost $/h"),
    ("busy_cost_pct", "% of cluster cost"),
    ("non_interruptible_pods_on_spot_pct", "non-interruptible pods on spot %"),
    ("interruptible_gpu_demand_on_spot_pct", "interruptible GPU demand on spot %"),
)


def cost_of(result: Result, key: str) -> float | None:
    """One number of a run's cost block."""
    cost = result["cost"]
    assert isinstance(cost, dict)
    return cost[key]


def cost_section(
    results: Sequence[Result], policies: Sequence[str], ratios: Sequence[float], out: Path, spot: Sequence[Result] = ()
) -> Section:
    """Hourly cost of the nodes in use and spot placement, per load level and policy; with `spot` (CostSpotJob
    results) also the policies that keep non-interruptible pods off spot, compared at equal risk."""
    section = Section()
    by = group(results, "ratio", "policy")
    table = Table(["load (x capacity)", "policy", "alloc % at end", *[label for _, label in COST_COLUMNS]])
    busy: dict[str, dict[str, float]] = {}
    for ratio in ratios:
        values: dict[str, dict[str, PerSeed]] = defaultdict(dict)  # per-seed values, paired by `compare`
        for policy in policies:
            runs = by.get((ratio, policy), [])
            if not runs:
                continue
            row = {key: median(cost_of(r, key) for r in runs) for key, _ in COST_COLUMNS}
            values["alloc"][policy] = per_seed(runs, alloc_at_end)
            for key, _ in COST_COLUMNS:
                values[key][policy] = per_seed(runs, partial(cost_of, key=key))
            table.add(ratio, policy, median(values["alloc"][policy].values()), *[row[key] for key, _ in COST_COLUMNS])
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
        busy[f"load {ratio}"] = medians(values["busy_node_cost_per_hour"])
        busy[f"load {ratio}"].update(equal_risk_rows(section, table, spot, ratio))
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
        f"{ratio}/{p}": [slim(run_of(r), i == 0) for i, r in enumerate(by[(ratio, p)])] for (ratio, p) in by
    }
    return section


def equal_risk_rows(section: Section, table: Table, spot: Sequence[Result], ratio: float) -> dict[str, float]:
    """Rows of the spot-practice runs at `ratio` added to the cost table, gpupack's cost profile compared seed by
    seed with the taint baselines (bench.equal_risk); the median busy-node $/h of each, for the bar chart."""
    from gpupack.bench.equal_risk import BASELINES_AT_ZERO_RISK, CONTENDER

    by = group([r for r in spot if r["ratio"] == ratio], "policy")
    busy_cost: dict[str, PerSeed] = {}
    alloc: dict[str, PerSeed] = {}
    for (policy,), runs in by.items():
        runs_of = [r["cost_spot"] for r in runs]
        busy_cost[str(policy)] = per_seed(runs, lambda r: r["cost_spot"]["busy_cost_per_hour"])
        alloc[str(policy)] = per_seed(runs, lambda r: r["cost_spot"]["alloc_pct"])
        med = {k: median(float(run[k]) for run in runs_of) for k in (
            "alloc_pct", "busy_nodes", "busy_cost_per_hour", "cluster_cost_per_hour", "firm_pods_on_spot_pct",
            "flexible_gpus_on_spot_pct")}  # fmt: skip
        busy, cluster = med["busy_cost_per_hour"], med["cluster_cost_per_hour"]
        busy_share = round(100 * busy / cluster, 2) if busy is not None and cluster is not None else None
        table.add(ratio, str(policy), med["alloc_pct"], med["busy_nodes"], busy, busy_share,
                  med["firm_pods_on_spot_pct"], med["flexible_gpus_on_spot_pct"])  # fmt: skip
    rivals = [name for name in (CONTENDER, *BASELINES_AT_ZERO_RISK) if name in busy_cost]
    if CONTENDER in rivals:
        where = f"cost at equal risk ({CONTENDER} as gpupack; no non-interruptible pod on spot), load {ratio}"
        renamed = {("gpupack" if n == CONTENDER else n): busy_cost[n] for n in rivals}
        compare(section, f"{where}, busy-node cost $/h", renamed, False, unit="")
        compare(section, f"{where}, allocation %", {("gpupack" if n == CONTENDER else n): alloc[n] for n in rivals},
                True)  # fmt: skip
    return {str(policy): m for policy, m in medians(busy_cost).items()}


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
        )  # fmt: skip
    h_table = Table(["nodes", "mode", "server", "body KiB", "requests", "p50 ms", "p99 ms", "p50 / bare", "p99 / bare"])
    by = group_rows(http)
    for (nodes, mode), rows in by.items():
        for server, r in rows.items():
            h_table.add(
                nodes, mode, server, r.get("body_kib"), r.get("requests"), r.get("p50_ms"), r.get("p99_ms"),
                r.get("p50_vs_bare"), r.get("p99_vs_bare"),
            )  # fmt: skip
    section.tables = {"speed_kernel": k_table, "speed_http": h_table}
    if kernel:
        plots.speed_lines(kernel, out / "speed_kernel.png", "Kernel time per decision (1-GPU pod)")
        section.plots.append("speed_kernel.png")
    if http:
        plots.grouped_bars(
            {f"{n} nodes, {m}": {s: float(v.get("p50_ms", 0)) for s, v in rows.items()} for (n, m), rows in by.items()},
            out / "speed_http.png",
            "p50 ms",
            "/filter latency over loopback (p50)",
        )
        section.plots.append("speed_http.png")
    section.data = {"kernel": list(kernel), "http": list(http)}
    return section


def group_rows(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[object, object], dict[str, Mapping[str, Any]]]:
    """HTTP rows keyed by (nodes, mode), then by server."""
    out: dict[tuple[object, object], dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for r in rows:
        out[(r["nodes"], r["mode"])][str(r["server"])] = r
    return out
