"""manifests/examples: the example cluster's header comment tells the truth, the one-pod file is one pod."""

from __future__ import annotations

import re

import yaml

from gpupack.kube.node_facts import facts_from_node
from gpupack.kube.sources import load_cluster_objects
from tests.extender_helpers import EXAMPLE_CLUSTER

EXAMPLE_POD = EXAMPLE_CLUSTER.parent / "pod.yaml"


def test_the_example_cluster_comment_counts_its_nodes_gpus_and_running_pods() -> None:
    header = EXAMPLE_CLUSTER.read_text().split("\napiVersion:", 1)[0]
    counts = re.search(r"Nodes \((\d+), (\d+) GPUs", header)
    running = re.search(r"Running pods \((\d+)\)", header)
    assert counts is not None and running is not None, header
    nodes_said, gpus_said = map(int, counts.groups())
    running_said = int(running.group(1))
    objects = load_cluster_objects(EXAMPLE_CLUSTER)
    facts = [facts_from_node(node) for node in objects.nodes]
    assert (nodes_said, gpus_said) == (len(facts), sum(f.gpu_count for f in facts))
    assert running_said == sum(1 for pod in objects.pods if pod["spec"].get("nodeName"))
    for f in facts:  # every node is named in the header
        assert f.name in header


def test_the_example_pod_file_holds_exactly_one_pod() -> None:
    documents = [doc for doc in yaml.safe_load_all(EXAMPLE_POD.read_text()) if doc]
    assert [doc["kind"] for doc in documents] == ["Pod"]
    assert len(load_cluster_objects(EXAMPLE_POD).pods) == 1
