"""The Helm chart (charts/gpupack) on the real node, changed only where this machine forces it.

The same changes as deploy.py's kustomize overlay makes to manifests/, and for the same reasons (its
docstring says each), made through the chart's values where the chart has one:
- `image.registry/repository/tag`: the locally built gpupack image; `kubeScheduler.image.registry`:
  `localhost` (the tag stays the chart's choice, the cluster's own version);
- `scheduler.replicas`: 1;
and through helm's `--post-renderer` for the rest (`python -m tests.e2e.helm_deploy --api-port N`, which
reads the rendered objects on stdin and writes them changed to stdout; `post_render`):
- deploy.scheduler_patch and deploy.agent_patch, merged into the Deployment and the DaemonSet: host
  network, `KUBERNETES_SERVICE_HOST/PORT`, the agent's fake NVML and the host folder that holds it;
- the Deployment's rolling update made `maxSurge: 0, maxUnavailable: 1`: with one replica on the host
  network, a surge pod needs the host ports its predecessor holds on the one node and would never be
  placed, so an upgrade would never finish (where pods have networks of their own, the chart's rolls).
The release namespace gpupack-system is the chart's only by `--create-namespace`, so no post-renderer
sees it: `prepare_namespace` makes it first with deploy.namespace_patch's Pod Security label.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpupack.harness.controlplane import REPO_ROOT, ControlPlane
from gpupack.harness.helm_program import helm_binary
from tests.e2e import deploy

CHART = REPO_ROOT / "charts" / "gpupack"
RELEASE = "gpupack"
NAMESPACE = "gpupack-system"
ONE_AT_A_TIME = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
Values = Mapping[str, str | int | float | bool]


def image_values(gpupack_image: str) -> dict[str, str]:
    """The chart's values that name `gpupack_image` (`localhost/gpupack:0.1.0`) and the local kube-scheduler."""
    name, tag = gpupack_image.rsplit(":", 1)
    registry, repository = name.split("/", 1)
    return {
        "image.registry": registry,
        "image.repository": repository,
        "image.tag": tag,
        "kubeScheduler.image.registry": "localhost",
    }


def e2e_values(gpupack_image: str) -> dict[str, str | int]:
    """Every value this machine forces: the local images and one scheduler replica."""
    return {**image_values(gpupack_image), "scheduler.replicas": 1}


def set_args(values: Values) -> list[str]:
    """`--set-string` for strings (a tag like `1.0` stays one), `--set-json` for the rest (`--set` makes
    `0.1` a string)."""
    args = []
    for key, value in values.items():
        flag, text = ("--set-string", value) if isinstance(value, str) else ("--set-json", json.dumps(value))
        args += [flag, f"{key}={text}"]
    return args


# ------------------------------------------------------------------ the post-renderer


def merge(base: Any, patch: Any, path: str = "") -> Any:
    """`patch` merged into `base` as a strategic merge patch does for these patches: maps key by key, lists of
    named maps item by item (a new name is appended), anything else replaced. A container the patch names
    must exist: a renamed one would otherwise come out as a new container holding only the patch."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = merge(base.get(key), value, f"{path}.{key}")
        return merged
    if _named(base) and _named(patch):
        items = list(base or [])
        index = {item["name"]: position for position, item in enumerate(items)}
        for item in patch:
            if item["name"] in index:
                items[index[item["name"]]] = merge(items[index[item["name"]]], item, f"{path}[{item['name']}]")
            elif path.endswith(".containers"):
                raise ValueError(f"the rendered chart has no container {item['name']} at {path}")
            else:
                items.append(item)
        return items
    return patch


def _named(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(isinstance(i, dict) and "name" in i for i in value))


def patches(api_port: int) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> what post_render merges into that object."""
    scheduler = merge(deploy.scheduler_patch(api_port), {"spec": {"strategy": ONE_AT_A_TIME}})
    agent = deploy.agent_patch(api_port)
    return {(patch["kind"], patch["metadata"]["name"]): patch for patch in (scheduler, agent)}


def post_render(documents: Sequence[Any], api_port: int) -> list[Any]:
    """The rendered objects with the patches merged in (their namespaces are the chart's, kept as they are).

    ValueError when an object a patch is for is not among them: the chart renamed or dropped it.
    """
    wanted = patches(api_port)
    found = set()
    out = []
    for document in documents:
        if not document:
            continue
        key = (document.get("kind"), document.get("metadata", {}).get("name"))
        if key in wanted:
            found.add(key)
            patch = {k: v for k, v in wanted[key].items() if k == "spec"}
            document = merge(document, patch)
        out.append(document)
    if missing := set(wanted) - found:
        raise ValueError(f"the rendered chart lacks {sorted(missing)}")
    return out


def write_post_renderer(folder: Path, api_port: int) -> Path:
    """An executable in `folder` that helm runs as `--post-renderer`: this module's post-render step."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "post-render"
    script.write_text(
        f"#!/bin/sh\ncd '{REPO_ROOT}' && exec '{sys.executable}' -m tests.e2e.helm_deploy --api-port {api_port}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def main(argv: Sequence[str] | None = None) -> int:
    """The post-renderer: rendered YAML on stdin, the changed YAML on stdout."""
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.helm_deploy", description=__doc__)
    parser.add_argument("--api-port", type=int, required=True, help="the API server's port on 127.0.0.1")
    args = parser.parse_args(argv)
    documents = list(yaml.safe_load_all(sys.stdin))
    yaml.safe_dump_all(post_render(documents, args.api_port), sys.stdout, sort_keys=False)
    return 0


# ------------------------------------------------------------------ helm


class Helm:
    """helm (the cached build, harness/helm_program.py) with its own cache/config folders under `workdir`."""

    def __init__(self, workdir: Path, kubeconfig: Path | None = None) -> None:
        self.binary = helm_binary()
        self.workdir = workdir
        self.kubeconfig = kubeconfig
        workdir.mkdir(parents=True, exist_ok=True)

    def __call__(self, *args: str, timeout: float = 300) -> str:
        """Run helm; its stdout (RuntimeError with both outputs when it fails)."""
        homes = {f"HELM_{kind}_HOME": str(self.workdir / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}
        argv = [str(self.binary), *args]
        if self.kubeconfig is not None:
            argv.append(f"--kubeconfig={self.kubeconfig}")
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **homes}, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def post_renderer_args(self, api_port: int) -> list[str]:
        """`--post-renderer` with this module's step for an API server on `api_port`."""
        return ["--post-renderer", str(write_post_renderer(self.workdir, api_port))]

    def template(self, values: Values, kube_version: str, api_port: int | None = None) -> list[dict[str, Any]]:
        """`helm template` of the chart as objects; through the post-renderer when `api_port` is given."""
        args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", kube_version]
        if api_port is not None:
            args += self.post_renderer_args(api_port)
        return [doc for doc in yaml.safe_load_all(self(*args, *set_args(values))) if doc]

    def install(self, values: Values, api_port: int) -> str:
        """`helm install` of the chart into gpupack-system (made by `--create-namespace` unless there)."""
        args = ["install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace"]
        return self(*args, *self.post_renderer_args(api_port), *set_args(values))

    def upgrade(self, values: Values, api_port: int, *more: str) -> str:
        """`helm upgrade` to `values` and `more` arguments (returns once the objects are changed, not once they
        have rolled)."""
        args = ["upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE]
        return self(*args, *self.post_renderer_args(api_port), *set_args(values), *more)

    def uninstall(self) -> str:
        """`helm uninstall`, waiting until the release's objects are deleted."""
        return self("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "3m")

    def manifest(self) -> list[dict[str, Any]]:
        """The objects of the installed release (`helm get manifest`)."""
        return [doc for doc in yaml.safe_load_all(self("get", "manifest", RELEASE, "--namespace", NAMESPACE)) if doc]


def prepare_namespace(plane: ControlPlane) -> None:
    """gpupack-system with the Pod Security level host-network pods need, before helm finds it there."""
    labels = deploy.namespace_patch()["metadata"]["labels"]
    from kubernetes.client.exceptions import ApiException

    try:
        plane.create_namespace(NAMESPACE, labels)
    except ApiException as exc:
        if exc.status != 409:
            raise
        plane.core().patch_namespace(NAMESPACE, {"metadata": {"labels": labels}})


if __name__ == "__main__":
    sys.exit(main())
