"""Which client configuration a command talks to the cluster with: kubectl's rule, in one place (#27).

Every command (`gpupack serve`, `report`, `agent`, `explain`) goes through `choose_kube_config`, as
client-go's loader does for kubectl:

1. `--kubeconfig FILE` wins (one file, as kubectl takes it);
2. else `$KUBECONFIG`, a list separated by `os.pathsep` (`:`; `;` on Windows): its existing files are
   merged, the first file to define a cluster, user or context by name wins, and the current context is
   the first one a file sets (the official client's merger would take the last: `first_current_context`
   hands it kubectl's); files that do not exist are skipped, and a list naming no existing file gives the
   in-cluster configuration, as kubectl's empty merged config does;
3. else `~/.kube/config` when it exists;
4. else the in-cluster service account (a pod's token and `KUBERNETES_SERVICE_HOST`).

kubectl's order puts a kubeconfig file before the in-cluster account: in a pod that has both, a
kubeconfig someone put there on purpose is what kubectl (and so gpupack) uses.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

KUBECONFIG_ENV = "KUBECONFIG"
DEFAULT_KUBECONFIG = "~/.kube/config"
IN_CLUSTER = "the in-cluster service account"


@dataclass(frozen=True, slots=True)
class KubeConfigChoice:
    """The kubeconfig files to merge, in order, and where they came from; no files: in-cluster."""

    files: tuple[str, ...] = ()
    origin: str = IN_CLUSTER

    @property
    def in_cluster(self) -> bool:
        """Whether the in-cluster service account is used (no kubeconfig file)."""
        return not self.files

    @property
    def config_file(self) -> str:
        """The files as the official client's `config_file` takes a list (joined with `os.pathsep`)."""
        return os.pathsep.join(self.files)


def choose_kube_config(given: str | None, environ: Mapping[str, str] | None = None) -> KubeConfigChoice:
    """kubectl's choice (module docstring): `given`, else $KUBECONFIG's existing files, else
    ~/.kube/config when it exists, else the in-cluster service account."""
    if given:
        return KubeConfigChoice((given,), f"--kubeconfig {given}")
    listed = (os.environ if environ is None else environ).get(KUBECONFIG_ENV, "")
    if listed:
        return _from_env_list(listed)
    default = Path(DEFAULT_KUBECONFIG).expanduser()
    if default.is_file():
        return KubeConfigChoice((str(default),), str(default))
    return KubeConfigChoice()


def _from_env_list(listed: str) -> KubeConfigChoice:
    """$KUBECONFIG's existing files, in order and without repeats; none existing: in-cluster."""
    files: list[str] = []
    for entry in listed.split(os.pathsep):
        path = os.path.expanduser(entry)
        if entry and os.path.isfile(path) and path not in files:
            files.append(path)
    if not files:
        return KubeConfigChoice((), f"{IN_CLUSTER} (${KUBECONFIG_ENV}={listed} names no existing file)")
    return KubeConfigChoice(tuple(files), f"${KUBECONFIG_ENV} ({', '.join(files)})")


def first_current_context(files: Sequence[str]) -> str | None:
    """The `current-context` of the first file that sets one (kubectl's merge rule); None when none
    does, or a file cannot be read (the client's loader then reports it)."""
    for path in files:
        try:
            doc = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError):
            return None
        if isinstance(doc, dict) and doc.get("current-context"):
            return str(doc["current-context"])
    return None
