"""The gang protocol's bench (#29 item 4): end to end on a tiny configuration, and its report's tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gpupack.bench import gangs
from gpupack.bench.bench_report import default_traces_dir
from gpupack.bench.jobs import NODE_LIST


def _run(arm: str, seed: int, **numbers: float) -> dict[str, Any]:
    run = {"jobs_arrived": 10, "jobs_started": 9, "idle_gpu_hours": 0.0, "wait_mean": 0.1, "wait_p95": 0.3}
    run |= {"unallocated_pct": 5.0, "jobs_split": 0, "mean_idle_gpus": 0.0} | numbers
    return {"workload": "w", "arm": arm, "seed": seed, "horizon": 3.0, "gpus_total": 8, "run": run}


def test_the_bench_runs_end_to_end_and_writes_its_report(tmp_path: Path) -> None:
    if not (default_traces_dir() / NODE_LIST).is_file():
        pytest.skip("the openb traces are not here")
    code = gangs.main(["--seeds", "42,43", "--traces", "default", "--nvl72", "multigpu50", "--node-limit", "80",
                       "--racks", "2", "--horizon", "1.5", "--workers", "1", "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    text = (tmp_path / "gangs.md").read_text()
    assert text.startswith("# Gangs: all members or none")
    assert "--seeds 42,43" in text and "nothing was tuned" in text
    assert "**default**: gangs held GPUs idle for partial jobs on no seed (0 GPU-hours on all 2)" in text
    assert "## Paired over the seeds" in text and "| default | jobs started |" in text
    for workload in ("default", "nvl72/multigpu50"):
        assert f"## {workload}: per seed" in text
    assert "\n| 42 | " in text and "\n| 43 | " in text
    saved = orjson.loads((tmp_path / "gangs.json").read_bytes())
    runs = saved["runs"]["nvl72/multigpu50"]
    assert sorted((r["arm"], r["seed"]) for r in runs) == [
        ("gangs", 42), ("gangs", 43), ("pod-by-pod", 42), ("pod-by-pod", 43)
    ]  # fmt: skip
    assert all(r["run"]["idle_gpu_hours"] == 0 for r in runs if r["arm"] == "gangs")
    assert {r["gpus_total"] for r in runs} == {2 * 18 * 4}


def test_acceptance_names_seeds_where_gangs_held_gpus_and_pairs_by_seed() -> None:
    results = {
        "w": [
            _run("gangs", 1), _run("pod-by-pod", 1, idle_gpu_hours=2.0, jobs_started=8),
            _run("gangs", 2, idle_gpu_hours=1.0), _run("pod-by-pod", 2, idle_gpu_hours=4.0),
            _run("gangs", 3), _run("pod-by-pod", 3),
        ]
    }  # fmt: skip
    (line,) = gangs.acceptance(results)
    assert "gangs held GPUs idle for partial jobs on seeds 2;" in line
    assert "pod-by-pod held 0.0 to 4.0 GPU-hours (median 2.0), more than 0 on 2 of 3 seeds" in line
    compared = gangs.compare_workload(results["w"])
    assert compared["idle_gpu_hours"].counts() == "2/0/1"
    assert compared["jobs_started"].counts() == "1/0/2"  # more jobs started is better
    busy = {"unallocated_pct": 5.0, "mean_idle_gpus": 0.8, "gpus_total": 8, "wait_mean": 0.5}
    assert gangs._value(busy, "busy_pct") == 85.0 and gangs._value(busy, "wait_mean") == 30.0  # minutes
    table = gangs.per_seed_table(results["w"])
    assert [row[0] for row in table.rows] == [1, 2, 3] and len(table.columns) == 12
    text, saved = gangs.render(results, {"cpu": "x", "cores": 1, "ram_gib": 1, "python": "3", "date": "d",
                                         "commit": "c", "seconds": 0}, "cmd")  # fmt: skip
    assert "## w: per seed" in text and saved["command"] == "cmd"
