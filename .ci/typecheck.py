"""mypy over the gpupack distribution, each file checked under the module name it is installed as.

pyproject.toml maps the top-level folders into one namespace (`extender/state.py` is
`gpupack.extender.state`). mypy names a module after its folder alone and cannot follow setuptools'
editable-install finder (python/mypy#13392), so run plainly it would check `extender.state` and
lose every `gpupack.extender` import to Any. This driver hands mypy every module of every package
listed in `[tool.setuptools]` under its installed name; errors still name the real files.
Further paths given on the command line (e.g. `tests`) are checked under their own names.
Options live in `[tool.mypy]` of pyproject.toml. Usage: python .ci/typecheck.py [paths...]
"""

from __future__ import annotations

import os
import sys
import time
import tomllib
from pathlib import Path

from mypy import util
from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parents[1]


def installed_sources() -> list[BuildSource]:
    """One BuildSource per module of the distribution, named as installed, with its source path."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders: dict[str, str] = setuptools["package-dir"]
    sources = []
    for package in setuptools["packages"]:
        top = max((name for name in folders if package == name or package.startswith(name + ".")), key=len)
        folder = ROOT.joinpath(folders[top], *package[len(top) :].split(".")[1:])
        for path in sorted(folder.glob("*.py")):
            module = package if path.stem == "__init__" else f"{package}.{path.stem}"
            stub = path.with_suffix(".pyi")  # a stub beside a module stands for it, as on import
            shown = os.path.relpath(stub if stub.exists() else path)  # errors name the file from here
            sources.append(BuildSource(shown, module, None, base_dir=str(ROOT)))
    return sources


def main(paths: list[str]) -> int:
    """Check the distribution and `paths`; print mypy's messages and summary; mypy's exit code."""
    started = time.time()
    fscache = FileSystemCache()
    config = ["--config-file", str(ROOT / "pyproject.toml")]  # from any folder
    extra, options = process_options([*config, *paths], fscache=fscache, require_targets=False)
    sources = installed_sources() + extra
    _, messages, blockers = run_build(sources, options, fscache, started, sys.stdout, sys.stderr)
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    errors, _notes, files = util.count_stats(messages)
    if errors:
        print(formatter.format_error(errors, files, len(sources), blockers=blockers, use_color=options.color_output))
        return 2 if blockers else 1
    print(formatter.format_success(len(sources), options.color_output))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
