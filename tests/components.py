"""The project's components, as the one list that registers them: `[tool.setuptools.package-dir]` of pyproject.toml.

Each top-level folder there is installed as a `gpupack.*` package. The wheel and `.ci/typecheck.py` read the
list directly; ruff's ban list and the Dockerfile's COPY lines are static copies that tests/project/test_components.py
holds to it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]

# folder -> installed package name, e.g. "kube" -> "gpupack.kube"
COMPONENTS: dict[str, str] = {folder: package for package, folder in SETUPTOOLS["package-dir"].items()}


def component_folders_on_disk() -> set[str]:
    """Top-level folders that hold Python packages (an `__init__.py`), apart from the tests."""
    return {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests"}


def subpackages_on_disk() -> set[str]:
    """Every installed package name the component folders hold, subpackages included."""
    found = set()
    for folder, package in COMPONENTS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([package, *parts]))
    return found
