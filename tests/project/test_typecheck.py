"""`make lint`'s mypy driver (.ci/typecheck.py) hands mypy every module under its installed gpupack.* name."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from tests.components import COMPONENTS, ROOT

FOLDERS = COMPONENTS.keys()


def _driver() -> ModuleType:
    """.ci/typecheck.py, a script outside the package, loaded from its path."""
    spec = importlib.util.spec_from_file_location("typecheck", ROOT / ".ci" / "typecheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_file_is_checked_as_the_module_it_installs_as() -> None:
    by_module = {source.module: Path(source.path).resolve() for source in _driver().installed_sources()}
    assert by_module["gpupack.cli"] == ROOT / "gpupack" / "cli.py"
    assert by_module["gpupack.extender.state"] == ROOT / "extender" / "state.py"
    assert by_module["gpupack.kube.sources"] == ROOT / "kube" / "sources" / "__init__.py"
    assert by_module["gpupack.scoring.kernels"] == ROOT / "scoring" / "kernels.py"
    # generated protobuf modules are checked through their type stubs, as an import would see them
    assert by_module["gpupack.agent.kubelet.deviceplugin_pb2"] == ROOT / "agent" / "kubelet" / "deviceplugin_pb2.pyi"
    assert all(module.startswith("gpupack") for module in by_module)


def test_no_file_of_the_mapped_folders_is_left_out() -> None:
    checked = {path.with_suffix(".py") for path in (Path(s.path).resolve() for s in _driver().installed_sources())}
    on_disk = {path for folder in FOLDERS for path in (ROOT / folder).rglob("*.py") if "__pycache__" not in path.parts}
    assert checked == on_disk
