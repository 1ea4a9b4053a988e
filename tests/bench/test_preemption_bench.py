"""The priority protocol's bench (#28 item 3): its report part, paired per seed, and its place in REPORT.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from gpupack.bench import preemption
from gpupack.bench.report_text import separate_runs_text


def _run(chooser: str, seed: int, **numbers: float) -> dict[str, Any]:
    run = {"evictions_per_placed_high": 1.0, "wasted_evictions": 0, "evictions": 10, "high_pending": 0}
    run |= {"high_submitted": 10, "high_placed": 10} | numbers
    return {"workload": "w", "chooser": chooser, "seed": seed, "run": run}


def test_the_bench_writes_its_part_and_report_text_takes_it_in(tmp_path: Path) -> None:
    code = preemption.main(["--traces", "", "--seeds", "42,43", "--scale", "0.1", "--workers", "1",
                            "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    text = (tmp_path / "preemption.md").read_text()
    assert text.startswith("# Preemption: gpupack's victim choice")
    assert "--seeds 42,43" in text and "nothing was tuned" in text
    assert f"**{preemption.MIG}**: gpupack wasted evictions on no seed (0 on all 2)" in text
    assert "## mig-inference: per seed" in text
    saved = orjson.loads((tmp_path / "preemption.json").read_bytes())
    runs = saved["runs"][preemption.MIG]
    assert sorted((r["chooser"], r["seed"]) for r in runs) == [
        ("count", 42), ("count", 43), ("gpupack", 42), ("gpupack", 43)
    ]  # fmt: skip
    assert all(r["run"]["wasted_evictions"] == 0 for r in runs if r["chooser"] == "gpupack")
    part = separate_runs_text(tmp_path)
    assert part.startswith("\n## 8. Preemption: gpupack's victim choice")
    assert "\n### mig-inference: per seed" in part and "\n## mig" not in part
    assert separate_runs_text(tmp_path / "nowhere") == ""


def test_goals_name_the_seeds_that_miss_and_count_ties() -> None:
    results = {
        "w": [
            _run("gpupack", 1, evictions=8), _run("count", 1),
            _run("gpupack", 2, wasted_evictions=2), _run("count", 2),
            _run("gpupack", 3, evictions=12, evictions_per_placed_high=0.5), _run("count", 3),
        ]
    }  # fmt: skip
    totals, line = preemption.goals(results)
    assert "gpupack placed 30 high-priority pods with 30 evictions (2 wasted); count placed 30 with 30 (0" in totals
    assert "wasted evictions on seeds 2;" in line
    assert "fewer evictions than count on 1 of 3 seeds (equal on 1, more on 1)" in line
    assert "fewer evictions per placed high-priority pod on 1 of 3" in line
    compared = preemption.compare_workload(results["w"])
    assert compared["evictions"].counts() == "1/1/1"
    assert compared["wasted_evictions"].counts() == "0/1/2"
