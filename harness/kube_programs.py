"""Which Kubernetes releases gpupack is tested on, and where their programs come from.

The programs (kube-apiserver, kube-scheduler, kube-controller-manager, kubelet, kubectl) are built from
the Go module `k8s.io/kubernetes` at a released version by `tests/e2e/tools/build-kube.sh`, into a cache
outside the clone (`~/.cache/gpupack/kube/<version>/`, `$GPUPACK_KUBE_CACHE` overrides), so that a fresh
clone on the same machine reuses them. Nothing here downloads a prebuilt program.

`python -m gpupack.harness.kube_programs` builds whatever the e2e suite needs and is missing
(`make e2e` runs it first).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gpupack.errors import GpupackError

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "tests" / "e2e" / "tools" / "build-kube.sh"

# The control-plane suite runs on each: the oldest minor gpupack supports and the newest release the Go
# module proxy served when this list was last raised. A test pins this list and the README names it.
CONTROL_PLANE_VERSIONS = ("v1.33.13", "v1.37.2")
OLDEST_SUPPORTED, NEWEST = CONTROL_PLANE_VERSIONS[0], CONTROL_PLANE_VERSIONS[-1]
CONTROL_PLANE_PROGRAMS = ("kube-apiserver", "kube-scheduler")
# The real-node suite: a full control plane (with controllers, which create the Deployment's and the
# DaemonSet's pods) and a kubelet, all at NEWEST, plus kubectl to apply the shipped manifests.
NODE_PROGRAMS = ("kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubelet", "kubectl")


class MissingBinary(GpupackError, RuntimeError):
    """A program the e2e suite needs is not there; the message says how to get it."""


@dataclass(frozen=True)
class Needed:
    """One version's programs that a suite needs."""

    version: str
    programs: tuple[str, ...]


def needed_programs() -> list[Needed]:
    """Every version the e2e suite runs and the programs it needs of each."""
    needs = [Needed(version, CONTROL_PLANE_PROGRAMS) for version in CONTROL_PLANE_VERSIONS if version != NEWEST]
    return [*needs, Needed(NEWEST, NODE_PROGRAMS)]


def cache_root() -> Path:
    """The folder that holds one sub-folder of programs per version."""
    return Path(os.environ.get("GPUPACK_KUBE_CACHE") or Path.home() / ".cache" / "gpupack" / "kube")


def how_to_build(version: str, programs: tuple[str, ...]) -> str:
    """The command that builds `programs` of `version` into the cache."""
    return f"{BUILD_SCRIPT.relative_to(REPO_ROOT)} {version} {' '.join(programs)} (Go and the Go module proxy)"


def kube_bin_dir(version: str, programs: tuple[str, ...] = CONTROL_PLANE_PROGRAMS) -> Path:
    """The folder of the build cache with `programs` of `version`.

    MissingBinary names what is missing and the command that builds it.
    """
    folder = cache_root() / version
    missing = tuple(name for name in programs if not os.access(folder / name, os.X_OK))
    if missing:
        raise MissingBinary(f"{folder} lacks {', '.join(missing)}; build them: {how_to_build(version, missing)}")
    return folder


def build_missing() -> None:
    """Build every program of needed_programs() that the cache lacks (the script skips what is there)."""
    for need in needed_programs():
        subprocess.run(["bash", str(BUILD_SCRIPT), need.version, *need.programs], check=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m gpupack.harness.kube_programs [--list]`: build what is missing, or list the matrix."""
    parser = argparse.ArgumentParser(prog="python -m gpupack.harness.kube_programs", description=__doc__)
    parser.add_argument("--list", action="store_true", help="print each version and its programs, build nothing")
    args = parser.parse_args(argv)
    if args.list:
        for need in needed_programs():
            print(need.version, " ".join(need.programs))
        return 0
    try:
        build_missing()
    except subprocess.CalledProcessError as exc:
        print(f"building Kubernetes programs failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
