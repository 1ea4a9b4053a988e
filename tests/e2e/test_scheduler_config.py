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
