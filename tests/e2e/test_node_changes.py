"""Nodes come and go while pods wait: a deleted node is never bound to, a node added later is used."""

from __future__ import annotations

import time

from tests.e2e.catalogue import L4, pods_of, share, whole_gpu_node
from tests.e2e.cluster import E2ECluster
from tests.e2e.reasons import carries_gpupack_reason


def test_a_node_deleted_while_pods_wait_is_not_used_and_a_node_added_later_is(cluster: E2ECluster) -> None:
    first = f"{cluster.prefix}-l4-od-0"
    cluster.add_nodes([whole_gpu_node(first, L4, 2, "on-demand", 1.60)])
    holders = cluster.create_pods(pods_of([share(2, 700, L4)]))  # 300 milli left on each GPU
    assert cluster.wait_all_bound(holders) == dict.fromkeys(holders, first)
    # 600 of the node's 2000 milli are free, so kube-scheduler's own fit lets them through to gpupack
    waiting = cluster.create_pods(pods_of([share(2, 600, L4)]))
    settled = cluster.wait_settled(waiting)
    assert set(settled.pending) == set(waiting)
    assert all(carries_gpupack_reason(messages[-1]) for messages in settled.pending.values())

    cluster.delete_node(first)
    for holder in holders:
        cluster.plane.delete_pod(cluster.namespace, holder)  # as the pod garbage collector would
    time.sleep(3)  # room for a wrong bind to the deleted node to show
    assert not cluster.bound(), "a pod was bound while no node could hold it"

    second = f"{cluster.prefix}-l4-od-1"
    cluster.add_nodes([whole_gpu_node(second, L4, 2, "on-demand", 1.60)])
    assert cluster.wait_all_bound(waiting) == {name: second for name in waiting}
    assert cluster.assignment_problems() == []
