"""One base class for gpupack's own errors (#17 item 2): every `...Error` class defined in gpupack
derives from `GpupackError`, and still from the builtin it always was, so old handlers keep working."""

from __future__ import annotations

import ast
import importlib

import pytest

from gpupack.errors import GpupackError
from gpupack.extender.binder import BindError, BindFailure
from gpupack.scoring.request import RequestError
from tests.components import COMPONENTS, ROOT


def error_classes() -> list[tuple[str, str]]:
    """(module, class name) of every top-level class whose name ends in Error, found in the source."""
    found = []
    for folder, package in COMPONENTS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "kubelet" in path.parts:  # generated gRPC stubs
                continue
            module = ".".join([package, *path.relative_to(ROOT / folder).with_suffix("").parts])
            tree = ast.parse(path.read_text())
            found += [(module, n.name) for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("Error")]
    return found


def test_the_scan_finds_the_errors_the_issue_names() -> None:
    names = {name for _, name in error_classes()}
    assert {"RequestError", "BindError", "SettingsError", "SourceError", "WireError", "InventoryError"} <= names


@pytest.mark.parametrize(("module", "name"), error_classes(), ids=lambda value: value.rsplit(".", 1)[-1])
def test_every_gpupack_error_derives_from_the_base(module: str, name: str) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, GpupackError)


def test_names_messages_and_builtins_are_kept() -> None:
    assert issubclass(RequestError, ValueError) and str(RequestError("too many GPUs")) == "too many GPUs"
    refused = BindError(BindFailure.NO_FIT, "pod default/p no longer fits on a")
    assert str(refused) == refused.reason == "pod default/p no longer fits on a"
    assert refused.kind == "no-fit" and f"{refused.kind}" == "no-fit"  # metric labels keep their text
    with pytest.raises(GpupackError):
        raise refused
