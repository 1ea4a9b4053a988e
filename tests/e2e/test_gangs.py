"""Gang placement through the real kube-scheduler (#29 item 5, docs/gangs.md): a group binds whole or not at all.

The module applies the project's minimal PodGroup CRD (manifests/examples/podgroups-crd.yaml,
`scheduling.x-k8s.io/v1alpha1`, `spec.minMember`) to the suite's control plane of each version, waits
until it is Established and until the running `gpupack serve` reads PodGroups (it was started before the
CRD existed: its PodGroup list got 404 and is retried with backoff, so a probe group is asked about until
gpupack answers with the PodGroup's size), and deletes the CRD at the end. Groups are named both ways
users name them: scheduler-plugins' label `scheduling.x-k8s.io/pod-group` with a PodGroup object, and
gpupack's annotations `gpupack.io/group` + `gpupack.io/group-size`.

- `no-fit-then-capacity`: an 8-member group (PodGroup, minMember 8) of 1-GPU pods on two 4-GPU nodes,
  one GPU held by a blocker created bound: 7 members' worth is free. All 8 stay Pending (sampled for
  15 s and more) with `needs 8 × 1 GPU in the cluster; largest fit: 7`; the blocker is deleted and all
  8 bind (the time is printed), with legal, distinct GPUs: 4 on each node.
- `competing`: two gpupack-annotated groups of 4 × 2 GPUs on three 4-GPU nodes (12 GPUs, one group's
  8 and not two): one ends fully bound, the other fully Pending with `largest fit: 2` and never a
  member bound; then the winner's pods are deleted and the other binds whole (no deadlock).
- `same-node`: a PodGroup of 4 × 2 GPUs on two 8-GPU NVLinked nodes all binds to one node, 8 distinct GPUs.
- `member-deleted`: 3 of a 4-member gpupack group exist (`waits for its members: 3 of 4 exist`), one is
  deleted (`2 of 4`), the missing two are created: all 4 bind.

"No group ever partly bound": every case samples its groups' pods (every 0.25 s) from the API server the
whole time. kube-scheduler binds members one by one (gpupack cannot make the Bindings atomic,
docs/gangs.md), so a sample taken while a planned group binds may see k of n bound; what must never
happen is a member bound while its group cannot bind whole. Asserted per group: no member is bound before
the step that lets the group fit, a group that must wait has no member bound in any sample, and a group
whose first member binds is fully bound within BIND_WINDOW s of that sample (the window is printed).

**Asking again.** kube-scheduler retries a pod its extender turned down only on a cluster event that
may make it fit (a node added or changed, an assigned pod added, changed or deleted) or after 5 minutes,
never when an unscheduled pod is created or deleted. A member turned down while its group was incomplete
therefore keeps `waits for its members: k of n` in its PodScheduled condition after the group completes,
and one turned down before a sibling was deleted keeps the higher count, until such an event comes. Where
a case checks what gpupack answers *now* (the no-fit reason of every member, the counts of `member-deleted`)
it first makes such an event: an annotation on one of its nodes (`ask_again`). The reasons members had
before that are printed. A group that fits does not depend on it: the first member filtered once all
exist binds, and that bind (an assigned pod added) makes kube-scheduler retry the others, which claim the
group's planned placements.

Pods bind without a kubelet (gpupack's bind verb writes the Binding); members and blockers carry
`terminationGracePeriodSeconds: 0` and are deleted with grace 0, so a deleted pod is gone at once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupack.harness.controlplane import ControlPlane, ControlPlaneError, pod_body, wait_until
from tests.e2e.catalogue import H100, all_to_all_nvlink, whole_gpu_node
from tests.e2e.cluster import E2ECluster, wait_gpupack_holds_the_bound_pods

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "manifests" / "examples" / "podgroups-crd.yaml"
CRD_NAME = "podgroups.scheduling.x-k8s.io"
PG_GROUP, PG_VERSION, PG_PLURAL = "scheduling.x-k8s.io", "v1alpha1", "podgroups"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
GROUP, GROUP_SIZE = "gpupack.io/group", "gpupack.io/group-size"
ASSIGNMENT = "gpupack.io/assignment"
GPU = "nvidia.com/gpu"

PENDING_AT_LEAST = 15.0  # s a group that cannot fit is sampled before anything else happens
BIND_WITHIN = 60.0  # s for a group to bind whole once it fits (a loaded 2-core machine)
BIND_WINDOW = 30.0  # s from a group's first bound member to its last
REASON_WITHIN = 60.0  # s for kube-scheduler to turn every member down (its backoff tops at 10 s)
SAMPLE = 0.25  # s between samples


# ============================================================ the CRD
def crd_body() -> dict[str, Any]:
    (body,) = [doc for doc in yaml.safe_load_all(CRD_FILE.read_text()) if doc]
    assert body["metadata"]["name"] == CRD_NAME
    return body


def established(api: client.ApiextensionsV1Api) -> bool:
    crd: Any = api.read_custom_resource_definition(CRD_NAME, _preload_content=False)
    conditions = json.loads(crd.data).get("status", {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def crd_gone(api: client.ApiextensionsV1Api) -> bool:
    try:
        api.read_custom_resource_definition(CRD_NAME, _preload_content=False)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


@pytest.fixture(scope="module")
def podgroups(control_plane: ControlPlane) -> Iterator[None]:
    """The PodGroup CRD, Established and read by gpupack; deleted (with every PodGroup) after the module."""
    api = client.ApiextensionsV1Api(control_plane.api_client())
    body: Any = crd_body()  # a plain body, as the other cases send (the client serializes dicts as they are)
    api.create_custom_resource_definition(body)
    try:
        wait_until(f"{CRD_NAME} to be Established", lambda: established(api), 60, interval=0.5)
        wait_gpupack_reads_podgroups(control_plane)
        yield
    finally:
        api.delete_custom_resource_definition(CRD_NAME)
        wait_until(f"{CRD_NAME} to be deleted", lambda: crd_gone(api), 60, interval=0.5)


def wait_gpupack_reads_podgroups(plane: ControlPlane, timeout: float = 120) -> None:
    """Ask gpupack about a fresh member of a probe group (PodGroup minMember 2, one member) until it answers
    with the PodGroup's size ("1 of 2") instead of "has no PodGroup": its PodGroup list is retried with a
    backoff of up to 30 s since the CRD was missing when it started."""
    probe = E2ECluster(plane, f"e2e-gangs-probe-{int(time.time() * 1000) % 100000}", prefix="gprobe")
    plane.create_namespace(probe.namespace)
    try:
        probe.add_nodes([whole_gpu_node(f"{probe.prefix}-0", H100, 1, "on-demand", 12.29)])
        create_pod_group(probe, "probe", 2)
        deadline = time.monotonic() + timeout
        for attempt in range(1000):
            name = f"probe-{attempt}"
            probe.create_pods([member(name, 1, pod_group="probe")])
            wait_until(f"{name} to be turned down", partial(has_message, probe, name), REASON_WITHIN, 0.5)
            said = message_of(probe, name)
            if "waits for its members: 1 of 2 exist" in said:
                return
            assert "has no scheduling.x-k8s.io PodGroup" in said, said
            probe.plane.delete_pod(probe.namespace, name)
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"gpupack did not read PodGroups within {timeout:.0f} s: {said}")
            time.sleep(3)
    finally:
        probe.cleanup()


def create_pod_group(cluster: E2ECluster, name: str, min_member: int) -> None:
    """A PodGroup `name` with spec.minMember in the test's namespace."""
    body = {
        "apiVersion": f"{PG_GROUP}/{PG_VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": min_member},
    }
    api = client.CustomObjectsApi(cluster.plane.api_client())
    api.create_namespaced_custom_object(PG_GROUP, PG_VERSION, cluster.namespace, PG_PLURAL, body)
    time.sleep(1.0)  # the PodGroup's watch event reaches gpupack before its members' do


# ============================================================ pods
def member(
    name: str, gpus: int, pod_group: str | None = None, group: str | None = None, size: int | None = None
) -> dict[str, Any]:
    """A member asking for `gpus` whole GPUs: of PodGroup `pod_group` (the label) or gpupack group `group`."""
    annotations = {GROUP: group, GROUP_SIZE: str(size)} if group else {}
    body = pod_body(name, {GPU: gpus}, annotations=annotations)
    if pod_group:
        body["metadata"]["labels"] = {POD_GROUP_LABEL: pod_group}
    body["spec"]["terminationGracePeriodSeconds"] = 0
    return body


def blocker(name: str, node: str, gpus: list[int]) -> dict[str, Any]:
    """A pod created bound to `node`, holding `gpus` (its assignment says which)."""
    body = pod_body(name, {GPU: len(gpus)}, scheduler_name="default-scheduler")
    body["spec"]["nodeName"] = node
    body["spec"]["terminationGracePeriodSeconds"] = 0
    body["metadata"]["annotations"][ASSIGNMENT] = json.dumps({"node": node, "gpus": [{"index": i} for i in gpus]})
    return body


def scheduled_message(pod: Mapping[str, Any]) -> str:
    """The message of the pod's PodScheduled condition when it is False ("" otherwise)."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or "")
    return ""


def message_of(cluster: E2ECluster, name: str) -> str:
    response: Any = cluster.plane.core().read_namespaced_pod(name, cluster.namespace, _preload_content=False)
    return scheduled_message(json.loads(response.data))


def has_message(cluster: E2ECluster, name: str) -> bool:
    return bool(message_of(cluster, name))


_asked = 0


def ask_again(cluster: E2ECluster, node: str) -> None:
    """Annotate `node`: a node change makes kube-scheduler retry its unschedulable pods (module docstring)."""
    global _asked
    _asked += 1
    patch = {"metadata": {"annotations": {"gpupack-e2e/asked": str(_asked)}}}
    cluster.plane.core().patch_node(node, patch)


# ============================================================ sampling the groups
@dataclass
class GroupTrace:
    """What the samples saw of one group."""

    members: frozenset[str]
    most_bound: int = 0
    first_bound: float | None = None  # monotonic time of the first sample with a member bound
    whole: float | None = None  # ... with every member bound
    bound_while_waiting: list[str] = field(default_factory=list)  # members seen bound while the group could not fit


class Sampler:
    """Samples the test's pods and follows each group's bound members (module docstring)."""

    def __init__(self, cluster: E2ECluster, groups: Mapping[str, list[str]]) -> None:
        self.cluster = cluster
        self.traces = {name: GroupTrace(frozenset(members)) for name, members in groups.items()}
        self.waiting = set(groups)  # groups that cannot fit yet: no member may bind
        self.pods: dict[str, dict[str, Any]] = {}

    def sample(self) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        self.pods = {p["metadata"]["name"]: p for p in self.cluster.pods()}
        for name, trace in self.traces.items():
            bound = {m for m in trace.members if (self.pods.get(m) or {}).get("spec", {}).get("nodeName")}
            trace.most_bound = max(trace.most_bound, len(bound))
            if bound and trace.first_bound is None:
                trace.first_bound = now
            if bound == trace.members and trace.whole is None:
                trace.whole = now
            if bound and name in self.waiting:
                trace.bound_while_waiting = sorted(bound)
            if trace.first_bound is not None and trace.whole is None:
                assert now - trace.first_bound <= BIND_WINDOW, (
                    f"group {name} partly bound for {now - trace.first_bound:.0f} s: "
                    f"{sorted(bound)} of {len(trace.members)}"
                )
        return self.pods

    def until(
        self, what: str, done: Callable[[dict[str, dict[str, Any]]], bool], timeout: float, at_least: float = 0.0
    ) -> float:
        """Sample until `done` (and at least `at_least` s); returns the seconds it took."""
        started = time.monotonic()
        while True:
            pods = self.sample()
            elapsed = time.monotonic() - started
            if elapsed >= at_least and done(pods):
                return elapsed
            if elapsed > timeout:
                messages = {n: scheduled_message(p) or p["spec"].get("nodeName") for n, p in sorted(pods.items())}
                raise ControlPlaneError(f"timed out after {timeout:.0f} s waiting for {what}: {messages}")
            time.sleep(SAMPLE)

    def fits(self, group: str) -> None:
        """From now on `group` may bind."""
        self.waiting.discard(group)

    def check(self) -> None:
        """No member bound while its group waited; every group that has a bound member is whole."""
        for name, trace in self.traces.items():
            assert not trace.bound_while_waiting, (
                f"group {name}: {trace.bound_while_waiting} bound while it could not fit"
            )
            assert trace.first_bound is None or trace.whole is not None, f"group {name} ended partly bound"

    def window(self, group: str) -> float:
        trace = self.traces[group]
        assert trace.first_bound is not None and trace.whole is not None
        return trace.whole - trace.first_bound


def bound(pod: Mapping[str, Any] | None) -> bool:
    return bool(pod and pod["spec"].get("nodeName"))


def all_bound(names: list[str]) -> Callable[[dict[str, dict[str, Any]]], bool]:
    return lambda pods: all(bound(pods.get(n)) for n in names)


def all_say(names: list[str], text: str) -> Callable[[dict[str, dict[str, Any]]], bool]:
    return lambda pods: all(n in pods and not bound(pods[n]) and text in scheduled_message(pods[n]) for n in names)


def turned_down(names: list[str]) -> Callable[[dict[str, dict[str, Any]]], bool]:
    return lambda pods: all(n in pods and not bound(pods[n]) and scheduled_message(pods[n]) for n in names)


def messages(pods: Mapping[str, Mapping[str, Any]], names: list[str]) -> dict[str, str]:
    return {n: scheduled_message(pods[n]) for n in names}


def gpus_of(pods: Mapping[str, Mapping[str, Any]], names: list[str]) -> dict[str, list[tuple[str, int]]]:
    """Member -> its (node, GPU index) pairs, from its assignment (which must name its node)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for name in names:
        pod = pods[name]
        text = (pod["metadata"].get("annotations") or {}).get(ASSIGNMENT)
        assert text, f"{name} bound without {ASSIGNMENT}"
        assignment = json.loads(text)
        assert assignment["node"] == pod["spec"]["nodeName"], (name, assignment)
        out[name] = [(assignment["node"], int(slot["index"])) for slot in assignment["gpus"]]
    return out


def assert_distinct_gpus(
    cluster: E2ECluster, pods: Mapping[str, Mapping[str, Any]], names: list[str], gpus: int
) -> None:
    """Each member has `gpus` GPUs of its node, no GPU given twice; the cluster's assignments are legal."""
    given = gpus_of(pods, names)
    slots = [slot for member_slots in given.values() for slot in member_slots]
    assert all(len(s) == gpus for s in given.values()), given
    assert len(slots) == len(set(slots)), f"a GPU given twice: {given}"
    assert cluster.assignment_problems() == []


# ============================================================ the cases
def test_a_group_that_does_not_fit_waits_whole_and_binds_whole_once_capacity_frees(
    cluster: E2ECluster, podgroups: None
) -> None:
    prefix, ns = cluster.prefix, cluster.namespace
    a, b = f"{prefix}-a", f"{prefix}-b"
    cluster.add_nodes([whole_gpu_node(a, H100, 4, "on-demand", 49.16), whole_gpu_node(b, H100, 4, "on-demand", 49.16)])
    cluster.create_pods([blocker("blocker", b, [0])])
    wait_gpupack_holds_the_bound_pods(cluster)

    create_pod_group(cluster, "train", 8)
    names = [f"train-{i}" for i in range(8)]
    sampler = Sampler(cluster, {"train": names})
    cluster.create_pods([member(n, 1, pod_group="train") for n in names])
    no_fit = f"group {ns}/train needs 8 × 1 GPU in the cluster; largest fit: 7"
    sampler.until("every member to be turned down", turned_down(names), REASON_WITHIN, at_least=PENDING_AT_LEAST)
    first = messages(sampler.pods, names)
    print(f"{cluster.plane.version} no-fit: reasons before asking again: {first}")
    assert all(f"group {ns}/train" in m for m in first.values()), first
    told = [n for n, m in first.items() if no_fit in m]
    assert told, f"no member was told {no_fit!r} once all 8 existed: {first}"

    ask_again(cluster, a)
    sampler.until(f"every member to be told {no_fit!r}", all_say(names, no_fit), REASON_WITHIN)
    assert all("needs 8 ×" in m and "largest fit: 7" in m for m in messages(sampler.pods, names).values())
    sampler.check()

    sampler.fits("train")
    cluster.plane.delete_pod(ns, "blocker")
    took = sampler.until("all 8 members to bind", all_bound(names), BIND_WITHIN)
    print(
        f"{cluster.plane.version} no-fit: {len(told)}/8 told the no-fit reason unasked; all 8 bound "
        f"{took:.1f} s after the blocker's deletion (first to last bind seen: {sampler.window('train'):.1f} s)"
    )
    sampler.check()
    assert_distinct_gpus(cluster, sampler.pods, names, 1)
    nodes = sorted(sampler.pods[n]["spec"]["nodeName"] for n in names)
    assert nodes == [a] * 4 + [b] * 4


def test_two_competing_groups_end_one_bound_whole_and_one_pending_whole(cluster: E2ECluster, podgroups: None) -> None:
    prefix, ns = cluster.prefix, cluster.namespace
    nodes = [f"{prefix}-{i}" for i in range(3)]
    cluster.add_nodes([whole_gpu_node(n, H100, 4, "on-demand", 49.16) for n in nodes])
    groups = {g: [f"{g}-{i}" for i in range(4)] for g in ("blue", "green")}
    sampler = Sampler(cluster, groups)
    for g in groups:  # each alone fits: either may win; the loser never gets a member bound (checked below)
        sampler.fits(g)
    interleaved = [member(f"{g}-{i}", 2, group=g, size=4) for i in range(4) for g in groups]
    cluster.create_pods(interleaved)

    def one_whole(pods: dict[str, dict[str, Any]]) -> bool:
        return any(all_bound(members)(pods) for members in groups.values())

    took = sampler.until("one group to bind whole", one_whole, BIND_WITHIN)
    (winner,) = [g for g, members in groups.items() if all_bound(members)(sampler.pods)]
    (loser,) = set(groups) - {winner}
    sampler.waiting.add(loser)  # no member of the loser may bind from here on
    assert sampler.traces[loser].most_bound == 0, f"{loser} had members bound: {sampler.traces[loser]}"
    no_fit = f"group {ns}/{loser} needs 4 × 2 GPUs in the cluster; largest fit: 2"
    print(
        f"{cluster.plane.version} competing: {winner} bound whole in {took:.1f} s "
        f"(first to last bind seen: {sampler.window(winner):.1f} s); "
        f"{loser}: {messages(sampler.pods, groups[loser])}"
    )
    ask_again(cluster, nodes[0])
    sampler.until(f"every {loser} member to be told {no_fit!r}", all_say(groups[loser], no_fit), REASON_WITHIN)
    sampler.until(f"{loser} to stay Pending", lambda pods: True, PENDING_AT_LEAST, at_least=PENDING_AT_LEAST / 3)
    sampler.check()
    assert_distinct_gpus(cluster, sampler.pods, groups[winner], 2)

    # no deadlock: once the winner's job is gone the other group binds whole
    for name in groups[winner]:
        cluster.plane.delete_pod(ns, name)
    sampler.fits(loser)
    sampler.traces[winner] = GroupTrace(frozenset())  # its pods are gone
    took = sampler.until(f"{loser} to bind whole", all_bound(groups[loser]), BIND_WITHIN)
    print(
        f"{cluster.plane.version} competing: {loser} bound whole {took:.1f} s after {winner}'s pods were deleted "
        f"(first to last bind seen: {sampler.window(loser):.1f} s)"
    )
    sampler.check()
    assert_distinct_gpus(cluster, sampler.pods, groups[loser], 2)


def test_members_of_a_group_share_a_node_that_holds_them(cluster: E2ECluster, podgroups: None) -> None:
    prefix = cluster.prefix
    nodes = [f"{prefix}-{i}" for i in range(2)]
    cluster.add_nodes([whole_gpu_node(n, H100, 8, "on-demand", 98.32, all_to_all_nvlink(8, 18)) for n in nodes])
    create_pod_group(cluster, "pairs", 4)
    names = [f"pairs-{i}" for i in range(4)]
    sampler = Sampler(cluster, {"pairs": names})
    sampler.fits("pairs")
    cluster.create_pods([member(n, 2, pod_group="pairs") for n in names])
    took = sampler.until("all 4 members to bind", all_bound(names), BIND_WITHIN)
    print(f"{cluster.plane.version} same-node: bound in {took:.1f} s (window {sampler.window('pairs'):.1f} s)")
    sampler.check()
    on = {sampler.pods[n]["spec"]["nodeName"] for n in names}
    assert len(on) == 1, f"members spread over {sorted(on)}"
    assert_distinct_gpus(cluster, sampler.pods, names, 2)
    assert sorted(i for slots in gpus_of(sampler.pods, names).values() for _, i in slots) == list(range(8))


def test_a_member_deleted_before_the_group_is_complete_is_replaced(cluster: E2ECluster, podgroups: None) -> None:
    prefix, ns = cluster.prefix, cluster.namespace
    node = f"{prefix}-0"
    cluster.add_nodes([whole_gpu_node(node, H100, 8, "on-demand", 98.32)])
    names = [f"job-{i}" for i in range(5)]  # job-1 is deleted, job-3 and job-4 complete the group
    sampler = Sampler(cluster, {"job": names})

    def create(*which: str) -> None:
        for name in which:  # one after another, as a controller creates them
            cluster.create_pods([member(name, 1, group="job", size=4)])

    create("job-0", "job-1", "job-2")
    first = names[:3]
    sampler.until("the three members to be turned down", turned_down(first), REASON_WITHIN, at_least=5)
    print(f"{cluster.plane.version} member-deleted: reasons before asking again: {messages(sampler.pods, first)}")
    ask_again(cluster, node)
    sampler.until("3 of 4", all_say(first, f"group {ns}/job waits for its members: 3 of 4 exist"), REASON_WITHIN)

    cluster.plane.delete_pod(ns, "job-1")
    left = ["job-0", "job-2"]
    ask_again(cluster, node)
    sampler.until("2 of 4", all_say(left, f"group {ns}/job waits for its members: 2 of 4 exist"), REASON_WITHIN)
    sampler.check()

    sampler.fits("job")
    sampler.traces["job"] = GroupTrace(frozenset([*left, "job-3", "job-4"]), sampler.traces["job"].most_bound)
    create("job-3", "job-4")
    members = [*left, "job-3", "job-4"]
    took = sampler.until("all 4 members to bind", all_bound(members), BIND_WITHIN)
    print(f"{cluster.plane.version} member-deleted: bound {took:.1f} s after the last member was created")
    sampler.check()
    assert_distinct_gpus(cluster, sampler.pods, members, 1)
