"""Load a simulator cluster or workload from a file, choosing the format by its extension.

`.csv` → openb trace CSV; `.yaml` / `.yml` / `.json` → Kubernetes Node / Pod objects.
"""

from __future__ import annotations

from pathlib import Path

from gpupack.scoring.facts import NodeFacts
from gpupack.sim.objects_loader import JSON_SUFFIXES, YAML_SUFFIXES, load_object_nodes, load_object_pods
from gpupack.sim.openb import load_openb_nodes, load_openb_pods
from gpupack.sim.workload import Trace, TraceError, TracePod

OBJECT_SUFFIXES = YAML_SUFFIXES + JSON_SUFFIXES


def _format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in OBJECT_SUFFIXES:
        return "objects"
    raise TraceError(f"{path}: unknown file type {suffix or '(none)'!r}; expected .csv, .yaml, .yml or .json")


def load_nodes(path: str | Path) -> list[NodeFacts]:
    """Nodes from an openb node CSV or a YAML/JSON file of Node objects."""
    path = Path(path)
    return load_openb_nodes(path) if _format(path) == "csv" else load_object_nodes(path)


def load_pods(path: str | Path) -> list[TracePod]:
    """Pods, in file order, from an openb pod CSV or a YAML/JSON file of Pod objects."""
    path = Path(path)
    return load_openb_pods(path) if _format(path) == "csv" else load_object_pods(path)


def load_trace(nodes_path: str | Path, pods_path: str | Path) -> Trace:
    """A Trace from a nodes file and a pods file (each in either format)."""
    return Trace(nodes=load_nodes(nodes_path), pods=load_pods(pods_path))
