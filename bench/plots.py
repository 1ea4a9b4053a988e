"""Plots for the simulator and the bench report (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.typing import ColorType

HIGHLIGHT = "gpupack"  # drawn last, on top, thicker and in a colour no other line uses
HIGHLIGHT_COLOUR = "#d62728"
MARKERS = ("s", "^", "v", "D", "x", "+", "*", "P", "<", ">")


class LineStyle(TypedDict):
    """The matplotlib keywords `line_style` sets."""

    color: ColorType
    linewidth: float
    linestyle: str
    marker: str
    markersize: float
    markevery: int | tuple[int, int]
    zorder: float


def line_style(name: str, index: int, points: int) -> LineStyle:
    """Matplotlib keywords for series `name`: gpupack stands out; the others differ by colour and marker."""
    every = max(1, points // 8)
    if name.startswith(HIGHLIGHT) and not name.startswith(f"{HIGHLIGHT}["):
        return {"color": HIGHLIGHT_COLOUR, "linewidth": 2.4, "linestyle": "-", "marker": "o", "markersize": 5,
                "markevery": every, "zorder": 10}  # fmt: skip
    if name.startswith(f"{HIGHLIGHT}["):  # gpupack with other weights: its colour, told apart by dashes
        return {"color": HIGHLIGHT_COLOUR, "linewidth": 1.8, "linestyle": "--", "marker": "X", "markersize": 5,
                "markevery": (every // 2, every), "zorder": 9}  # fmt: skip
    colours = [c for i, c in enumerate(matplotlib.color_sequences["tab10"]) if i != 3]  # 3: red
    return {"color": colours[index % len(colours)], "linewidth": 1.2, "linestyle": "-",
            "marker": MARKERS[index % len(MARKERS)], "markersize": 4, "markevery": (index % every, every),
            "zorder": 2 + index * 0.01}  # fmt: skip


def highlight_last(names: Sequence[str]) -> list[int]:
    """Drawing order: every other series first, gpupack's last so that nothing hides it."""
    return sorted(range(len(names)), key=lambda i: names[i].startswith(HIGHLIGHT))


def _curve_lines(ax: plt.Axes, results: Sequence[Mapping[str, object]], every_seed: bool) -> None:
    """One line per policy (its first seed), or with `every_seed` one per seed of each policy."""
    lines: list[tuple[str, list[list[float]]]] = []
    for result in results:
        runs = result["runs"]
        assert isinstance(runs, list) and runs
        for run in runs if every_seed else runs[:1]:
            label = f"{result['policy']}, seed {run['seed']}" if every_seed and len(runs) > 1 else str(result["policy"])
            lines.append((label, run["curve"]))
    names = [label for label, _ in lines]
    for i in highlight_last(names):
        label, curve = lines[i]
        ax.plot([p[0] for p in curve], [p[1] for p in curve], label=label, **line_style(label, i, len(curve)))
    handles, labels = ax.get_legend_handles_labels()
    first = highlight_last(labels)[::-1]  # gpupack first in the legend as well
    ax.legend([handles[i] for i in first], [labels[i] for i in first], fontsize=7)


def allocation_curves(
    results: Sequence[Mapping[str, object]],
    path: str | Path,
    title: str = "",
    xlim: tuple[float, float] = (60, 132),
    ylim: tuple[float, float] = (60, 100),
    every_seed: bool = False,
) -> Path:
    """GPU allocation % against arrived GPU demand %: one line per policy (its first seed), or one line per
    seed with `every_seed`. gpupack is drawn last, in red with round markers."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _curve_lines(ax, results, every_seed)
    _curve_axes(ax, xlim, ylim)
    if title:
        ax.set_title(title, fontsize=10)
    return _save(fig, path)


def _curve_axes(ax: plt.Axes, xlim: tuple[float, float], ylim: tuple[float, float]) -> None:
    ax.plot([0, 100], [0, 100], color="grey", linewidth=0.6, linestyle=":")
    ax.axvline(100, color="grey", linewidth=0.6)
    ax.set_xlabel("arrived GPU demand (% of capacity)")
    ax.set_ylabel("GPUs allocated (% of capacity)")
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)


def allocation_curve_panels(
    panels: Mapping[str, Sequence[Mapping[str, object]]],
    path: str | Path,
    title: str = "",
    xlim: tuple[float, float] = (85, 132),
    ylim: tuple[float, float] = (75, 100),
) -> Path:
    """`allocation_curves` of several traces in one figure, one panel each (first seed of each policy)."""
    cols = min(4, max(len(panels), 1))
    rows = -(-len(panels) // cols) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, (name, results) in zip(axes.flat, panels.items(), strict=False):
        _curve_lines(ax, results, every_seed=False)
        _curve_axes(ax, xlim, ylim)
        ax.set_title(name, fontsize=9)
        ax.xaxis.label.set_size(7)
        ax.yaxis.label.set_size(7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=11)
    return _save(fig, path)


def paired_differences(
    diffs: Mapping[str, Sequence[float]],
    path: str | Path,
    ylabel: str,
    title: str = "",
    reference: Mapping[str, float] | None = None,
    reference_label: str = "",
) -> Path:
    """Per group (trace): every per-seed paired difference as a dot, the median as a bar, the seed range
    as error bars (min to max); optionally one reference value per group as a diamond."""
    groups = list(diffs)
    fig, ax = plt.subplots(figsize=(max(7, 0.75 * len(groups) + 2), 4.2))
    for x, name in enumerate(groups):
        values = sorted(diffs[name])
        if not values:
            continue
        mid = (
            values[len(values) // 2]
            if len(values) % 2
            else (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2
        )
        colour = "#2b7bba" if mid <= 0 else HIGHLIGHT_COLOUR
        ax.bar(x, mid, 0.6, color=colour, alpha=0.35)
        ax.errorbar(x, mid, yerr=[[mid - values[0]], [values[-1] - mid]], fmt="o", color=colour, capsize=4)
        ax.scatter([x + 0.18] * len(values), values, s=8, color="black", alpha=0.5, zorder=5)
    if reference:
        xs = [x for x, g in enumerate(groups) if g in reference]
        ax.scatter(xs, [reference[groups[x]] for x in xs], marker="D", color="#2ca02c", zorder=6, label=reference_label)
        ax.legend(fontsize=8)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(groups)), groups, fontsize=8, rotation=30)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    return _save(fig, path)


def time_series_panels(
    panels: Mapping[str, Mapping[str, Sequence[tuple[float, float]]]],
    path: str | Path,
    xlabel: str,
    title: str = "",
) -> Path:
    """One panel per metric (the panel's title), one line per series (policy); gpupack drawn last, on top."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
    for ax, (name, series) in zip(axes[0], panels.items(), strict=True):
        names = list(series)
        for i in highlight_last(names):
            points = series[names[i]]
            ax.plot([p[0] for p in points], [p[1] for p in points], label=names[i],
                    **line_style(names[i], i, len(points)))  # fmt: skip
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        first = highlight_last(labels)[::-1]
        ax.legend([handles[i] for i in first], [labels[i] for i in first], fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
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


def grouped_bars(values: Mapping[str, Mapping[str, float]], path: str | Path, ylabel: str, title: str = "") -> Path:
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


def speed_lines(rows: Sequence[Mapping[str, Any]], path: str | Path, title: str = "") -> Path:
    """Kernel ms per decision against node count: numba and reference, one line per policy, log y."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for policy in dict.fromkeys(str(r["policy"]) for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        xs = [int(r["nodes"]) for r in mine]
        for key, style in (("numba_ms", "-o"), ("reference_ms", "--s")):
            ax.plot(xs, [float(r[key]) for r in mine], style, label=f"{policy} {key.removesuffix('_ms')}")
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
