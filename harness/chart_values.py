"""The README's table of the chart's values, made from values.schema.json and values.yaml (#27 item 4).

One row per setting: its dotted name, its default, what the schema allows and its description, so the
table says what `helm install` will accept. `make manifests` rewrites the table between the README's
markers; tests/project/test_chart.py fails when it is not current.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gpupack.harness.kube_programs import REPO_ROOT

CHART = REPO_ROOT / "charts" / "gpupack"
README = REPO_ROOT / "README.md"
BEGIN = "<!-- values table: made by `make manifests` from charts/gpupack/values.schema.json -->"
END = "<!-- end of values table -->"
Row = tuple[str, Any, dict[str, Any]]


def settings(schema: dict[str, Any], values: Any, prefix: str = "") -> Iterator[Row]:
    """(dotted name, default, schema) of every setting: a leaf, or an object or list taken whole."""
    for key, node in schema.get("properties", {}).items():
        name, default = f"{prefix}{key}", (values or {}).get(key)
        if node.get("type") == "object" and "properties" in node and not _whole(node):
            yield from settings(node, default, f"{name}.")
        else:
            yield name, default, node


def _whole(node: dict[str, Any]) -> bool:
    """Objects shown as one value: container resources (requests and limits)."""
    return set(node.get("properties", {})) == {"requests", "limits"}


def allowed(node: dict[str, Any]) -> str:
    """What the schema accepts, in a few words."""
    if "enum" in node:
        return ", ".join(f"`{choice}`" if choice else '`""`' for choice in node["enum"])
    kinds = node.get("type", "")
    kind = "number" if kinds == ["number", "string"] else kinds  # a decimal string is helm --set's number
    words = [{"boolean": "true/false"}.get(kind, kind)]
    if "minimum" in node and "maximum" in node:
        words.append(f"{node['minimum']} to {node['maximum']}")
    elif "minimum" in node:
        words.append(f"≥ {node['minimum']}")
    if "exclusiveMinimum" in node:
        words.append(f"> {node['exclusiveMinimum']}")
    if "maximum" in node and "minimum" not in node:
        words.append(f"≤ {node['maximum']}")
    return " ".join(words)


def shown(default: Any) -> str:
    """The default as a reader would write it in values."""
    if isinstance(default, list) and len(default) > 2:
        return f"{len(default)} entries (values.yaml)"
    text = json.dumps(default, separators=(", ", ": ")) if isinstance(default, (dict, list)) else None
    if text is None:
        text = "true" if default is True else "false" if default is False else '""' if default == "" else str(default)
    return f"`{text}`"


def table(schema: dict[str, Any], values: dict[str, Any]) -> str:
    """The Markdown table of every setting."""
    lines = ["| value | default | allowed | what |", "|---|---|---|---|"]
    for name, default, node in settings(schema, values):
        what = node.get("description", "").replace("|", "\\|")
        lines.append(f"| `{name}` | {shown(default)} | {allowed(node)} | {what} |")
    return "\n".join(lines) + "\n"


def chart_table(chart: Path = CHART) -> str:
    """The table of the chart's own schema and defaults."""
    schema = json.loads((chart / "values.schema.json").read_text())
    values = yaml.safe_load((chart / "values.yaml").read_text())
    return table(schema, values)


def readme_with_table(readme: str, rows: str) -> str:
    """`readme` with the text between the markers replaced by `rows`; ValueError without the markers."""
    head, begin, rest = readme.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"README.md lacks the markers {BEGIN!r} ... {END!r}")
    return f"{head}{BEGIN}\n{rows}{END}{tail}"
