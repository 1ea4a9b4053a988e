"""Plots for the simulator and the bench report (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def allocation_curves(
    results: Sequence[Mapping[str, object]],
    path: str | Path,
    title: str = "",
    xlim: tuple[float, float] = (60, 132),
    ylim: tuple[float, float] = (60, 100),
) -> Path:
    """GPU allocation % against arrived GPU demand %, one line per policy (first seed of each)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for result in results:
        runs = result["runs"]
        assert isinstance(runs, list) and runs
        curve = runs[0]["curve"]
        xs = [point[0] for point in curve]
        ys = [point[1] for point in curve]
        ax.plot(xs, ys, label=str(result["policy"]), linewidth=1.4)
    ax.plot([0, 100], [0, 100], color="grey", linewidth=0.6, linestyle=":")
    ax.axvline(100, color="grey", linewidth=0.6)
    ax.set_xlabel("arrived GPU demand (% of capacity)")
    ax.set_ylabel("GPUs allocated (% of capacity)")
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return _save(fig, path)


def bar_chart(values: Mapping[str, float], path: str | Path, ylabel: str, title: str = "") -> Path:
    """One bar per policy."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    names = list(values)
    ax.bar(names, [values[n] for n in names], color=["#2b7bba" if n == "gpupack" else "#9db4c8" for n in names])
    for i, name in enumerate(names):
        ax.text(i, values[name], f"{values[name]:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    return _save(fig, path)


def grouped_bars(
    values: Mapping[str, Mapping[str, float]], path: str | Path, ylabel: str, title: str = ""
) -> Path:
    """Bars grouped on the x axis by the outer key (e.g. trace), one colour per inner key (e.g. policy)."""
    groups = list(values)
    series = list(dict.fromkeys(name for group in values.values() for name in group))
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(groups)), 4.2))
    cmap = plt.get_cmap("tab10")
    for i, name in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups)) if name in values[groups[g]]]
        ys = [values[group][name] for group in groups if name in values[group]]
        ax.bar(xs, ys, width, label=name, color=cmap(i % 10), edgecolor="black" if name == "gpupack" else None)
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.15)  # room for the legend
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=min(len(series), 5))
    if title:
        ax.set_title(title)
    return _save(fig, path)


def mig_occupancy(grids: Mapping[str, Sequence[Sequence[str]]], path: str | Path, title: str = "") -> Path:
    """One panel per policy: rows = GPUs, 8 columns = memory slices, coloured by what occupies them."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    labels = sorted({cell for grid in grids.values() for row in grid for cell in row} | {"free"}, key=_slot_order)
    colours = plt.get_cmap("tab10")
    palette = {label: ("#f2f2f2" if label == "free" else colours(i % 10)) for i, label in enumerate(labels)}
    fig, axes = plt.subplots(1, len(grids), figsize=(3.2 * len(grids) + 1.5, 6), squeeze=False)
    for ax, (name, grid) in zip(axes[0], grids.items(), strict=True):
        codes = [[labels.index(cell) for cell in row] for row in grid] or [[labels.index("free")] * 8]
        ax.imshow(codes, cmap=ListedColormap([palette[label] for label in labels]), vmin=0,
                  vmax=len(labels) - 1, aspect="auto", interpolation="nearest")  # fmt: skip
        ax.set_xticks(range(8), [str(i) for i in range(8)], fontsize=7)
        ax.set_xticks([x - 0.5 for x in range(1, 8)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(1, len(codes))], minor=True)
        ax.grid(which="minor", color="white", linewidth=0.6)
        ax.tick_params(which="minor", length=0)
        ax.set_yticks([])
        ax.set_xlabel("memory slice")
        ax.set_title(f"{name} ({len(grid)} GPUs)", fontsize=9)
    fig.legend(handles=[Patch(color=palette[label], label=label) for label in labels], loc="center right", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    return _save(fig, path, tight=False)


def _slot_order(label: str) -> tuple[int, str]:
    head = label.split("g.", 1)[0]
    return (int(head), label) if head.isdigit() else (99, label)


def speed_lines(rows: Sequence[Mapping[str, object]], path: str | Path, title: str = "") -> Path:
    """Kernel ms per decision against node count: numba and reference, one line per policy, log y."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for policy in dict.fromkeys(str(r["policy"]) for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        xs = [int(r["nodes"]) for r in mine]  # type: ignore[call-overload]
        for key, style in (("numba_ms", "-o"), ("reference_ms", "--s")):
            ax.plot(xs, [float(r[key]) for r in mine], style, label=f"{policy} {key.removesuffix('_ms')}")  # type: ignore[arg-type]
    ax.set_yscale("log")
    ax.set_xlabel("nodes (8 GPUs each)")
    ax.set_ylabel("ms per decision")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return _save(fig, path)


def _save(fig: plt.Figure, path: str | Path, tight: bool = True) -> Path:
    if tight:
        fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
