"""A numba cache compiled elsewhere and copied in by `seed_numba_cache` is used: nothing recompiles."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpupack.extender.numba_cache import SEED_ENV, seed_numba_cache

KERNEL = "from numba import njit\n\n\n@njit(cache=True)\ndef add(a, b):\n    return a + b\n"
PROBE = "import kernel; kernel.add(1, 2); print(kernel.add.stats.cache_hits, kernel.add.stats.cache_misses)"


def compile_stats(module_dir: Path, cache_dir: Path) -> str:
    """`cache_hits cache_misses` of a first call in a fresh interpreter using `cache_dir`."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(module_dir)}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_a_seeded_cache_is_used_and_a_present_one_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "kernel.py").write_text(KERNEL)
    seed, target = tmp_path / "seed", tmp_path / "target"
    assert "Counter({(int64, int64): 1})" in compile_stats(tmp_path / "src", seed)  # compiled at "build time"
    environ = {SEED_ENV: str(seed), "NUMBA_CACHE_DIR": str(target)}
    assert seed_numba_cache(environ) > 0
    assert compile_stats(tmp_path / "src", target) == "Counter({(int64, int64): 1}) Counter()"  # hit, no miss
    assert seed_numba_cache(environ) == 0  # the pod's own cache is never overwritten


def test_nothing_to_seed_without_both_folders(tmp_path: Path) -> None:
    assert seed_numba_cache({}) == 0
    assert seed_numba_cache({SEED_ENV: str(tmp_path / "missing"), "NUMBA_CACHE_DIR": str(tmp_path)}) == 0
