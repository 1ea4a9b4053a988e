"""One list of components (pyproject.toml's package-dir) drives the wheel, the type check, lint and the image:
a new top-level component missing from any of them fails here (#25)."""

from __future__ import annotations

import tomllib

from tests.components import COMPONENTS, ROOT, SETUPTOOLS, component_folders_on_disk, subpackages_on_disk


def test_every_top_level_package_folder_is_a_component() -> None:
    assert component_folders_on_disk() == set(COMPONENTS)


def test_every_folder_is_installed_under_its_own_name() -> None:
    assert all(package == "gpupack" if folder == "gpupack" else package == f"gpupack.{folder}"
               for folder, package in COMPONENTS.items())  # fmt: skip


def test_the_wheel_lists_every_package_and_subpackage() -> None:
    assert set(SETUPTOOLS["packages"]) == subpackages_on_disk()


def test_lint_bans_the_bare_name_of_every_mapped_folder() -> None:
    """From the repository root a bare `import kube` works and would pass the tests, then fail when installed."""
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    banned = set(ruff["flake8-tidy-imports"]["banned-api"])
    assert banned == set(COMPONENTS) - {"gpupack"}


def test_the_image_copies_every_component() -> None:
    """The wheel is built inside the image from the folders it copies: a missing COPY breaks the image."""
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    copied = {line.split()[1].rstrip("/") for line in lines if line.startswith("COPY ") and "--from" not in line}
    assert set(COMPONENTS) <= copied, f"Dockerfile does not COPY {sorted(set(COMPONENTS) - copied)}"
