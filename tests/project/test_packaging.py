"""The distribution installs one package, `gpupack`, and the service runs without the `bench` extra
(and without importing the simulator or the control-plane harness)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.components import subpackages_on_disk

ROOT = Path(__file__).resolve().parents[2]

# Refuses matplotlib and the simulator the way a venv without the `bench` extra would, then starts the
# service's whole import graph and answers one filter through the app.
WITHOUT_BENCH = """
import argparse, importlib.abc, sys

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "matplotlib" or name.startswith(("gpupack.bench", "gpupack.sim", "gpupack.harness")):
            raise ImportError(f"{name} is not installed without the bench extra")
        return None

sys.meta_path.insert(0, Refuse())
from fastapi.testclient import TestClient
from gpupack.extender.warm_up import warm_up
from gpupack.extender.app import create_app
from gpupack.extender.service import build_source
from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
import gpupack.cli, gpupack.agent.main

settings = Settings()
state = ClusterState(settings)
source = build_source(argparse.Namespace(cluster_file="manifests/examples/cluster.yaml"), state, settings)
source.start()
warm_up(state)
client = TestClient(create_app(state, settings))
assert client.get("/readyz").status_code == 200, client.get("/readyz").text
print(sorted(name for name in sys.modules if name.startswith("gpupack")))
"""


@pytest.mark.slow
def test_the_wheel_holds_only_the_gpupack_package(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), ROOT],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("gpupack-*.whl")
    top_level = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"gpupack"}
    names = zipfile.ZipFile(wheel).namelist()
    for package in subpackages_on_disk():
        assert f"{package.replace('.', '/')}/__init__.py" in names
    assert "gpupack/agent/kubelet/deviceplugin_pb2.py" in names
    # the license (#27): pyproject's license-files, the text itself
    (license_name,) = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
    assert zipfile.ZipFile(wheel).read(license_name) == (ROOT / "LICENSE").read_bytes()
    (metadata,) = [name for name in names if name.endswith(".dist-info/METADATA")]
    assert "License-Expression: Apache-2.0" in zipfile.ZipFile(wheel).read(metadata).decode()


def test_the_license_is_the_apache_2_text_pyproject_names() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_the_service_imports_neither_matplotlib_nor_the_simulator() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_BENCH], cwd=ROOT, capture_output=True, text=True, check=False, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "gpupack.extender.state" in done.stdout
