"""The e2e run uses the KubeSchedulerConfiguration that `manifests/` ships, changed in three fields only."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from gpupack.harness.controlplane import (
    E2E_REWRITES,
    e2e_scheduler_config,
    shipped_scheduler_config,
    write_scheduler_config,
)


def _without_rewritten_fields(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with the three fields E2E_REWRITES names removed (the extender URL keeps its host)."""
    stripped = copy.deepcopy(config)
    stripped.get("clientConnection", {}).pop("kubeconfig", None)
    stripped.get("leaderElection", {}).pop("leaderElect", None)
    extender = stripped["extenders"][0]
    extender["urlPrefix"] = extender["urlPrefix"].rsplit(":", 1)[0]
    return {key: value for key, value in stripped.items() if value != {}}


def test_e2e_config_differs_from_the_shipped_one_only_in_the_three_rewrites(tmp_path: Path) -> None:
    shipped = shipped_scheduler_config()
    kubeconfig = tmp_path / "kubeconfig"
    e2e = e2e_scheduler_config(shipped, kubeconfig, 45678)
    assert len(E2E_REWRITES) == 3
    assert e2e["clientConnection"]["kubeconfig"] == str(kubeconfig)
    assert e2e["leaderElection"]["leaderElect"] is False
    assert e2e["extenders"][0]["urlPrefix"].endswith(":45678")
    assert _without_rewritten_fields(e2e) == _without_rewritten_fields(shipped)


def test_the_control_plane_writes_exactly_that_config(tmp_path: Path) -> None:
    """What kube-scheduler is given is `e2e_scheduler_config` of the manifest, nothing else."""
    kubeconfig = tmp_path / "kubeconfig"
    written = write_scheduler_config(tmp_path / "scheduler-config.yaml", kubeconfig, 45678)
    assert yaml.safe_load(written.read_text()) == e2e_scheduler_config(shipped_scheduler_config(), kubeconfig, 45678)


def test_a_case_may_leave_out_the_preempt_verb_and_nothing_else(tmp_path: Path) -> None:
    """`preempt_verb=False` (test_preemption's count-based runs) drops `preemptVerb` alone; the default keeps it."""
    shipped = copy.deepcopy(shipped_scheduler_config())
    shipped["extenders"][0]["preemptVerb"] = "preempt"  # whether or not the manifest has it yet
    kubeconfig = tmp_path / "kubeconfig"
    with_verb = e2e_scheduler_config(shipped, kubeconfig, 45678)
    without = e2e_scheduler_config(shipped, kubeconfig, 45678, preempt_verb=False)
    assert with_verb["extenders"][0]["preemptVerb"] == "preempt"
    assert "preemptVerb" not in without["extenders"][0]
    without["extenders"][0]["preemptVerb"] = "preempt"
    assert without == with_verb
