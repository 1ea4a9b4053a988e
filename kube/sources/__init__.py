"""Cluster-event sources: a live cluster (list/watch) or a cluster file, both as the same event stream.

Consumers apply ``NodeUpserted``/``NodeDeleted``/``PodUpserted``/``PodDeleted`` (and the budget, PodGroup
and DRA events they use) in order and treat ``Synced`` as "the picture equals a fresh list";
reconnects, bookmarks and relists stay in here.
"""

from gpupack.kube.sources.errors import SourceError
from gpupack.kube.sources.events import (
    BudgetDeleted,
    BudgetUpserted,
    DraDeleted,
    DraUpserted,
    Event,
    EventHandler,
    GroupDeleted,
    GroupUpserted,
    JsonObject,
    NodeDeleted,
    NodeUpserted,
    PodDeleted,
    PodUpserted,
    Synced,
)
from gpupack.kube.sources.file_source import ClusterFileSource, ClusterObjects, load_cluster_objects
from gpupack.kube.sources.kube_api import (
    DRA_KINDS,
    POD_GROUP_KINDS,
    BudgetApi,
    ClusterWriter,
    DraApi,
    DraKind,
    EventWriter,
    GroupApi,
    KubeApi,
    ObjectList,
    OfficialKubeApi,
    PodGroupKind,
    load_kube_config,
)
from gpupack.kube.sources.kubernetes_source import Backoff, KubernetesSource

__all__ = [
    "DRA_KINDS",
    "POD_GROUP_KINDS",
    "Backoff",
    "BudgetApi",
    "BudgetDeleted",
    "BudgetUpserted",
    "ClusterFileSource",
    "ClusterObjects",
    "ClusterWriter",
    "DraApi",
    "DraDeleted",
    "DraKind",
    "DraUpserted",
    "Event",
    "EventHandler",
    "EventWriter",
    "GroupApi",
    "GroupDeleted",
    "GroupUpserted",
    "JsonObject",
    "KubeApi",
    "KubernetesSource",
    "NodeDeleted",
    "NodeUpserted",
    "ObjectList",
    "OfficialKubeApi",
    "PodDeleted",
    "PodGroupKind",
    "PodUpserted",
    "SourceError",
    "Synced",
    "load_cluster_objects",
    "load_kube_config",
]
