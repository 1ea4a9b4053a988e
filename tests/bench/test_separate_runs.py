"""REPORT.md's sections after the soak: the benches that run apart from `make bench`, numbered in order."""

from __future__ import annotations

from pathlib import Path

from gpupack.bench.report_text import separate_runs_text


def _write(out: Path, name: str, title: str) -> None:
    (out / f"{name}.md").write_text(f"# {title}\n\nIntro.\n\n## {name}: per seed\n\n| 42 |\n", encoding="utf-8")


def test_each_separate_run_becomes_a_numbered_section_with_its_headings_one_level_down(tmp_path: Path) -> None:
    _write(tmp_path, "preemption", "Preemption: victims")
    _write(tmp_path, "gangs", "Gangs: all or none")
    text = separate_runs_text(tmp_path)
    assert text.index("\n## 8. Preemption: victims (a separate run: `preemption.md` and `preemption.json`)\n") < (
        text.index("\n## 9. Gangs: all or none (a separate run: `gangs.md` and `gangs.json`)\n")
    )
    assert "\n### preemption: per seed" in text and "\n### gangs: per seed" in text
    assert "\n## preemption" not in text and "\n## gangs" not in text


def test_a_missing_run_is_left_out_and_the_next_moves_up(tmp_path: Path) -> None:
    _write(tmp_path, "gangs", "Gangs: all or none")
    assert separate_runs_text(tmp_path).startswith("\n## 8. Gangs: all or none")
    assert separate_runs_text(tmp_path / "nowhere") == ""
