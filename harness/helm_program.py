"""Which helm the e2e suite installs the chart (charts/gpupack) with, and where it comes from.

helm is built from the Go module `helm.sh/helm/v3` at a released version by `tests/e2e/tools/build-helm.sh`,
into a cache outside the clone (`~/.cache/gpupack/helm/<version>/helm`, `$GPUPACK_HELM_CACHE` overrides),
as the Kubernetes programs are (`kube_programs`). Nothing here downloads a prebuilt program.
`python -m gpupack.harness.helm_program` builds it when it is missing; `make e2e` runs it first, after
`python -m gpupack.harness.kube_programs`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from gpupack.harness.kube_programs import REPO_ROOT, MissingBinary

HELM_VERSION = "v3.22.0"
BUILD_SCRIPT = REPO_ROOT / "tests" / "e2e" / "tools" / "build-helm.sh"


def cache_root() -> Path:
    """The folder that holds one sub-folder per helm version."""
    return Path(os.environ.get("GPUPACK_HELM_CACHE") or Path.home() / ".cache" / "gpupack" / "helm")


def how_to_build(version: str = HELM_VERSION) -> str:
    """The command that builds helm `version` into the cache."""
    return f"{BUILD_SCRIPT.relative_to(REPO_ROOT)} {version} (Go and the Go module proxy)"


def helm_binary(version: str = HELM_VERSION) -> Path:
    """The cached helm of `version`; MissingBinary names the command that builds it."""
    path = cache_root() / version / "helm"
    if not os.access(path, os.X_OK):
        raise MissingBinary(f"{path} is missing; build it: {how_to_build(version)}")
    return path


def build_missing(version: str = HELM_VERSION) -> None:
    """Build helm `version` unless the cache holds it (the script skips what is there)."""
    subprocess.run(["bash", str(BUILD_SCRIPT), version], check=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m gpupack.harness.helm_program [--print]`: build helm when missing, or print where it is."""
    parser = argparse.ArgumentParser(prog="python -m gpupack.harness.helm_program", description=__doc__)
    parser.add_argument("--print", action="store_true", help="print the cached helm's path, build nothing")
    args = parser.parse_args(argv)
    try:
        if args.print:
            print(helm_binary())
        else:
            build_missing()
    except (MissingBinary, subprocess.CalledProcessError) as exc:
        print(f"helm {HELM_VERSION}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
