"""The image's inputs are pinned (#26 low): the base by digest, every dependency by version and hash.

`requirements.lock` (`make lock`) must hold every runtime dependency of pyproject.toml at a version its
range allows, each with the hashes of its files, and the Dockerfile must install only from it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PINNED = re.compile(r"^([A-Za-z0-9_.\-]+)==(\S+) \\$")


def _locked() -> dict[str, tuple[str, int]]:
    """Name -> (version, how many hashes) of requirements.lock."""
    lines = (ROOT / "requirements.lock").read_text().splitlines()
    locked: dict[str, tuple[str, int]] = {}
    name = ""
    for line in lines:
        if match := PINNED.match(line):
            name = canonicalize_name(match[1])
            locked[name] = (match[2], 0)
        elif line.strip().startswith("--hash=sha256:") and name:
            version, hashes = locked[name]
            locked[name] = (version, hashes + 1)
    return locked


def test_every_runtime_dependency_is_locked_at_an_allowed_version_with_hashes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    locked = _locked()
    for spec in project["dependencies"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{name} is not in requirements.lock: run make lock"
        version, _ = locked[name]
        assert requirement.specifier.contains(version, prereleases=True), f"{name}=={version} is not {requirement}"
    assert all(hashes for _, hashes in locked.values()), "every locked file is checked against its hash"


def test_the_dockerfile_pins_its_base_by_digest_and_installs_only_what_is_locked() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE=\S+@sha256:[0-9a-f]{64}$", dockerfile, re.M)
    assert "pip wheel --wheel-dir /wheels --require-hashes -r requirements.lock" in dockerfile
    assert "pip wheel --wheel-dir /wheels --no-deps ." in dockerfile
    assert "pip install --no-index" in dockerfile
