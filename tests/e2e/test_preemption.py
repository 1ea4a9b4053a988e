"""Preemption through the real kube-scheduler (#28 item 4): gpupack's preempt verb against counting.

A high-priority GPU pod arrives on nodes full of lower-priority pods. kube-scheduler's DefaultPreemption
picks victims on each node by *counting*: it removes every lower-priority pod, checks that the pod then
fits by its own resource counts, and gives back the most important pods while the count still fits. For
gpupack's requests that count is the wrong question, and each case here is built so that it picks the
wrong victims:

- `mig`: seven 1g slices scattered over two dynamic-MIG GPUs (no free `3g.40gb` placement) and a
  `3g.40gb` pod that also needs 2 CPUs of a node full on CPU. kube-scheduler's count of
  `nvidia.com/mig-3g.40gb` (an upper bound no 1g pod uses) always fits, so it only frees a CPU: it evicts
  the lowest-priority 1g pod, which frees no 3g placement. gpupack evicts the one pod whose slice blocks
  `3g.40gb@4` on GPU 1.
- `whole`: the request model has no hard NVLink rule (NVLink quality is a score term,
  `scoring.policies`' `topology` weight), so the whole-GPU case that exists is the one counting gets
  wrong: kube-scheduler counts `nvidia.com/gpu` and `gpupack.io/gpu-milli` as two pools, though a GPU
  holding a share is not a whole GPU. A 2-GPU pod on three GPUs (whole, share, whole): counting evicts
  one whole-GPU pod and sees two GPUs free; gpupack frees the whole GPU and the shared one.
- `share`: 600 milli freeable over two GPUs (300 + 300) against a 500-milli share, which needs 500 on one
  GPU. Counting evicts the two 300s; gpupack evicts the one 700 whose GPU then has 700 free.

Each case also has a node where nothing would help: pods of the preemptor's own priority (never
victims) pin the geometry (both 3g starts, the second GPU, 600 of each GPU), yet counting finds victims
there (in `whole` and `share` cheaper ones than on the good node, so counting goes there first).

**With the preempt verb** (the shipped scheduler config): kube-scheduler sends its candidates to
`/preempt`, gpupack answers its own plan per node and leaves out the hopeless node. Asserted: exactly
the planned pods are evicted (the expected set is worked out here from the layout and the written rule,
#28: only pods of lower priority; then, no PodDisruptionBudget and no interruptible pod being in play,
the victims' priorities high to low, then fewest pods; each case's set is also the one of fewest pods,
so it does not hang on how those two are ordered), kube-scheduler's `Preempted` events name that node
(the nominated one), the preemptor binds there with a legal `gpupack.io/assignment` at the only
placement the evictions freed, and nothing on the hopeless node is touched. Wasted evictions (victims
evicted while the preemptor stays Pending): 0.

**Without it** (the same config less `preemptVerb`: today's behaviour, `preempt_verb=False` of the
harness): kube-scheduler evicts its counted victims on the node where they are cheapest, then on the
other node once the first counts as fitting; gpupack refuses both still, kube-scheduler then finds
nothing more to count, and the preemptor stays Pending: every eviction was wasted. Asserted: > 0 wasted
evictions, and exactly the ones counting predicts (per case below).

| case | evicted with the verb | preemptor | evicted by counting (all wasted) | preemptor |
|---|---|---|---|---|
| mig | g1s5 | bound, GPU 1 `3g.40gb@4` | g0s0, pin-s3 (2) | Pending |
| whole | w0, s1 | bound, GPUs 0, 1 | pin-w0, w0 (2) | Pending |
| share | a700 | bound, GPU 0 500 milli | pin-b400, pin-d400, b300, d300 (4) | Pending |

Victims carry `terminationGracePeriodSeconds: 0`. kube-scheduler deletes a victim with default delete
options, so the pod's own grace period applies; with no kubelet here a graceful deletion never completes
(the pod stays Terminating, with a deletionTimestamp, and keeps its capacity for kube-scheduler and
gpupack alike), so no preemptor could ever bind. With 0 the API server removes the pod at once, as it
would once a kubelet saw the victim exit; an evicted pod is one gone from the API server (nothing else
deletes them), cross-checked against kube-scheduler's `Preempted` event on it.

The lower-priority pods are created bound (`spec.nodeName` and a `gpupack.io/assignment` naming their
slots, read by gpupack as any bound pod's), so the layout is exactly the one constructed. Their
priorities differ from each other: with equal priorities kube-scheduler orders victims by start time,
which pods without a kubelet do not have, and its choice would not be repeatable.

kube-scheduler runs each mode once per version (module-scoped: restarted with the other config, and
given the shipped one back at the end), on the suite's control plane of that version.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from gpupack.harness.controlplane import ControlPlane, pod_body, shipped_scheduler_config, wait_until
from tests.e2e.catalogue import H100, dynamic_mig_node, whole_gpu_node
from tests.e2e.cluster import E2ECluster, wait_gpupack_holds_the_bound_pods
from tests.e2e.pod_events import notes_by_pod

ASSIGNMENT = "gpupack.io/assignment"
HIGH = 1000  # the preemptor's priority; occupants of this priority are never victims
CLASS_PREFIX = "gpupack-e2e-preemption-"
WITH_VERB, COUNTING = "preempt-verb", "counting"
QUIET = 12.0  # s without a new eviction before a count-based run counts as over (kube-scheduler's backoff tops at 10)
DECIDED = 120.0  # s for the preemption to play out on a loaded 2-core machine


def class_name(priority: int) -> str:
    return f"{CLASS_PREFIX}{priority}"


# ============================================================ the cases
@dataclass(frozen=True)
class Occupant:
    """A pod created bound to `node` (a suffix of the test's node prefix) holding `slots`."""

    name: str
    node: str
    limits: dict[str, int]
    slots: tuple[dict[str, Any], ...]
    priority: int
    cpu: str = "100m"


@dataclass(frozen=True)
class Case:
    """Nodes, their occupants, a preemptor, and what each mode must come to."""

    name: str
    nodes: Callable[[str], list[dict[str, Any]]]  # node-name prefix -> node bodies
    occupants: tuple[Occupant, ...]
    preemptor: dict[str, int]  # GPU limits
    preemptor_cpu: str
    planned: frozenset[str]  # gpupack's victims, worked out from the layout
    target: str  # the node of that plan (suffix)
    placement: tuple[dict[str, Any], ...]  # the preemptor's only placement there once they are gone
    hopeless: str  # the node where nothing would help (suffix)
    counted: frozenset[str]  # what counting evicts without the verb, all of it wasted


def with_cpu(node: dict[str, Any], cpu: str) -> dict[str, Any]:
    """`node` with `cpu` allocatable (and capacity)."""
    for key in ("capacity", "allocatable"):
        node["status"][key]["cpu"] = cpu
    return node


def one_g(name: str, node: str, gpu: int, start: int, priority: int) -> Occupant:
    """A pod of one `1g.10gb` instance at `start` of GPU `gpu`, asking for a whole CPU."""
    return Occupant(
        name, node, {"nvidia.com/mig-1g.10gb": 1}, ({"index": gpu, "mig": "1g.10gb", "start": start},), priority, "1"
    )


def whole(name: str, node: str, gpu: int, priority: int) -> Occupant:
    return Occupant(name, node, {"nvidia.com/gpu": 1}, ({"index": gpu},), priority)


def share(name: str, node: str, gpu: int, milli: int, priority: int) -> Occupant:
    return Occupant(name, node, {"gpupack.io/gpu-milli": milli}, ({"index": gpu, "milli": milli},), priority)


# (a) Seven 1g slices over two H100s, every 3g start blocked: GPU 0 at 0, 2, 4, 6; GPU 1 at 1, 3, 5. The
# node has 8 CPUs and the seven pods hold one each; the preemptor needs 2. Counting frees one CPU: the
# lowest-priority pod, g0s0 (10). Plans that free a 3g placement: {g1s5} (upper half of GPU 1: 2 + 3
# compute slices fit) or two pods (a half of GPU 0, the lower half of GPU 1), each holding a pod of 30 or
# more: gpupack evicts g1s5 (20, and one pod) and the preemptor lands at 3g.40gb@4 on GPU 1. On `pinned` (one
# H100, 4 CPUs) two pods of the preemptor's priority sit at 1 and 5: no 3g start can ever be freed, yet
# counting finds a CPU to free (pin-s3, 15).
MIG = Case(
    name="mig",
    nodes=lambda p: [
        with_cpu(dynamic_mig_node(f"{p}-mig", H100, 2, "on-demand", 49.16), "8"),
        with_cpu(dynamic_mig_node(f"{p}-pinned", H100, 1, "on-demand", 24.58), "4"),
    ],
    occupants=(
        one_g("g0s0", "mig", 0, 0, 10),
        one_g("g0s2", "mig", 0, 2, 30),
        one_g("g0s4", "mig", 0, 4, 40),
        one_g("g0s6", "mig", 0, 6, 50),
        one_g("g1s1", "mig", 1, 1, 60),
        one_g("g1s3", "mig", 1, 3, 70),
        one_g("g1s5", "mig", 1, 5, 20),
        one_g("pin-s1", "pinned", 0, 1, HIGH),
        one_g("pin-s3", "pinned", 0, 3, 15),
        one_g("pin-s5", "pinned", 0, 5, HIGH),
    ),
    preemptor={"nvidia.com/mig-3g.40gb": 1},
    preemptor_cpu="2",
    planned=frozenset({"g1s5"}),
    target="mig",
    placement=({"index": 1, "mig": "3g.40gb", "start": 4},),
    hopeless="pinned",
    # counting goes to `mig` first (its one victim, g0s0 at 10, is cheaper than pin-s3 at 15), then to
    # `pinned` once `mig` counts as fitting
    counted=frozenset({"g0s0", "pin-s3"}),
)

# (b) Three H100s: whole (10), a 300-milli share (20), whole (30); the preemptor asks for 2 whole GPUs.
# Counting sees 1 of 3 `nvidia.com/gpu` free and evicts the cheapest whole-GPU pod, w0: two counted free,
# one real. gpupack needs two free GPUs: {w0, s1} (20, 10) beats {w0, w2} (30, 10) and {s1, w2} (30, 20);
# the preemptor gets GPUs 0 and 1. On `pinned` the second GPU holds a share of the preemptor's priority:
# counting still evicts the whole-GPU pod there (pin-w0, 5) and, as its victim is cheaper, goes there first.
WHOLE = Case(
    name="whole",
    nodes=lambda p: [
        whole_gpu_node(f"{p}-gpus", H100, 3, "on-demand", 36.87),
        whole_gpu_node(f"{p}-pinned", H100, 2, "on-demand", 24.58),
    ],
    occupants=(
        whole("w0", "gpus", 0, 10),
        share("s1", "gpus", 1, 300, 20),
        whole("w2", "gpus", 2, 30),
        whole("pin-w0", "pinned", 0, 5),
        share("pin-s1", "pinned", 1, 100, HIGH),
    ),
    preemptor={"nvidia.com/gpu": 2},
    preemptor_cpu="100m",
    planned=frozenset({"w0", "s1"}),
    target="gpus",
    placement=({"index": 0}, {"index": 1}),
    hopeless="pinned",
    counted=frozenset({"pin-w0", "w0"}),
)

# (c) Two H100s shared 700 + 300 each: GPU 0 a700 (30) + b300 (10), GPU 1 c700 (40) + d300 (20); the
# preemptor asks for 500 milli. Counting needs 500 of the node's 2000 and keeps the most important pods
# while it fits: it evicts b300 and d300, 300 free on each GPU. gpupack needs 500 free on one GPU: {a700}
# (30) or {c700} (40), one victim either way; it evicts a700 and the preemptor shares GPU 0 with b300. On
# `pinned` each GPU holds 600 of the preemptor's priority and 400 evictable (5, 15): at most 400 can be
# freed on a GPU, yet counting frees 800 there first (its highest victim, 15, is below 20).
SHARE = Case(
    name="share",
    nodes=lambda p: [
        whole_gpu_node(f"{p}-shared", H100, 2, "on-demand", 24.58),
        whole_gpu_node(f"{p}-pinned", H100, 2, "on-demand", 24.58),
    ],
    occupants=(
        share("a700", "shared", 0, 700, 30),
        share("b300", "shared", 0, 300, 10),
        share("c700", "shared", 1, 700, 40),
        share("d300", "shared", 1, 300, 20),
        share("pin-a600", "pinned", 0, 600, HIGH),
        share("pin-b400", "pinned", 0, 400, 5),
        share("pin-c600", "pinned", 1, 600, HIGH),
        share("pin-d400", "pinned", 1, 400, 15),
    ),
    preemptor={"gpupack.io/gpu-milli": 500},
    preemptor_cpu="100m",
    planned=frozenset({"a700"}),
    target="shared",
    placement=({"index": 0, "milli": 500},),
    hopeless="pinned",
    counted=frozenset({"pin-b400", "pin-d400", "b300", "d300"}),
)

CASES = (MIG, WHOLE, SHARE)
PRIORITIES = sorted({HIGH} | {o.priority for case in CASES for o in case.occupants})


# ============================================================ fixtures
@pytest.fixture(scope="module")
def priority_classes(control_plane: ControlPlane) -> Iterator[None]:
    """One PriorityClass per priority the cases use (cluster-wide; deleted after the module)."""
    api = client.SchedulingV1Api(control_plane.api_client())
    for value in PRIORITIES:
        body: Any = {  # a plain body, as the other cases send (the client serializes dicts as they are)
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": class_name(value)},
            "value": value,
            "description": "gpupack e2e preemption case",
        }
        api.create_priority_class(body)
    try:
        yield
    finally:
        for value in PRIORITIES:
            api.delete_priority_class(class_name(value))


@pytest.fixture(scope="module", params=(WITH_VERB, COUNTING))
def preemption(control_plane: ControlPlane, priority_classes: None, request: pytest.FixtureRequest) -> Iterator[str]:
    """kube-scheduler with the shipped config (WITH_VERB) or the same less `preemptVerb` (COUNTING)."""
    mode: str = request.param
    use_scheduler_config(control_plane, preempt_verb=mode == WITH_VERB)
    try:
        yield mode
    finally:
        use_scheduler_config(control_plane, preempt_verb=True)


def use_scheduler_config(plane: ControlPlane, preempt_verb: bool) -> None:
    """Rewrite kube-scheduler's config and restart it when that changed it."""
    before = plane.scheduler_config_path.read_text()
    plane.write_scheduler_config(preempt_verb=preempt_verb)
    if plane.scheduler_config_path.read_text() != before:
        plane.restart_scheduler()


def shipped_preempt_verb() -> str | None:
    """The extender's `preemptVerb` in the shipped scheduler config (None while it has none)."""
    return shipped_scheduler_config()["extenders"][0].get("preemptVerb")


# ============================================================ pods
def pod(name: str, limits: dict[str, int], priority: int, cpu: str) -> dict[str, Any]:
    body = pod_body(name, limits)
    spec = body["spec"]
    spec["priorityClassName"] = class_name(priority)
    spec["terminationGracePeriodSeconds"] = 0  # see the module docstring
    spec["containers"][0]["resources"]["requests"]["cpu"] = cpu
    return body


def occupant_body(occupant: Occupant, prefix: str) -> dict[str, Any]:
    """The occupant created bound, its slots in its assignment."""
    node = f"{prefix}-{occupant.node}"
    body = pod(occupant.name, occupant.limits, occupant.priority, occupant.cpu)
    body["spec"]["nodeName"] = node
    body["metadata"]["annotations"][ASSIGNMENT] = json.dumps({"node": node, "gpus": list(occupant.slots)})
    return body


@dataclass
class Outcome:
    evicted: set[str]
    node: str | None  # where the preemptor is bound
    assignment: dict[str, Any] | None
    seconds: float


def watch(cluster: E2ECluster, occupants: set[str], preemptor: str, bound_ends_it: bool) -> Outcome:
    """Follow the preemption until the preemptor is bound (when `bound_ends_it`), or until no pod has
    been evicted for QUIET s with the preemptor turned down after the last eviction."""
    started = time.monotonic()
    last: set[str] = set()
    last_change = started
    while True:
        pods = {p["metadata"]["name"]: p for p in cluster.pods()}
        evicted = occupants - pods.keys()
        now = time.monotonic()
        if evicted != last:
            last, last_change = evicted, now
        mine = pods.get(preemptor, {})
        node = mine.get("spec", {}).get("nodeName")
        if node and (bound_ends_it or now - last_change >= QUIET):
            text = (mine["metadata"].get("annotations") or {}).get(ASSIGNMENT)
            return Outcome(evicted, node, json.loads(text) if text else None, now - started)
        if not node and not bound_ends_it and now - last_change >= QUIET and preemptor in cluster.failed_scheduling():
            return Outcome(evicted, None, None, now - started)
        if now - started > DECIDED:
            return Outcome(evicted, node, None, now - started)
        time.sleep(1.0)


# ============================================================ the cases
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_high_priority_gpu_pod_preempts(cluster: E2ECluster, preemption: str, case: Case) -> None:
    if preemption == WITH_VERB and shipped_preempt_verb() is None:
        pytest.fail(
            "manifests/scheduler-config.yaml ships no preemptVerb for the extender: /preempt is not wired "
            "into the scheduler config yet (#28 item 1)",
            pytrace=False,
        )
    prefix = cluster.prefix
    cluster.add_nodes(case.nodes(prefix))
    cluster.create_pods([occupant_body(o, prefix) for o in case.occupants])
    wait_gpupack_holds_the_bound_pods(cluster)
    assert cluster.assignment_problems() == []

    cluster.create_pods([pod("preemptor", case.preemptor, HIGH, case.preemptor_cpu)])
    outcome = watch(cluster, {o.name for o in case.occupants}, "preemptor", bound_ends_it=preemption == WITH_VERB)
    notes: dict[str, str] = {}
    if outcome.evicted:  # kube-scheduler's events come from its own queue: wait for them

        def preempted() -> dict[str, str]:
            return notes_by_pod(cluster.plane, cluster.namespace, "Preempted")

        wait_until("a Preempted event per victim", lambda: outcome.evicted <= preempted().keys(), 30)
        notes = preempted()
    pods = cluster.pods()
    (preemptor,) = [p for p in pods if p["metadata"]["name"] == "preemptor"]
    uid = preemptor["metadata"]["uid"]
    terminating = [p["metadata"]["name"] for p in pods if p["metadata"].get("deletionTimestamp")]
    assert not terminating, f"pods left Terminating (a victim with a grace period?): {terminating}"
    wasted = len(outcome.evicted) if outcome.node is None else 0
    print(
        f"{case.name} {preemption}: evicted {sorted(outcome.evicted)}, preemptor on {outcome.node}, "
        f"{wasted} wasted, {outcome.seconds:.1f} s"
    )
    assert set(notes) == outcome.evicted, f"Preempted events {sorted(notes)} vs pods gone {sorted(outcome.evicted)}"
    for victim, note in notes.items():
        assert str(uid) in note, f"{victim}: {note}"

    if preemption == WITH_VERB:
        target = f"{prefix}-{case.target}"
        assert outcome.node == target, f"preemptor not bound to {target} after {outcome.seconds:.0f} s: {outcome}"
        assert outcome.evicted == case.planned, f"evicted {sorted(outcome.evicted)}, planned {sorted(case.planned)}"
        assert wasted == 0
        for victim, note in notes.items():
            assert note.endswith(f"on node {target}"), f"{victim}: {note}"  # the nominated node
        assert outcome.assignment == {"node": target, "gpus": list(case.placement)}
        assert cluster.assignment_problems() == []
        untouched = {o.name for o in case.occupants if o.node == case.hopeless}
        assert not untouched & outcome.evicted, (
            f"evicted where nothing would help: {sorted(untouched & outcome.evicted)}"
        )
    else:
        assert outcome.node is None, f"without the verb the preemptor was bound to {outcome.node}"
        assert wasted > 0
        assert outcome.evicted == case.counted, (
            f"counting evicted {sorted(outcome.evicted)}, expected {sorted(case.counted)}"
        )
        assert cluster.assignment_problems() == []
