""".dockerignore: the image's build context is exactly what the Dockerfile's COPY lines take (#27).

The patterns are read as Docker reads them (moby/patternmatcher): in order, the last matching one decides,
`!` lets a path back in, a pattern that matches a folder matches everything in it, `*` and `?` stay inside
one path segment and `**` crosses them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.e2e.images import context_files

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
PRUNED = (".venv", ".git")  # too large to walk; asserted ignored on their own


def patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(is an exception `!...`, regex) of each pattern of .dockerignore, in order."""
    out = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        negated = text.startswith("!")
        cleaned = os.path.normpath(text.removeprefix("!").strip()).lstrip("/")
        out.append((negated, re.compile(_regex(cleaned))))
    return out


def _regex(pattern: str) -> str:
    """Docker's glob as a regex: `**/` any folders (or none), `**` anything, `*` and `?` within a segment
    (no `[...]` classes: .dockerignore uses none)."""
    parts = re.split(r"(\*\*/|\*\*|\*|\?)", pattern)
    table = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
    return "".join(table.get(part, re.escape(part)) for part in parts)


def ignored(path: str) -> bool:
    """Whether Docker leaves `path` (relative, `/`-separated) out of the build context."""
    prefixes = ["/".join(path.split("/")[: i + 1]) for i in range(path.count("/") + 1)]
    excluded = False
    for negated, regex in patterns():
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            excluded = not negated
    return excluded


def files_in_context() -> set[str]:
    """Every file of the working tree that the build context holds."""
    found = set()
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not (folder == str(ROOT) and d in PRUNED)]
        for name in names:
            relative = (Path(folder) / name).relative_to(ROOT).as_posix()
            if not ignored(relative):
                found.add(relative)
    return found


def test_the_matcher_reads_patterns_as_docker_does() -> None:
    """Guard against a vacuous check: the regexes of a few patterns, as Docker matches them."""
    assert re.fullmatch(_regex("**/__pycache__"), "a/b/__pycache__")
    assert re.fullmatch(_regex("**/__pycache__"), "__pycache__")
    assert not re.fullmatch(_regex("*"), "a/b")
    assert re.fullmatch(_regex("**/*.pyc"), "a/x.pyc") and not re.fullmatch(_regex("a?c"), "a/c")


def test_everything_the_dockerfile_copies_is_in_the_context() -> None:
    copied = context_files(DOCKERFILE)
    assert "pyproject.toml" in copied and "scoring/kernels.py" in copied and "LICENSE" in copied
    assert [name for name in copied if ignored(name)] == []


def test_the_context_is_only_what_the_dockerfile_copies() -> None:
    """Nothing else: the clone's .venv/ made an 880 MB context after `make run` (#27)."""
    assert sorted(files_in_context() - set(context_files(DOCKERFILE))) == []


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".git/HEAD",
        "build/lib/gpupack/cli.py",
        "gpupack.egg-info/PKG-INFO",
        ".pytest_cache/v/cache/nodeids",
        ".mypy_cache/3.11/gpupack/cli.meta.json",
        ".ruff_cache/CACHEDIR.TAG",
        ".hypothesis/examples/x",
        "scoring/__pycache__/kernels.cpython-311.pyc",
        "extender/__pycache__/state.cpython-311.pyc",
        "tests/project/test_dockerignore.py",
        "docs/agent.md",
        "manifests/deployment.yaml",
    ],
)
def test_what_the_image_does_not_need_is_left_out(path: str) -> None:
    assert ignored(path)
