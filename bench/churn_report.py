"""The churn section of the bench report: MIG pods arriving and completing, rejections per seed and profile."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

from gpupack.bench import plots
from gpupack.bench.markdown import Table
from gpupack.bench.sections import (
    Result,
    Section,
    compare,
    group,
    mean_per_profile_table,
    median,
    per_seed,
    run_of,
)

REFERENCES = ("fgd",)  # given the mix in advance: shown for reference, not one of the baselines to beat
SUMMARY_COLUMNS = (
    ("rejected", "pods rejected"),
    ("rejected_pct", "rejected % of pods"),
    ("mean_in_use_pct", "GPUs in use % (mean)"),
    ("mean_stranded_gpus", "stranded GPUs (mean)"),
    ("mean_stranded_pct", "stranded % of GPUs (mean)"),
)


def summary_value(result: Result, key: str) -> float | None:
    """One number of a churn run's summary (None when absent)."""
    value = run_of(result)["summary"].get(key)
    return None if value is None else float(value)


def churn_section(results: Sequence[Result], policies: Sequence[str], out: Path) -> Section:
    """Rejections, stranding and large-profile placeability per policy; gpupack paired per seed."""
    section = Section()
    by = group(results, "policy")
    present = [p for p in policies if by.get((p,))]
    if not present:
        return section
    placeable = [k for k in run_of(by[(present[0],)][0])["summary"] if k.startswith("placeable_")]
    table = Table(["policy", "pods (median)", *[label for _, label in SUMMARY_COLUMNS],
                   *[f"{_profile(k)} placeable % of time" for k in placeable]])  # fmt: skip
    for policy in present:
        runs = by[(policy,)]
        table.add(
            policy,
            median(float(run_of(r)["pods_submitted"]) for r in runs),
            *[median(summary_value(r, key) for r in runs) for key, _ in SUMMARY_COLUMNS],
            *[median(summary_value(r, key) for r in runs) for key in placeable],
        )
    section.tables = {
        "churn": table,
        "churn_per_seed": _per_seed_table(by, present),
        "churn_rejected_by_profile": mean_per_profile_table(
            "rejected pods (mean per seed)", {p: [run_of(r)["rejected_by_profile"] for r in by[(p,)]] for p in present}
        ),
    }
    metric = {key: {p: per_seed(by[(p,)], partial(summary_value, key=key)) for p in present}
              for key in ("rejected", "mean_stranded_gpus", *placeable)}  # fmt: skip
    compare(section, "MIG churn, pods rejected", metric["rejected"], higher_is_better=False, unit="")
    compare(section, "MIG churn, stranded GPUs (mean)", metric["mean_stranded_gpus"], False, unit="")
    for key in placeable:
        compare(section, f"MIG churn, {_profile(key)} placeable % of time", metric[key], higher_is_better=True)
    _plots(section, by, present, out)
    section.data["runs"] = {p: [run_of(r) if i == 0 else _no_samples(r) for i, r in enumerate(by[(p,)])]
                            for p in present}  # fmt: skip
    return section


def _profile(key: str) -> str:
    return key.removeprefix("placeable_").removesuffix("_pct")


def _no_samples(result: Result) -> dict[str, object]:
    return {k: v for k, v in run_of(result).items() if k != "samples"}


def _per_seed_table(by: dict[tuple[object, ...], list[Result]], policies: Sequence[str]) -> Table:
    """Pods rejected per seed and policy, and whether gpupack rejected strictly fewer than every baseline
    (the REFERENCES, given the mix in advance, are shown but not counted)."""
    rejected = {p: per_seed(by[(p,)], lambda r: summary_value(r, "rejected")) for p in policies}
    seeds = sorted({s for values in rejected.values() for s in values})
    others = [p for p in policies if p not in ("gpupack", *REFERENCES)]
    table = Table(["seed", *policies, f"gpupack fewer than {', '.join(others)} (strictly)"])
    for seed in seeds:
        row = [rejected[p].get(seed) for p in policies]
        mine = rejected.get("gpupack", {}).get(seed)
        fewest = mine is not None and all((v := rejected[p].get(seed)) is not None and mine < v for p in others)
        table.add(seed, *row, fewest)
    return table


def _plots(section: Section, by: dict[tuple[object, ...], list[Result]], policies: Sequence[str], out: Path) -> None:
    firsts = {p: run_of(by[(p,)][0]) for p in policies}
    seed = next(iter(firsts.values()))["seed"]
    series: dict[str, dict[str, list[tuple[float, float]]]] = {
        "pods rejected (cumulative)": {},
        "stranded GPUs": {},
        "GPUs in use %": {},
    }
    for policy, run in firsts.items():
        samples = run["samples"]
        assert isinstance(samples, list)
        series["pods rejected (cumulative)"][policy] = [(s["time"], s["rejected"]) for s in samples]
        series["stranded GPUs"][policy] = [(s["time"], s["stranded_gpus"]) for s in samples]
        series["GPUs in use %"][policy] = [(s["time"], s["in_use_pct"]) for s in samples]
    plots.time_series_panels(
        series,
        out / "churn_over_time.png",
        "time (mean inter-arrival gaps)",
        f"MIG churn, seed {seed} (the first): one line per policy",
    )
    section.plots.append("churn_over_time.png")
