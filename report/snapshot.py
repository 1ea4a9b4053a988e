"""A cluster read once, by the extender's own sources and state: what `gpupack serve` would see now.

The Nodes and Pods come from a cluster file (`ClusterFileSource`) or a live cluster
(`KubernetesSource`, listed until synced, then stopped) and go through `ClusterState.apply`, so
node facts, pod requests, assignments and the rules for pods bound without one are exactly the
extender's. The objects themselves are kept beside the state for what the state does not hold:
namespaces, labels and owners.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpupack.extender.pod_records import identity
from gpupack.extender.settings import Settings, SettingsError, load_settings
from gpupack.extender.state import ClusterState
from gpupack.kube.node_facts import node_is_schedulable
from gpupack.kube.sources import (
    ClusterFileSource,
    Event,
    JsonObject,
    KubernetesSource,
    NodeDeleted,
    NodeUpserted,
    OfficialKubeApi,
    PodDeleted,
    PodUpserted,
    SourceError,
    load_kube_config,
)

SYNC_TIMEOUT_SECONDS = 60.0


@dataclass
class ClusterSnapshot:
    """The state built from one list of the cluster, and the live objects it was built from."""

    state: ClusterState
    nodes: dict[str, JsonObject] = field(default_factory=dict)  # by name
    pods: dict[str, JsonObject] = field(default_factory=dict)  # by pod identity (uid, else namespace/name)

    def __call__(self, event: Event) -> None:
        """Record the object an event carries, then apply it to the state (a source's `on_event`)."""
        if isinstance(event, NodeUpserted):
            self.nodes[event.name] = event.node
        elif isinstance(event, NodeDeleted):
            self.nodes.pop(event.name, None)
        elif isinstance(event, PodUpserted):
            self.pods[identity(event.uid, event.key)] = event.pod
        elif isinstance(event, PodDeleted):
            self.pods.pop(identity(event.uid, event.key), None)
        self.state.apply(event)

    def schedulable_nodes(self) -> set[str]:
        """Nodes that may take pods: neither cordoned nor not Ready."""
        return {name for name, node in self.nodes.items() if node_is_schedulable(node)}


def read_cluster_file(path: str | Path, settings: Settings) -> ClusterSnapshot:
    """The cluster of a YAML/JSON cluster file (as `gpupack serve --cluster-file`). Raises SourceError."""
    snapshot = ClusterSnapshot(ClusterState(settings))
    ClusterFileSource(path, snapshot).start()
    return snapshot


def read_live_cluster(kubeconfig: str | None, settings: Settings) -> ClusterSnapshot:
    """The cluster of `kubeconfig` (None: kubectl's choice, `load_kube_config`), listed once. Raises SourceError."""
    snapshot = ClusterSnapshot(ClusterState(settings))
    api = OfficialKubeApi(load_kube_config(kubeconfig), request_timeout=settings.request_timeout_seconds)
    source = KubernetesSource(api, snapshot)
    source.start()
    try:
        if not source.wait_synced(SYNC_TIMEOUT_SECONDS):
            raise SourceError(f"the cluster was not listed within {SYNC_TIMEOUT_SECONDS:g} s")
    finally:
        source.stop()
    return snapshot


def report_settings(config: str | None) -> Settings:
    """The settings of `--config`: a `gpupack serve` config file, or the ConfigMap that holds one under
    `data."policy.yaml"` (manifests/policy-config.yaml). Raises SettingsError."""
    if not config:
        return load_settings()
    try:
        document: Any = yaml.safe_load(Path(config).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SettingsError(f"config {config}: cannot read: {exc}") from None
    if not (isinstance(document, dict) and document.get("kind") == "ConfigMap"):
        return load_settings(config)
    text = (document.get("data") or {}).get("policy.yaml")
    if not isinstance(text, str):
        raise SettingsError(f'config {config}: a ConfigMap without data."policy.yaml"')
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", encoding="utf-8") as extracted:
        extracted.write(text)
        extracted.flush()
        return load_settings(extracted.name)
