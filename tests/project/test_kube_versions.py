"""The Kubernetes releases gpupack supports and is tested on, and how the manifests follow them (#24)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupack.harness import kube_programs
from gpupack.harness.kube_programs import CONTROL_PLANE_VERSIONS, NEWEST, OLDEST_SUPPORTED, MissingBinary

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
VERSIONS_DIR = MANIFESTS / "kubernetes-versions"
SUPPORTED_MINORS = (33, 34, 35, 36, 37)


def minor(version: str) -> int:
    """37 of v1.37.2."""
    match = re.fullmatch(r"v1\.(\d+)\.\d+", version)
    assert match, version
    return int(match.group(1))


def component_tag(folder: Path) -> str:
    """The kube-scheduler tag that a kubernetes-versions component sets."""
    component = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    (image,) = component["images"]
    assert image["name"] == "registry.k8s.io/kube-scheduler"
    return str(image["newTag"])


def test_the_matrix_is_the_oldest_supported_minor_and_a_current_newest() -> None:
    assert CONTROL_PLANE_VERSIONS == ("v1.33.13", "v1.37.2")
    assert minor(OLDEST_SUPPORTED) == SUPPORTED_MINORS[0] and minor(NEWEST) == SUPPORTED_MINORS[-1] >= 36


def test_a_component_per_supported_minor_sets_that_minors_kube_scheduler() -> None:
    folders = sorted(p for p in VERSIONS_DIR.iterdir() if p.is_dir())
    assert [p.name for p in folders] == [f"v1.{m}" for m in SUPPORTED_MINORS]
    for folder in folders:
        assert minor(component_tag(folder)) == int(folder.name.split(".")[1]), folder


def test_each_tested_version_is_the_tag_of_its_minors_component() -> None:
    for version in CONTROL_PLANE_VERSIONS:
        assert component_tag(VERSIONS_DIR / f"v1.{minor(version)}") == version


def test_the_default_manifests_name_the_newest_minor_and_its_image() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert kustomization["components"] == [f"kubernetes-versions/v1.{minor(NEWEST)}"]
    deployment: Any = yaml.safe_load((MANIFESTS / "deployment.yaml").read_text())
    (scheduler,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "kube-scheduler"]
    assert scheduler["image"] == f"registry.k8s.io/kube-scheduler:{NEWEST}"


def test_the_readme_states_the_supported_and_tested_versions() -> None:
    section = (ROOT / "README.md").read_text().split("## Run against a real control plane", 1)[1].split("\n## ", 1)[0]
    for version in CONTROL_PLANE_VERSIONS:
        assert version in section
    assert f"1.{SUPPORTED_MINORS[0]} to 1.{SUPPORTED_MINORS[-1]}" in section


def test_a_missing_program_is_named_with_the_command_that_builds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUPACK_KUBE_CACHE", str(tmp_path))
    with pytest.raises(MissingBinary) as caught:
        kube_programs.kube_bin_dir(NEWEST, ("kube-apiserver", "kubelet"))
    message = str(caught.value)
    assert "kube-apiserver, kubelet" in message
    assert f"tests/e2e/tools/build-kube.sh {NEWEST} kube-apiserver kubelet" in message


def test_the_build_script_refuses_what_is_not_a_release(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(kube_programs.BUILD_SCRIPT), "v1.37"],
        capture_output=True,
        text=True,
        env={**os.environ, "GPUPACK_KUBE_CACHE": str(tmp_path)},
        check=False,
    )
    assert done.returncode == 2 and "not a release" in done.stderr


@pytest.mark.slow
def test_the_e2e_suite_fails_rather_than_skips_when_programs_are_missing(tmp_path: Path) -> None:
    """With an empty program cache a control-plane case fails naming the build command; no green run."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "GPUPACK_E2E_ALLOW_SKIP")}
    env["GPUPACK_KUBE_CACHE"] = str(tmp_path)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/e2e/test_burst.py"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env, check=False, timeout=300)
    assert done.returncode == 1, done.stdout[-2000:]
    assert "the e2e suite cannot run" in done.stdout and "build-kube.sh" in done.stdout
    allowed = subprocess.run(
        [*argv, "-rs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**env, "GPUPACK_E2E_ALLOW_SKIP": "1"},
        check=False,
    )
    assert allowed.returncode == 0 and "SKIPPED" in allowed.stdout and "GPUPACK_E2E_ALLOW_SKIP=1" in allowed.stdout
