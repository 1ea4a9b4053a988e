"""Kernels compiled into the image: a numba cache made at build time seeds the writable one (#13).

With an empty numba cache every new pod of the Deployment spent ~56 s compiling before `/readyz`. The
sidecar's root filesystem is read-only and numba only uses a cache folder it can write to, so the
image keeps the cache compiled at build time in `$GPUPACK_NUMBA_CACHE_SEED` and `gpupack serve` copies
it into `$NUMBA_CACHE_DIR` (an emptyDir) before any kernel runs. numba checks each cached entry
against its source file's size and time, which the image does not change, and recompiles on a mismatch.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

SEED_ENV = "GPUPACK_NUMBA_CACHE_SEED"


def seed_numba_cache(environ: Mapping[str, str] = os.environ) -> int:
    """Copy the seed cache into NUMBA_CACHE_DIR unless that already holds one; the files copied."""
    seed, target = environ.get(SEED_ENV), environ.get("NUMBA_CACHE_DIR")
    if not seed or not target or not Path(seed).is_dir() or any(Path(target).rglob("*.nbi")):
        return 0
    shutil.copytree(seed, target, dirs_exist_ok=True)
    return sum(1 for path in Path(seed).rglob("*") if path.is_file())
