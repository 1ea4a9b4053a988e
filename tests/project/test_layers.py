"""The folder tree is the architecture (#25): the import graph of every gpupack module has no cycle, and no
module imports from a higher layer: scoring ← kube ← {extender, agent, sim, harness} ← {report, bench} ← defrag ←
cli.

Every import counts, also those inside functions or under TYPE_CHECKING: a cycle hidden there is still one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.components import COMPONENTS, ROOT

# component (or single module of the gpupack folder) -> layer; a module imports only from lower layers or its own
# component, never from a sibling of the same layer
LAYERS: dict[str, int] = {
    "gpupack.errors": 0, "gpupack.arguments": 0,  # the base every layer may use
    "scoring": 1,
    "kube": 2,
    "extender": 3, "agent": 3, "sim": 3, "harness": 3,
    "report": 4, "bench": 4,
    "defrag": 5,  # reads the cluster as the report does
    "gpupack.cli": 6,
}  # fmt: skip
TOP_LEVEL_MODULES = {"gpupack.__main__": "gpupack.cli", "gpupack": "gpupack.cli"}  # `python -m gpupack`: the CLI


def modules() -> dict[str, Path]:
    """Every module of the distribution by its installed name."""
    found = {}
    for folder, package in COMPONENTS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [part for part in path.relative_to(ROOT / folder).with_suffix("").parts if part != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def imported(module: str, path: Path, known: set[str]) -> Iterator[str]:
    """The gpupack modules `module` imports, anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package up
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
    return


def graph() -> dict[str, set[str]]:
    """Module -> the gpupack modules it imports (itself left out)."""
    found = modules()
    known = set(found)
    return {m: {t for t in imported(m, p, known) if t in known and t != m} for m, p in found.items()}


def component(module: str) -> str:
    """The layer key of a module: its component, or the module itself in the gpupack folder."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in COMPONENTS:
        return parts[1]
    return TOP_LEVEL_MODULES.get(module, module)


def test_every_component_has_a_layer() -> None:
    assert {component(m) for m in graph()} <= set(LAYERS)
    assert set(COMPONENTS) - {"gpupack"} <= set(LAYERS)


def test_no_import_reaches_up_or_across_a_layer() -> None:
    wrong = sorted(
        f"{source} -> {target}"
        for source, targets in graph().items()
        for target in targets
        if component(source) != component(target) and LAYERS[component(target)] >= LAYERS[component(source)]
    )
    assert wrong == []


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_cycle() -> None:
    assert cycles(graph()) == []


@pytest.mark.parametrize(
    ("edges", "expected"),
    [({"a": {"b"}, "b": {"a"}}, [["a", "b"]]), ({"a": {"b"}, "b": {"c"}, "c": set()}, [])],
)
def test_the_cycle_finder_finds_cycles(edges: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(edges) == expected


def test_the_graph_sees_imports_inside_functions() -> None:
    assert "gpupack.bench.simulate_cli" in graph()["gpupack.cli"]
