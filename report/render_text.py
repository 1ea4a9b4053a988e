"""The report as tables for a terminal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MOVES_SHOWN = 5  # moves listed per drained node; the rest are counted
# C0 controls but the newline, DEL and C1: names and label values come from the cluster and from
# Prometheus series anyone may export, and printed raw they would steer the reader's terminal
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x0A), *range(0x0B, 0x20), *range(0x7F, 0xA0))}


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """Rows under headers, columns as wide as their widest cell; numbers right-aligned."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    numeric = [all(isinstance(row[i], int | float) for row in rows) and bool(rows) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True))

    return [line(headers).rstrip(), *(line(row).rstrip() for row in cells)]


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}"
    return str(value)


def render_text(report: dict[str, Any]) -> str:
    """Every section of the report, one table each."""
    out = [
        f"cluster: ${report['total_hourly_cost']:,.2f}/h, of which ${report['unallocated_hourly_cost']:,.2f}/h "
        "on nodes without a GPU pod",
        "",
        "GPU pools",
    ]
    out += table(
        ("PRODUCT", "CAPACITY", "NODES", "GPUS", "ALLOC %", "IDLE GPUS", "IDLE $/H", "FREE MIG", "STRANDED", "EMPTY"),
        [(p["product"], p["capacity_type"], p["nodes"], p["gpus"], p["allocated_pct"], p["idle_gpus"],
          p["idle_hourly_cost"], p["free_mig_slices"], p["stranded_mig_slices"], p["empty_nodes"])
         for p in report["pools"]],
    )  # fmt: skip
    window = report["window"]
    out += ["", f"cost by namespace (split allocation; GPU-hours and cost over {window['hours']:g} h)"]
    out += _usage_table("NAMESPACE", report["by_namespace"], window["by_namespace"])
    for label, hourly in report["by_label"].items():
        out += ["", f"cost by label {label}"]
        out += _usage_table(label.upper(), hourly, window["by_label"][label])
    out += ["", f"nodes that could be released: ${report['drain_saves_hourly']:,.2f}/h"]
    out += _drain_lines(report["drain_plan"])
    if report["kept"]:
        out += ["", "tried, but kept"]
        out += table(("NODE", "WHY"), sorted(report["kept"].items()))
    if report["unpriced_nodes"]:
        out += ["", f"nodes without a price (counted at $0): {', '.join(report['unpriced_nodes'])}"]
    for node, reason in sorted(report["unusable_nodes"].items()):
        out.append(f"node {node} not read: {reason}")
    if "utilisation" in report:
        out += ["", *_utilisation_lines(report["utilisation"])]
    return printable("\n".join(out) + "\n")


def printable(text: str) -> str:
    """`text` with every control character but the newline written as a visible `\\xNN` escape."""
    return text.translate(_CONTROLS)


def _usage_table(header: str, hourly: dict[str, float], window: dict[str, dict[str, float]]) -> list[str]:
    return table(
        (header, "$/H", "GPU-HOURS", "COST"),
        [(group, cost, window[group]["gpu_hours"], window[group]["cost"]) for group, cost in hourly.items()],
    )


def _drain_lines(drains: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for drain in drains:
        moves = drain["moves"]
        what = "empty now" if not moves else f"{len(moves)} pod(s) to move"
        lines.append(f"  {drain['node']}: saves ${drain['saves_hourly']:,.2f}/h, {what}")
        for move in moves[:MOVES_SHOWN]:
            gpus = ", ".join(_slot(slot) for slot in move["gpus"]) or "no GPU"
            lines.append(f"    {move['pod']} -> {move['to']} [{gpus}]")
        if len(moves) > MOVES_SHOWN:
            lines.append(f"    ... and {len(moves) - MOVES_SHOWN} more")
    return lines or ["  none"]


def _slot(slot: dict[str, Any]) -> str:
    if "mig" in slot:
        return f"GPU {slot['index']} {slot['mig']}@{slot['start']}"
    if "milli" in slot:
        return f"GPU {slot['index']} {slot['milli']}m"
    return f"GPU {slot['index']}"


def _utilisation_lines(utilisation: dict[str, Any]) -> list[str]:
    head = (
        f"allocated but idle GPUs (DCGM utilisation under {utilisation['idle_below_pct']:g} % over "
        f"{utilisation['window']}, from {utilisation['prometheus']})"
    )
    rows = [(g["namespace"], g["pod"], g["node"], g["gpu"], g["utilisation_pct"]) for g in utilisation["idle_gpus"]]
    lines = [head, *table(("NAMESPACE", "POD", "NODE", "GPU", "UTIL %"), rows)]
    lines.append("")
    lines += table(("NAMESPACE", "IDLE GPUS"), sorted(utilisation["idle_by_namespace"].items()))
    return lines
