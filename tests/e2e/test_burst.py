"""A burst of 300+ pods of every request kind, on nodes of every kind, through the real kube-scheduler."""

from __future__ import annotations

from tests.e2e.catalogue import BURST, L4_SHARES, every_kind_of_node, pods_of
from tests.e2e.cluster import E2ECluster
from tests.e2e.reasons import FIT_ERROR, carries_gpupack_reason

OWN_FIT_FULL = "Insufficient gpupack.io/gpu-milli"


def test_a_burst_of_every_request_kind_lands_legally_and_the_rest_stays_pending(cluster: E2ECluster) -> None:
    nodes = every_kind_of_node(cluster.prefix)
    cluster.add_nodes(nodes)
    bodies = list(pods_of(BURST))
    assert len(bodies) >= 300

    settled = cluster.wait_settled(cluster.create_pods(bodies))

    assert cluster.assignment_problems() == []
    assert len(settled.bound) + len(settled.pending) == len(bodies)
    idle_nodes = {node["metadata"]["name"] for node in nodes} - set(settled.bound.values())
    assert not idle_nodes, f"nodes nothing was scheduled on: {sorted(idle_nodes)}"
    unplaced_groups = [
        group.name
        for group in BURST
        if group.name != L4_SHARES and not any(name.startswith(f"{group.name}-") for name in settled.bound)
    ]
    assert not unplaced_groups, f"request kinds of which no pod was bound: {unplaced_groups}"
    # Pods that cannot fit stay Pending, turned down by a fit error (not an extender error).
    for name, messages in settled.pending.items():
        assert FIT_ERROR in messages[-1], f"{name}: {messages[-1]}"
    # kube-scheduler's own fit counts 2000 gpu-milli on the L4, but only two 600-milli shares fit its two GPUs,
    # and the rest are turned down by gpupack, whose reason the FailedScheduling event carries.
    # Once other shares have filled the L4's milli count, kube-scheduler's own fit turns the rest down
    # first (smaller shares can fill it before the 600s, seen on v1.33 and v1.37): the only other verdict.
    l4_pending = {name: messages for name, messages in settled.pending.items() if name.startswith(f"{L4_SHARES}-")}
    assert len(l4_pending) >= 4
    for name, messages in l4_pending.items():
        last = messages[-1]
        assert carries_gpupack_reason(last) or OWN_FIT_FULL in last, f"{name}: {last}"
