"""Access to the real kube-scheduler captures in tests/data/extender-wire (copied from ../shared/extender-wire)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import DATA

CAPTURES = DATA / "extender-wire"


def request_files() -> list[Path]:
    """Every captured request body, in all three folders."""
    return sorted(CAPTURES.glob("*/*.request.json"))


def args_files() -> list[Path]:
    """Captured filter and prioritize bodies (ExtenderArgs)."""
    return [p for p in request_files() if "-bind-" not in p.name]


def bind_files() -> list[Path]:
    """Captured bind bodies (ExtenderBindingArgs)."""
    return [p for p in request_files() if "-bind-" in p.name]


def response_for(request: Path) -> Path:
    """The captured response to a captured request."""
    return request.with_name(request.name.replace(".request.json", ".response.json"))


def load(path: Path) -> Any:
    """A captured JSON file."""
    return json.loads(path.read_text())


def captured_nodes() -> dict[str, dict[str, Any]]:
    """Every Node object sent in nodeCacheCapable=false mode, by name."""
    nodes: dict[str, dict[str, Any]] = {}
    for path in args_files():
        body = load(path)
        for item in (body.get("Nodes") or {}).get("items", []):
            nodes[item["metadata"]["name"]] = item
    return nodes
