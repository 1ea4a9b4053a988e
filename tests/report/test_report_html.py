"""The HTML report, rendered by a real headless Chromium: tables and plots are laid out as drawn."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpupack.cli import main
from gpupack.report.render_html import render_html
from tests.conftest import needs_data
from tests.extender_helpers import EXAMPLE_CLUSTER, ROOT

POLICY_CONFIG = ROOT / "manifests" / "policy-config.yaml"
CHROMIUM = Path(shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium")
needs_chromium = needs_data(CHROMIUM, "Debian's chromium: apt-get install -y chromium (.ci/run installs it)")


def headless_dom(page: Path) -> str:
    """The DOM of `page` after Chromium loaded it and ran its scripts."""
    command = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--virtual-time-budget=5000", "--dump-dom", page.as_uri()]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def expected_bars(report: dict[str, Any]) -> int:
    """Bars with a non-zero value in the page's three charts."""
    values = [v for p in report["pools"] for v in (p["gpus_allocated"], p["idle_gpus"], p["idle_hourly_cost"])]
    values += [*report["by_namespace"].values(), report["unallocated_hourly_cost"]]
    return sum(1 for v in values if v > 0)


def table_rows(dom: str, table_id: str) -> int:
    match = re.search(rf'<table id="{table_id}">.*?<tbody>(.*?)</tbody>', dom, re.S)
    assert match, f"no table {table_id} in the rendered page"
    return match.group(1).count("<tr>")


@needs_chromium
def test_html_report_in_headless_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "report.html"
    args = ["report", "--cluster-file", str(EXAMPLE_CLUSTER), "--config", str(POLICY_CONFIG), "--by", "team"]
    assert main([*args, "--html", str(page), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    dom = headless_dom(page)
    drawn = re.search(r'data-rendered-bars="(\d+)"', dom)
    assert drawn, "the page's load script did not run"
    assert int(drawn.group(1)) == expected_bars(report) > 0
    for chart in ("pools-gpus", "pools-idle-cost", "namespace-cost"):
        assert f'<svg id="{chart}"' in dom
    assert table_rows(dom, "pools") == len(report["pools"])
    assert table_rows(dom, "namespaces") == len(report["by_namespace"])
    assert table_rows(dom, "label-team") == len(report["by_label"]["team"])
    assert table_rows(dom, "drain-plan") == len(report["drain_plan"])


def test_html_escapes_names() -> None:
    report = {
        "total_hourly_cost": 1.0, "unallocated_hourly_cost": 0.0, "drain_saves_hourly": 0.0, "pools": [],
        "by_namespace": {"<script>x</script>": 1.0}, "by_label": {},
        "window": {"hours": 1, "by_namespace": {"<script>x</script>": {"gpu_hours": 1.0, "cost": 1.0}}},
        "drain_plan": [],
    }  # fmt: skip
    page = render_html(report)
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
