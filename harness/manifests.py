"""manifests/ rendered from the Helm chart, so that the two never drift apart (#27 item 2).

`python -m gpupack.harness.manifests` (`make manifests`) renders charts/gpupack with `helm template` and
writes each template's objects to the file of the same path under manifests/, and one kustomize
component per supported minor that sets the kube-scheduler tag the chart picks for that minor, and
the README's values table (`chart_values`).
`--check` writes nothing and names every file that differs (the e2e suite runs it, CI fails on it).
What is not rendered stays hand-kept: the kustomization.yaml files that list the rendered files, the
examples, and the READMEs.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from gpupack.harness.chart_values import README, chart_table, readme_with_table
from gpupack.harness.helm_program import build_missing, helm_binary
from gpupack.harness.kube_programs import REPO_ROOT

CHART = REPO_ROOT / "charts" / "gpupack"
MANIFESTS = REPO_ROOT / "manifests"
RELEASE, NAMESPACE = "gpupack", "gpupack-system"
# The kustomize path has no cluster to ask for its version: one component per minor pins that minor's
# newest patch when it was last raised; manifests/kustomization.yaml names the newest minor's.
COMPONENT_VERSIONS = ("v1.33.13", "v1.34.4", "v1.35.4", "v1.36.3", "v1.37.2")
NEWEST_COMPONENT = COMPONENT_VERSIONS[-1]
# Every object the chart can make, the ServiceMonitor and the defrag loop in their own folders: kustomization.yaml
# files choose.
RENDER_VALUES = ("namespace.create=true", "metrics.serviceMonitor.enabled=true", "defrag.enabled=true")
HEADER = "# Rendered from charts/gpupack/{template} by `make manifests`: change the chart, not this file.\n"
SOURCE = re.compile(r"^# Source: [^/]+/templates/(?P<path>\S+)\n", re.MULTILINE)


def helm_template(kube_version: str) -> str:
    """`helm template` of the chart as kustomize users get it, for a cluster of `kube_version`."""
    argv = [str(helm_binary()), "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    argv += ["--kube-version", kube_version]
    for value in RENDER_VALUES:
        argv += ["--set", value]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def split_by_template(rendered: str) -> dict[str, str]:
    """Each template's path under templates/ and its documents, in helm's install order."""
    documents: dict[str, list[str]] = defaultdict(list)
    for document in rendered.split("\n---\n"):
        match = SOURCE.search(document)
        if match:
            documents[match.group("path")].append(SOURCE.sub("", document, count=1).strip("\n-") + "\n")
    return {path: HEADER.format(template=f"templates/{path}") + "---\n".join(docs) for path, docs in documents.items()}


def scheduler_tag(rendered: str) -> str:
    """The kube-scheduler image tag of the rendered Deployment."""
    for document in yaml.safe_load_all(rendered):
        if document and document["kind"] == "Deployment":
            for container in document["spec"]["template"]["spec"]["containers"]:
                if container["name"] == "kube-scheduler":
                    return str(container["image"]).rsplit(":", 1)[1]
    raise ValueError("the chart rendered no kube-scheduler container")


def component(version: str, tag: str) -> str:
    """The kustomize component that sets kube-scheduler's tag for the minor of `version`."""
    minor = version.rsplit(".", 1)[0]
    body = {
        "apiVersion": "kustomize.config.k8s.io/v1alpha1",
        "kind": "Component",
        "images": [{"name": "registry.k8s.io/kube-scheduler", "newTag": tag}],
    }
    head = f"# kube-scheduler for a Kubernetes {minor.lstrip('v')} cluster (manifests/kubernetes-versions/README.md)\n"
    return HEADER.format(template="templates/deployment.yaml") + head + yaml.safe_dump(body, sort_keys=False)


def rendered_files() -> dict[Path, str]:
    """Every file of manifests/ that the chart makes, and the README with the chart's values table."""
    files = {MANIFESTS / path: text for path, text in split_by_template(helm_template(NEWEST_COMPONENT)).items()}
    for version in COMPONENT_VERSIONS:
        folder = MANIFESTS / "kubernetes-versions" / version.rsplit(".", 1)[0]
        files[folder / "kustomization.yaml"] = component(version, scheduler_tag(helm_template(version)))
    files[README] = readme_with_table(README.read_text(), chart_table())
    return files


def stale(files: dict[Path, str]) -> list[Path]:
    """The files whose content on disk is not what the chart renders."""
    return [path for path, text in files.items() if not path.is_file() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    """Render manifests/ from the chart, or with --check report the files that are not current."""
    parser = argparse.ArgumentParser(prog="python -m gpupack.harness.manifests", description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; fail when a file is not current")
    args = parser.parse_args(argv)
    build_missing()
    files = rendered_files()
    if args.check:
        outdated = stale(files)
        for path in outdated:
            print(f"{path.relative_to(REPO_ROOT)} is not what charts/gpupack renders", file=sys.stderr)
        if outdated:
            print("run `make manifests` and commit the result", file=sys.stderr)
        return 1 if outdated else 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
