"""gpupack and kube-scheduler SIGKILLed in the middle of a burst and restarted: the burst completes, nothing twice.

The burst goes on after the restart: its second half is created then, and one pod of the first half
finishes (is deleted). That deletion matters: kube-scheduler v1.28 parks a pod whose scheduling failed
with an extender error (connection refused while gpupack is down) among the unschedulable pods, and
only a node change, a pod deletion or the 5-minute flush moves it back; new pods being bound do not.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from gpupack.harness.controlplane import wait_until
from tests.e2e.catalogue import FITTING_MIX, pods_of, restart_nodes
from tests.e2e.cluster import E2ECluster


def burst_with_a_restart(cluster: E2ECluster, restart: Callable[[], None]) -> dict[str, str]:
    """Create half of FITTING_MIX, `restart` once a quarter of that is bound, create the rest and let one
    bound pod finish; wait until every other pod is bound and return their name -> node.
    """
    cluster.add_nodes(restart_nodes(cluster.prefix))
    bodies = list(pods_of(FITTING_MIX))
    first_half, second_half = bodies[::2], bodies[1::2]  # both halves hold every request kind
    quarter = len(first_half) // 4
    with ThreadPoolExecutor(max_workers=1) as pool:
        creating = pool.submit(cluster.create_pods, first_half)
        wait_until(f"{quarter} pods to be bound", lambda: len(cluster.bound()) >= quarter, 180, interval=0.05)
        restart()
        names = creating.result()
    bound_before = cluster.bound()
    assert len(bound_before) < len(bodies)
    names += cluster.create_pods(second_half)
    finished = min(bound_before)
    cluster.plane.delete_pod(cluster.namespace, finished)
    names.remove(finished)
    bound = cluster.wait_all_bound(names)
    assert cluster.assignment_problems() == []
    return bound


def test_gpupack_killed_mid_burst_rebuilds_its_state_from_the_annotations(cluster: E2ECluster) -> None:
    bound = burst_with_a_restart(cluster, cluster.plane.restart_gpupack)

    # The restarted gpupack holds every bound pod's GPUs, read back from the assignment annotations.
    assert cluster.plane.gpupack_metric("gpupack_pods_bound") == len(bound)
    assert cluster.plane.gpupack_metric("gpupack_pods_unplaced") == 0


def test_kube_scheduler_killed_mid_burst_and_restarted_completes_the_burst(cluster: E2ECluster) -> None:
    burst_with_a_restart(cluster, cluster.plane.restart_scheduler)
