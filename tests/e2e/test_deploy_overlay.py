"""The real-node cases apply the shipped manifests changed only where this machine forces it (deploy.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from gpupack.harness.kube_programs import NEWEST
from tests.e2e import deploy
from tests.e2e.deploy import kubectl

MINOR = NEWEST.rsplit(".", 1)[0]
SCHEDULER = r"Deployment/gpupack-scheduler:spec\.template\.spec"
AGENT = r"DaemonSet/gpupack-agent:spec\.template\.spec"
SERVICE_ENV = r"env\[KUBERNETES_SERVICE_(HOST|PORT)\]"
ALLOWED = [
    re.compile(pattern)
    for pattern in (
        r"Namespace/gpupack-system:metadata\.labels\.pod-security\.kubernetes\.io/enforce",
        r"Deployment/gpupack-scheduler:spec\.replicas",
        rf"{SCHEDULER}\.hostNetwork",
        rf"{SCHEDULER}\.containers\[[a-z-]+\]\.({SERVICE_ENV}|image)",
        rf"{AGENT}\.hostNetwork",
        rf"{AGENT}\.containers\[agent\]\.({SERVICE_ENV}|env\[GPUPACK_AGENT_FAKE_NVML\]|image)",
        rf"{AGENT}\.containers\[agent\]\.volumeMounts\[fake-nvml\]",
        rf"{AGENT}\.volumes\[fake-nvml\]",
    )
]


def keyed(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in objects}


def differences(left: Any, right: Any, path: str) -> Iterator[str]:
    """Paths where `left` and `right` differ; lists of named items are matched by name."""
    if left is None and right is None:
        return
    if isinstance(left, dict) and isinstance(right, dict):
        for key in sorted(set(left) | set(right)):
            yield from differences(
                left.get(key), right.get(key), f"{path}.{key}" if path[-1] != ":" else f"{path}{key}"
            )
    elif _named(left) and _named(right):  # an absent list counts as an empty one
        by_name = {item["name"]: item for item in left or []}, {item["name"]: item for item in right or []}
        for name in sorted(set(by_name[0]) | set(by_name[1])):
            yield from differences(by_name[0].get(name), by_name[1].get(name), f"{path}[{name}]")
    elif left != right:
        yield path


def _named(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(isinstance(i, dict) and "name" in i for i in value))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    """(shipped, e2e) objects by kind/name."""
    folder = deploy.write_overlay(tmp_path_factory.mktemp("overlay"), MINOR, "localhost/gpupack:0.1.0", 6443)
    return keyed(deploy.render(kubectl(), deploy.MANIFESTS)), keyed(deploy.render(kubectl(), folder))


def test_the_e2e_objects_differ_from_the_shipped_ones_only_where_the_machine_forces_it(
    rendered: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    shipped, e2e = rendered
    assert set(shipped) == set(e2e)
    changed = [path for key in shipped for path in differences(shipped[key], e2e[key], f"{key}:")]
    assert changed, "the overlay changes nothing: the check would be vacuous"
    assert [path for path in changed if not any(rule.fullmatch(path) for rule in ALLOWED)] == []


def test_the_images_are_the_local_builds_at_the_tags_the_manifests_choose(
    rendered: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    _, e2e = rendered
    containers = e2e["Deployment/gpupack-scheduler"]["spec"]["template"]["spec"]["containers"]
    images = {c["name"]: c["image"] for c in containers}
    assert images["kube-scheduler"] == f"localhost/kube-scheduler:{NEWEST}"
    assert images["gpupack"] == images["metrics"] == "localhost/gpupack:0.1.0"
