"""helm for the chart's e2e cases: built from its Go module into a cache outside the clone (#27)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpupack.harness import helm_program
from gpupack.harness.helm_program import HELM_VERSION, helm_binary
from gpupack.harness.kube_programs import MissingBinary

ROOT = Path(__file__).resolve().parents[2]


def build(version: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """build-helm.sh VERSION with `cache` as its cache."""
    env = {**os.environ, "GPUPACK_HELM_CACHE": str(cache)}
    return subprocess.run(
        ["bash", str(helm_program.BUILD_SCRIPT), version], capture_output=True, text=True, env=env, check=False
    )


def test_a_missing_helm_is_named_with_the_command_that_builds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUPACK_HELM_CACHE", str(tmp_path))
    with pytest.raises(MissingBinary) as caught:
        helm_binary()
    assert f"{tmp_path}/{HELM_VERSION}/helm" in str(caught.value)
    assert f"tests/e2e/tools/build-helm.sh {HELM_VERSION}" in str(caught.value)


def test_the_cached_helm_is_found_and_not_built_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    program = tmp_path / HELM_VERSION / "helm"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("GPUPACK_HELM_CACHE", str(tmp_path))
    assert helm_binary() == program
    done = build(HELM_VERSION, tmp_path)
    assert done.returncode == 0 and done.stderr == "" and program.read_text() == "#!/bin/sh\n"


def test_the_build_script_refuses_what_is_not_a_helm_3_release(tmp_path: Path) -> None:
    for version in ("v3.22", "3.22.0", "v4.0.0"):
        done = build(version, tmp_path)
        assert done.returncode == 2 and "not a helm 3 release" in done.stderr, version


def test_make_e2e_builds_helm_before_the_suite() -> None:
    recipe = (ROOT / "Makefile").read_text().split("\ne2e:", 1)[1].split("\n\n", 1)[0]
    commands = [line.strip() for line in recipe.splitlines()[1:]]
    assert commands.index("$(PY) -m gpupack.harness.helm_program") < commands.index("$(PY) -m pytest tests/e2e")


def test_the_module_builds_helm_when_run(monkeypatch: pytest.MonkeyPatch) -> None:
    built = []
    monkeypatch.setattr(helm_program, "build_missing", lambda: built.append(HELM_VERSION))
    assert helm_program.main([]) == 0
    assert built == [HELM_VERSION]
