"""A folder of finished bench jobs, so an interrupted or repeated `gpupack bench --cache DIR` only runs
what is new.

A job's file is named by a hash of the job (its dataclass fields) and of the source of the code that
decides its result (scoring/ and the simulator modules of bench/; for the limit, bench/limit/ and what
it reads): change either and the job runs again.
"""

from __future__ import annotations

import dataclasses
import hashlib
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from gpupack.bench.jobs import Job

PACKAGE = Path(__file__).resolve().parents[1]
# what a job's result depends on; the report's own modules (sections, text, plots) are left out
CODE = ("scoring", "sim/simulate.py", "sim/churn.py", "bench/jobs.py", "sim/protocol.py",
        "sim/workload.py", "sim/packing_metrics.py", "sim/openb.py", "sim/load.py", "sim/scenarios.py",
        "bench/equal_risk.py")  # fmt: skip
# a limit job (bench.limit) is decided by no policy: by the LP, the workload, and the inventory its
# offline packing commits to; so a policy change does not throw its results away
LIMIT_CODE = ("bench/limit", "bench/jobs.py", "sim/protocol.py", "sim/workload.py", "sim/openb.py", "sim/load.py",
              "sim/simulate.py", "scoring/facts.py", "scoring/request.py", "scoring/inventory.py",
              "scoring/geometry.py")  # fmt: skip


@cache
def code_fingerprint(code: tuple[str, ...] = CODE) -> str:
    """Hash of the source files in `code` (sorted, contents and names)."""
    digest = hashlib.sha256()
    for entry in code:
        path = PACKAGE / entry
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            if file.is_file():
                digest.update(file.relative_to(PACKAGE).as_posix().encode())
                digest.update(file.read_bytes())
    return digest.hexdigest()


def job_path(folder: Path, job: Job) -> Path:
    """Where `job`'s result is (or will be) kept."""
    fields = orjson.dumps(dataclasses.asdict(job), option=orjson.OPT_SORT_KEYS)
    code = code_fingerprint(LIMIT_CODE if getattr(job, "scenario", "") == "limit" else CODE)
    key = hashlib.sha256(type(job).__name__.encode() + fields + code.encode()).hexdigest()[:24]
    return folder / f"{getattr(job, 'scenario', 'job')}-{key}.json"


def load(folder: Path, job: Job) -> dict[str, object] | None:
    """The kept result of `job`, None when there is none."""
    path = job_path(folder, job)
    return orjson.loads(path.read_bytes()) if path.exists() else None


def store(folder: Path, job: Job, result: dict[str, object]) -> None:
    """Keep `result` (written to a temporary name first, so a killed run leaves no half file)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = job_path(folder, job)
    partial = path.with_suffix(".part")
    partial.write_bytes(orjson.dumps(result, option=orjson.OPT_NON_STR_KEYS))
    partial.replace(path)
