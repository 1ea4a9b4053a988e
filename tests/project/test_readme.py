"""README: the first screen's two commands, where the data outside the repository comes from, explain."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from gpupack.bench.bench_report import TRACES_ENV, default_traces_dir
from tests.conftest import GET_OPENB

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL)


def test_the_first_screen_has_exactly_the_two_set_up_commands() -> None:
    first = code_blocks(README)[0]
    commands = [line.split("#")[0].strip() for line in first.splitlines() if line.strip()]
    assert commands == ["make run", "make test"]


def test_the_readme_says_where_the_openb_traces_go_as_the_code_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """`make test` (tests/conftest.py) and `gpupack bench` read the traces where the README says."""
    monkeypatch.delenv(TRACES_ENV, raising=False)
    assert default_traces_dir() == ROOT.parent / "shared" / "traces" / "openb"
    assert TRACES_ENV == "GPUPACK_OPENB_TRACES" and "GPUPACK_OPENB_TRACES" in GET_OPENB
    assert "../shared/traces/openb" in README and f"${TRACES_ENV}" in README
    data = README.split("## Data outside the repository", 1)[1].split("\n## ", 1)[0]
    assert "github.com/alibaba/clusterdata" in data and "cluster-trace-gpu-v2023/csv" in data
    assert "make test" in data and "gpupack bench" in data and "exit code 2" in data


def test_explain_live_and_the_kubectl_plugin_are_documented_and_installed() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-gpupack"] == "gpupack.cli:kubectl_main"
    explain = README.split("## Why did my pod go there?", 1)[1].split("\n## ", 1)[0]
    assert "kubectl gpupack explain" in explain and "--kubeconfig" in explain
    assert "--pod manifests/examples/pod.yaml" in explain and (ROOT / "manifests" / "examples" / "pod.yaml").is_file()
