"""kubectl's kubeconfig rule (kube/sources/kubeconfig.py), and every command that reads a cluster following it (#27)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import config as kube_config
from kubernetes.config.config_exception import ConfigException

from gpupack.cli import main
from gpupack.kube.sources import SourceError, load_kube_config
from gpupack.kube.sources.kubeconfig import KubeConfigChoice, choose_kube_config, first_current_context


def kubeconfig(path: Path, server: str, context: str | None = None, namespace: str = "default") -> Path:
    """A kubeconfig with one cluster, user and context named `context` (default: the file's stem)."""
    name = context or path.stem
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server}}],
        "users": [{"name": name, "user": {"token": f"token-{name}"}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty home folder, no $KUBECONFIG."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def test_the_flag_wins_then_kubeconfig_then_the_home_file_then_in_cluster(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert choose_kube_config(None) == KubeConfigChoice()  # nothing at all: in-cluster
    assert choose_kube_config(None).in_cluster
    (home / ".kube").mkdir()
    default = kubeconfig(home / ".kube" / "config", "https://home:6443")
    assert choose_kube_config(None).files == (str(default),)
    env = kubeconfig(tmp_path / "env.yaml", "https://env:6443")
    monkeypatch.setenv("KUBECONFIG", str(env))
    assert choose_kube_config(None).files == (str(env),)
    assert choose_kube_config("/given/config").files == ("/given/config",)  # one file, as kubectl takes it


def test_kubeconfig_is_a_list_of_which_the_existing_files_count(home: Path, tmp_path: Path) -> None:
    a = kubeconfig(tmp_path / "a.yaml", "https://a:6443")
    b = kubeconfig(tmp_path / "b.yaml", "https://b:6443")
    listed = f"{tmp_path}/missing.yaml::{b}:{a}:{b}"
    choice = choose_kube_config(None, {"KUBECONFIG": listed})
    assert choice.files == (str(b), str(a))
    assert choice.config_file == f"{b}:{a}"
    assert "$KUBECONFIG" in choice.origin
    (home / ".kube").mkdir()
    kubeconfig(home / ".kube" / "config", "https://home:6443")
    # kubectl: a $KUBECONFIG of missing files is an empty config, then in-cluster; never ~/.kube/config
    nothing = choose_kube_config(None, {"KUBECONFIG": f"{tmp_path}/x:{tmp_path}/y"})
    assert nothing.in_cluster and "names no existing file" in nothing.origin


def test_merged_files_use_the_first_current_context_as_kubectl_does(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The official client's merger would take the last file's current context; kubectl takes the first."""
    first = kubeconfig(tmp_path / "first.yaml", "https://first.example:6443")
    second = kubeconfig(tmp_path / "second.yaml", "https://second.example:6443")
    assert first_current_context([str(first), str(second)]) == "first"
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    assert load_kube_config(None).configuration.host == "https://first.example:6443"
    monkeypatch.setenv("KUBECONFIG", f"{second}:{first}")
    assert load_kube_config(None).configuration.host == "https://second.example:6443"
    # a context of the second file is reachable when the first names it
    doc = yaml.safe_load(first.read_text())
    first.write_text(yaml.safe_dump({**doc, "current-context": "second"}))
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    assert load_kube_config(None).configuration.host == "https://second.example:6443"


def test_an_unusable_choice_is_a_source_error_naming_it(home: Path, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"--kubeconfig .*missing.yaml"):
        load_kube_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(SourceError, match=r"in-cluster service account \(pass --kubeconfig or set \$KUBECONFIG"):
        load_kube_config(None)


COMMANDS = {
    "serve": ["serve"],
    "report": ["report"],
    "defrag": ["defrag"],
    "explain": ["explain", "ml/train-0"],
    "agent": ["agent", "--node", "n1"],
}


@pytest.mark.parametrize("command", COMMANDS, ids=list(COMMANDS))
def test_every_command_reads_the_cluster_kubeconfig_names(
    command: str,
    home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`gpupack serve`, `report` and `agent` used the in-cluster account whatever $KUBECONFIG said (#27)."""
    env = kubeconfig(tmp_path / "env.yaml", "https://env:6443")
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/missing.yaml:{env}")
    loaded: list[str | None] = []

    def refuse(config_file: str | None = None, **_: object) -> None:
        loaded.append(config_file)
        raise ConfigException("stop here")

    monkeypatch.setattr(kube_config, "load_kube_config", refuse)
    monkeypatch.setattr(kube_config, "load_incluster_config", lambda **_: refuse(None))
    monkeypatch.setattr("gpupack.agent.main.select_nvml", lambda *_: object())
    with caplog.at_level(logging.ERROR):
        assert main(COMMANDS[command]) == 2
    assert loaded == [str(env)]
