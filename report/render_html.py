"""The report as one self-contained HTML page: tables and inline SVG bar charts, no external files.

No plotting library is needed. A short script marks the page once the browser has laid it out
(`data-rendered-bars` on <body>: the bars drawn with a non-zero size), which the tests read back
from headless Chromium.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

BAR_HEIGHT = 18
LABEL_WIDTH = 260
PLOT_WIDTH = 420
STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}
th,td{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.allocated{fill:#2b6cb0}.idle{fill:#e2a03f}.cost{fill:#2f855a}.unallocated{fill:#a0aec0}
svg text{font-size:12px}
"""
MARK_RENDERED = """
addEventListener('load', () => {
  const drawn = [...document.querySelectorAll('svg rect.bar')]
    .filter(r => { const b = r.getBoundingClientRect(); return b.width > 0 && b.height > 0; });
  document.body.dataset.renderedBars = String(drawn.length);
});
"""


def render_html(report: dict[str, Any]) -> str:
    """The whole page."""
    parts = [
        f"<h1>gpupack report</h1><p>Cluster: <b>${report['total_hourly_cost']:,.2f}/h</b>; "
        f"${report['unallocated_hourly_cost']:,.2f}/h on nodes without a GPU pod; "
        f"${report['drain_saves_hourly']:,.2f}/h could be released.</p>",
        *_pool_section(report["pools"]),
        *_cost_sections(report),
        "<h2>Nodes that could be released</h2>",
        _drain_table(report["drain_plan"]),
    ]
    if "utilisation" in report:
        parts += ["<h2>Allocated but idle GPUs</h2>", _utilisation_table(report["utilisation"])]
    return (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>gpupack report</title>"
        f"<style>{STYLE}</style><script>{MARK_RENDERED}</script></head><body>{''.join(parts)}</body></html>\n"
    )


POOL_COLUMNS = (
    ("product", "product"),
    ("capacity", "capacity_type"),
    ("nodes", "nodes"),
    ("GPUs", "gpus"),
    ("allocated %", "allocated_pct"),
    ("idle GPUs", "idle_gpus"),
    ("idle $/h", "idle_hourly_cost"),
    ("free MIG slices", "free_mig_slices"),
    ("stranded MIG slices", "stranded_mig_slices"),
    ("empty nodes", "empty_nodes"),
)  # (heading, key of a pool in the report's JSON)


def _pool_section(pools: Sequence[dict[str, Any]]) -> list[str]:
    """GPU pools: allocated and idle GPUs, idle cost, and the pools' table."""
    gpus = [(_pool_name(p), [(p["gpus_allocated"], "allocated"), (p["idle_gpus"], "idle")]) for p in pools]
    idle_cost = [(_pool_name(p), [(p["idle_hourly_cost"], "idle")]) for p in pools]
    rows = [tuple(p[key] for _, key in POOL_COLUMNS) for p in pools]
    return [
        "<h2>GPU pools</h2>",
        "<h3>GPUs by pool: allocated (blue) and idle (orange)</h3>",
        bar_chart("pools-gpus", gpus, "GPUs (blue allocated, orange idle)"),
        "<h3>Idle GPUs' cost by pool, $/h</h3>",
        bar_chart("pools-idle-cost", idle_cost, "idle $/h"),
        html_table("pools", tuple(heading for heading, _ in POOL_COLUMNS), rows),
    ]


def _cost_sections(report: dict[str, Any]) -> list[str]:
    """Cost by namespace (chart and table), then a table per `--by` label."""
    window = report["window"]
    costs = [(ns, [(c, "cost")]) for ns, c in report["by_namespace"].items()]
    costs.append(("nodes without a GPU pod", [(report["unallocated_hourly_cost"], "unallocated")]))
    parts = [
        "<h2>Cost by namespace (split allocation)</h2>",
        bar_chart("namespace-cost", costs, "$/h"),
        _usage_table("namespaces", "namespace", report["by_namespace"], window["by_namespace"], window["hours"]),
    ]
    for label, hourly in report["by_label"].items():
        parts.append(f"<h2>Cost by label {escape(label)}</h2>")
        parts.append(_usage_table(f"label-{label}", label, hourly, window["by_label"][label], window["hours"]))
    return parts


def bar_chart(chart_id: str, items: Sequence[tuple[str, Sequence[tuple[float, str]]]], unit: str) -> str:
    """Horizontal stacked bars: one row per (label, [(value, css class), ...]), scaled to the largest row."""
    largest = max([sum(v for v, _ in segments) for _, segments in items] + [0.0]) or 1.0
    height = BAR_HEIGHT * (len(items) + 1) + 10
    rows = []
    for i, (label, segments) in enumerate(items):
        y = i * BAR_HEIGHT + 4
        rows.append(f'<text x="{LABEL_WIDTH - 6}" y="{y + 13}" text-anchor="end">{escape(label)}</text>')
        x = float(LABEL_WIDTH)
        for value, css in segments:
            width = PLOT_WIDTH * max(value, 0.0) / largest
            rows.append(
                f'<rect class="bar {css}" x="{x:.1f}" y="{y}" width="{width:.1f}" height="{BAR_HEIGHT - 4}">'
                f"<title>{escape(label)}: {value:,.2f}</title></rect>"
            )
            x += width
        total = sum(v for v, _ in segments)
        rows.append(f'<text x="{x + 4:.1f}" y="{y + 13}">{total:,.2f}</text>')
    axis_y = len(items) * BAR_HEIGHT + 18
    rows.append(f'<text x="{LABEL_WIDTH}" y="{axis_y}">0 … {largest:,.2f} {escape(unit)}</text>')
    width = LABEL_WIDTH + PLOT_WIDTH + 90
    return (
        f'<svg id="{escape(chart_id)}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img">{"".join(rows)}</svg>'
    )


def html_table(table_id: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A table; numbers right-aligned, two decimals for floats."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_td(v) for v in row) + "</tr>" for row in rows)
    return f'<table id="{escape(table_id)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _td(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"<td>{escape(str(value))}</td>"
    text = f"{value:,.2f}" if isinstance(value, float) else f"{value:,}"
    return f'<td class="n">{text}</td>'


def _pool_name(pool: dict[str, Any]) -> str:
    return f"{pool['product']} ({pool['capacity_type']})"


def _usage_table(table_id: str, header: str, hourly: dict[str, float], window: dict[str, Any], hours: float) -> str:
    rows = [(g, cost, window[g]["gpu_hours"], window[g]["cost"]) for g, cost in hourly.items()]
    return html_table(table_id, (header, "$/h", f"GPU-hours ({hours:g} h)", f"cost ({hours:g} h)"), rows)


def _drain_table(drains: list[dict[str, Any]]) -> str:
    rows = []
    for drain in drains:
        moves = "; ".join(f"{m['pod']} → {m['to']}" for m in drain["moves"]) or "empty now"
        rows.append((drain["node"], drain["saves_hourly"], moves))
    return html_table("drain-plan", ("node", "saves $/h", "moves"), rows)


def _utilisation_table(utilisation: dict[str, Any]) -> str:
    rows = [(g["namespace"], g["pod"], g["node"], g["gpu"], g["utilisation_pct"]) for g in utilisation["idle_gpus"]]
    return html_table("idle-gpus", ("namespace", "pod", "node", "GPU", "utilisation %"), rows)
