"""How soon kube-scheduler retries a pod gpupack turned down or could not answer for, on each version.

kube-scheduler's queue decides when a pod that failed scheduling is tried again, and that changed
between releases (kube-scheduler 1.28 parked a pod whose extender call failed until some node or pod
changed, or for up to 5 minutes). These cases pin what each tested release does, so a change shows:
- **extender down**: gpupack is unreachable when the pod is first tried (a rollout, a crash), then comes
  back while nothing else in the cluster changes;
- **turned down by gpupack**: kube-scheduler's own fit takes the node but gpupack's filter does not (a
  third 600-milli share on a 2-GPU node): the pod waits for a change, and a pod that goes frees it.
  kube-scheduler retries it on the deletion event at once (0.05-0.1 s here); gpupack sees the same
  deletion through its own watch, and when that arrives after the retry, gpupack turns the pod down
  again and it waits for the next change or kube-scheduler's 5-minute flush of unschedulable pods
  (seen once in CI-like runs on 1.33). So the bound here is the flush, not the usual 0.1 s.
"""

from __future__ import annotations

import time

from gpupack.harness.controlplane import pod_body, wait_until
from gpupack.harness.kube_programs import CONTROL_PLANE_VERSIONS
from tests.e2e.catalogue import H100, all_to_all_nvlink, whole_gpu_node
from tests.e2e.cluster import E2ECluster

QUIET = 15.0  # seconds in which nothing else changes in the cluster
FLUSH = 300.0 + 30.0  # kube-scheduler's --pod-max-in-unschedulable-pods-duration, and slack
# Seconds within which a pod whose filter call failed is bound once gpupack is back, with no other
# change in the cluster; None: it is not retried in QUIET seconds (it waits for a change).
RETRY_AFTER_EXTENDER_ERROR: dict[str, float | None] = {"v1.33.13": 12.0, "v1.37.2": 12.0}


def version(cluster: E2ECluster) -> str:
    return cluster.plane.version


def wait_failed(cluster: E2ECluster, name: str, timeout: float = 60) -> str:
    """The last FailedScheduling message of the pod, once there is one."""
    wait_until(f"a FailedScheduling event for {name}", lambda: bool(cluster.failed_scheduling().get(name)), timeout)
    return cluster.failed_scheduling()[name][-1]


def bound_within(cluster: E2ECluster, name: str, seconds: float) -> float | None:
    """Seconds until the pod is bound, None when it is not within `seconds`."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if name in cluster.bound():
            return time.monotonic() - start
        time.sleep(0.1)
    return None


def test_a_pod_tried_while_gpupack_was_down_is_retried_when_it_is_back(cluster: E2ECluster) -> None:
    expected = RETRY_AFTER_EXTENDER_ERROR[version(cluster)]
    cluster.add_nodes([whole_gpu_node(f"{cluster.prefix}-h100", H100, 8, "on-demand", 98.0, all_to_all_nvlink(8, 18))])
    cluster.wait_gpupack_nodes()
    cluster.plane.kill_gpupack()
    cluster.create_pods([pod_body("while-down", {"nvidia.com/gpu": 1})])
    assert "connection refused" in wait_failed(cluster, "while-down")
    cluster.plane.start_gpupack()

    took = bound_within(cluster, "while-down", QUIET if expected is None else expected)
    if expected is None:
        assert took is None, f"bound {took:.1f} s after gpupack came back: this version no longer parks it"
        cluster.plane.delete_pod(cluster.namespace, "while-down")
    else:
        assert took is not None, f"not bound {expected} s after gpupack came back, with nothing else changing"


def test_a_pod_gpupack_turned_down_waits_for_a_change_and_a_freed_share_takes_it(cluster: E2ECluster) -> None:
    node = f"{cluster.prefix}-l4"
    cluster.add_nodes([whole_gpu_node(node, "NVIDIA-L4", 2, "on-demand", 1.0)])
    on_node = {"kubernetes.io/hostname": [node]}
    shares = [pod_body(f"share-{i}", {"gpupack.io/gpu-milli": 600}, node_affinity=on_node) for i in range(3)]
    cluster.wait_all_bound(cluster.create_pods(shares[:2]))
    cluster.create_pods(shares[2:])
    assert "not enough free GPU capacity" in wait_failed(cluster, "share-2")

    assert bound_within(cluster, "share-2", QUIET) is None, "retried and bound with nothing freed"
    cluster.plane.delete_pod(cluster.namespace, "share-0")
    took = bound_within(cluster, "share-2", FLUSH)
    assert took is not None, f"not bound within {FLUSH:.0f} s of a share going"
    print(f"share-2 bound {took:.2f} s after share-0 was deleted; {cluster.failed_scheduling()['share-2']}")


def test_every_tested_version_has_an_expectation() -> None:
    assert set(RETRY_AFTER_EXTENDER_ERROR) == set(CONTROL_PLANE_VERSIONS)
