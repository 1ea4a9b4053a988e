"""Plots for the simulator and the bench report (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def allocation_curves(results: Sequence[Mapping[str, object]], path: str | Path, title: str = "") -> Path:
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
    ax.set_xlim(60, 132)
    ax.set_ylim(60, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


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
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
