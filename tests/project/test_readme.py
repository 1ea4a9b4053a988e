"""README: the first screen's two commands, where the data outside the repository comes from, explain."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

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


# A ```sh block of one `.venv/bin/gpupack` command directly followed by a bare ``` block: what it prints.
SHOWN_OUTPUT = re.compile(r"```sh\n(\.venv/bin/gpupack [^\n]*)\n```\n\n```\n(.*?)```", re.DOTALL)


def shown_outputs() -> list[tuple[str, str]]:
    """(command, the output the README shows for it) of every such pair of blocks."""
    return SHOWN_OUTPUT.findall(README)


def test_the_readme_shows_the_explain_sample_as_a_command_and_its_output() -> None:
    """Guard against a vacuous check below: the explain sample is found as a pair of blocks (#27)."""
    commands = [command for command, _ in shown_outputs()]
    explain = ".venv/bin/gpupack explain --cluster-file manifests/examples/"
    assert any(command.startswith(explain) for command in commands)


@pytest.mark.parametrize(("command", "shown"), shown_outputs(), ids=[c for c, _ in shown_outputs()])
def test_a_command_prints_what_the_readme_shows(
    command: str, shown: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """#27: the explain sample no longer matched what the command printed. Run in-process from the
    repository root, on the example cluster the README names; every line must match exactly (none of the
    commands shown prints a timing or a date that would need normalising)."""
    from gpupack.cli import main

    monkeypatch.chdir(ROOT)
    assert main(shlex.split(command)[1:]) == 0
    assert capsys.readouterr().out == shown


def _deploy_section() -> str:
    return README.split("\n## Deploy\n", 1)[1].split("\n## ", 1)[0]


def test_the_deploy_section_names_the_node_set_up_the_code_needs() -> None:
    """#27: the agent's node label, NVIDIA's device plugin off, and every node label gpupack reads."""
    from gpupack.kube import keys

    section = _deploy_section()
    daemonset = yaml.safe_load((ROOT / "manifests" / "agent" / "daemonset.yaml").read_text())
    ((label, value),) = daemonset["spec"]["template"]["spec"]["nodeSelector"].items()
    assert f"`{label}={value}`" in section and f"kubectl label node gpu-node-1 {label}={value}" in section
    assert "device plugin off" in section
    labels = [keys.LABEL_GPU_PRODUCT, keys.LABEL_GPU_COUNT, keys.LABEL_GPU_MEMORY, keys.LABEL_INSTANCE_TYPE]
    for key in [*labels, *keys.SPOT_LABELS, keys.ANNOTATION_MIG, keys.ANNOTATION_HOURLY_COST]:
        assert f"`{key}" in section, key


def test_the_deploy_section_says_how_to_use_ones_own_registry_and_which_kubectl() -> None:
    section = _deploy_section()
    kustomization = yaml.safe_load((ROOT / "manifests" / "kustomization.yaml").read_text())
    ((image,),) = [kustomization["images"]]
    assert f"- name: {image['name']}\n  newName: registry.example.com/gpupack" in section
    assert "`images` in `manifests/kustomization.yaml`" in section
    for feature in ("components", "labels", "images"):
        assert feature in kustomization and f"`{feature}`" in section, feature
    assert "1.32 or newer" in section and "kubectl 1.20" in section
    assert "manifests/prometheus-operator/" in section and "no CRD" in section
