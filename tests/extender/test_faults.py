"""Faults between kube-scheduler, gpupack and the API server; each ends with "state equals a rebuild".

A `FakeApiServer` (tests/fake_apiserver.py) feeds a real `KubernetesSource` and takes the binder's
writes, so every fault goes through the same list/watch and bind code as production. After each
fault the live `ClusterState` must equal one rebuilt from scratch from the same Node and Pod objects
(annotations written by binds included): same placements, same free capacity on every node — so no
capacity leaked or counted twice — and no overlap (`assert_matches_rebuild`).

Covered elsewhere and not repeated here: the simple state-level versions in tests/extender/test_state.py
(test_pod_deleted_between_filter_and_bind_releases, test_node_deleted_while_reserved,
test_binding_error_rolls_back, test_reservation_ttl_expiry_releases,
test_expired_reservation_is_re_decided_at_bind_when_it_still_fits) and the concurrent HTTP run in
tests/extender/test_app_concurrency.py.
"""

from __future__ import annotations

import json
import queue
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
from kubernetes.client.exceptions import ApiException

from gpupack.extender.binder import NOT_SYNCED, BindError
from gpupack.extender.reservations import Ended
from gpupack.extender.settings import Settings
from tests.extender_helpers import A100, L4, FakeClock, mixed_kinds_pod, node, pod
from tests.fake_apiserver import Extender, FakeApiServer, launch

ASSIGNMENT = "gpupack.io/assignment"


def assignment(server: FakeApiServer, key: str) -> dict | None:
    text = server.pod(key)["metadata"].get("annotations", {}).get(ASSIGNMENT)
    return json.loads(text) if text else None


# --- watch drops and 410 Gone in the middle of a burst -------------------------------------------------


def burst_nodes() -> list[dict]:
    nodes = [node(f"h100-{i}", mig="dynamic") for i in range(3)]
    nodes += [node(f"a100-{i}", A100, 8, static_mig={"1g.10gb": 14, "3g.40gb": 4}) for i in range(2)]
    return nodes + [node(f"l4-{i}", L4, 4) for i in range(3)]


def burst_pod(i: int, rng: random.Random) -> dict:
    roll = rng.random()
    if roll < 0.35:
        return pod(f"w{i}", gpus=rng.choice([1, 1, 2, 4]))
    if roll < 0.7:
        return pod(f"m{i}", mig=rng.choice(["1g.10gb", "3g.40gb"]))
    return pod(f"s{i}", milli=rng.choice([100, 300, 500]))


@dataclass
class Burst:
    """kube-scheduler's workers and the rest of the cluster, racing on one extender and API server."""

    extender: Extender
    rng: random.Random
    work: queue.Queue[str | None] = field(default_factory=queue.Queue)
    outcomes: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    bound: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def server(self) -> FakeApiServer:
        return self.extender.server

    def scheduler(self, names: list[str]) -> None:
        """One kube-scheduler worker: filter, then bind to the chosen node, until told to stop (None)."""
        while (key := self.work.get()) is not None:
            try:
                chosen = self.extender.filter(key, self.rng.sample(names, len(names)))
            except KeyError:
                self.outcomes["deleted before filter"] += 1
                continue
            if chosen is None:
                self.outcomes["unschedulable"] += 1
                continue
            try:
                self.extender.bind(key, chosen)
            except (BindError, KeyError):
                self.outcomes["bind refused"] += 1
                continue
            with self.lock:
                self.outcomes["bound"] += 1
                self.bound.append(key)

    def chaos(self, stop: threading.Event) -> None:
        """The API server and the rest of the cluster: dropped watches, 410s, deletions, new pods."""
        n, rng, server = 60, self.rng, self.server
        while not stop.is_set():
            roll = rng.random()
            if roll < 0.2:
                server.drop_watches()
                self.faults["drop"] += 1
            elif roll < 0.3:
                server.compact()
                self.faults["410"] += 1
            elif roll < 0.6 and self.bound:
                with self.lock:
                    victim = self.bound.pop(rng.randrange(len(self.bound)))
                server.delete_pod(victim)
                self.faults["delete bound"] += 1
            elif roll < 0.7:
                server.delete_pod(rng.choice(list(server.pods)))  # maybe between its filter and bind
                self.faults["delete any"] += 1
            else:
                obj = burst_pod(n, rng)
                server.put_pod(obj)
                self.work.put(f"default/{obj['metadata']['name']}")
                n += 1
            time.sleep(rng.uniform(0.0005, 0.003))

    def run(self, names: list[str], seconds: float, workers: int = 4) -> None:
        """Schedule every pod of the server and what chaos adds for `seconds`, then drain the workers."""
        for key in list(self.server.pods):
            self.work.put(key)
        stop = threading.Event()
        chaos_thread = threading.Thread(target=self.chaos, args=(stop,))
        threads = [threading.Thread(target=self.scheduler, args=(names,)) for _ in range(workers)]
        chaos_thread.start()
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        stop.set()
        chaos_thread.join()
        for _ in threads:
            self.work.put(None)
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive()


def test_watch_drops_and_410_mid_burst_converge_to_a_rebuild(extenders: list[Extender]) -> None:
    rng = random.Random(5)
    clock = FakeClock()
    server = FakeApiServer(burst_nodes(), [burst_pod(i, rng) for i in range(60)])
    burst = Burst(launch(extenders, server, clock=clock), rng)
    burst.run([n["metadata"]["name"] for n in burst_nodes()], seconds=1.5)

    faults, outcomes = burst.faults, burst.outcomes
    assert faults["drop"] > 5 and faults["410"] > 2 and outcomes["bound"] > 20, (faults, outcomes)
    assert server.list_calls["Pod"] > 1  # the 410s made the source relist
    # A pod created and deleted while a watch was down was never seen by the source: its hold ends
    # by TTL (not bound yet) or at the next relist (bound). Let both happen, then compare.
    extender = burst.extender
    clock.advance(extender.settings.reservation_ttl_seconds + 1)
    extender.relist()
    extender.state.snapshot()
    rebuilt = extender.assert_matches_rebuild()
    assert all(p.how in ("assignment", "reservation") for p in extender.state.bound_pods().values())
    assert {p.how for p in rebuilt.bound_pods().values()} <= {"assignment"}


# --- extender restart between filter and bind ----------------------------------------------------------


def test_restart_between_filter_and_bind_re_decides_when_it_still_fits(extenders: list[Extender]) -> None:
    server = FakeApiServer([node("a", L4, 2), node("b", L4, 2)], [pod("p", gpus=1)])
    before = launch(extenders, server)
    chosen = before.filter("default/p", ["a", "b"])
    assert chosen
    before.stop()  # the process dies with the reservation; the pod is still pending
    after = launch(extenders, server)
    after.bind("default/p", chosen)  # re-decided on the node kube-scheduler names, from the watched pod
    assert server.pod("default/p")["spec"]["nodeName"] == chosen
    assert (assignment(server, "default/p") or {}).get("node") == chosen
    after.assert_matches_rebuild()


def test_restart_between_filter_and_bind_refuses_clearly_when_it_no_longer_fits(extenders: list[Extender]) -> None:
    server = FakeApiServer([node("a", L4, 1)], [pod("p", gpus=1), pod("q", gpus=1)])
    before = launch(extenders, server)
    assert before.filter("default/p", ["a"]) == "a"
    before.stop()
    after = launch(extenders, server)
    assert after.filter("default/q", ["a"]) == "a"  # the restarted extender gave the GPU to q...
    after.bind("default/q", "a")
    with pytest.raises(BindError) as refused:  # ...so p's late bind cannot have it
        after.bind("default/p", "a")
    assert refused.value.kind == "no-fit" and "no longer fits on a" in refused.value.reason
    assert "nodeName" not in server.pod("default/p")["spec"] and assignment(server, "default/p") is None
    after.assert_matches_rebuild()


def test_bind_before_the_restarted_extender_synced_is_refused() -> None:
    server = FakeApiServer([node("a", L4, 1)], [pod("p", gpus=1)])
    extender = Extender(server)  # not started: nothing listed yet
    with pytest.raises(BindError) as refused:
        extender.bind("default/p", "a")
    assert refused.value.kind == "not-synced" and refused.value.reason == NOT_SYNCED
    assert "nodeName" not in server.pod("default/p")["spec"]


def test_bind_of_a_pod_never_seen_is_refused_with_a_reason(extenders: list[Extender]) -> None:
    server = FakeApiServer([node("a", L4, 1)])
    extender = launch(extenders, server)
    with pytest.raises(BindError) as refused:
        extender.state.bind("default", "ghost", "uid-ghost", "a")
    assert refused.value.kind == "no-reservation"
    extender.assert_matches_rebuild()


# --- pod deleted between filter and bind ---------------------------------------------------------------


def test_pod_deleted_between_filter_and_bind(extenders: list[Extender]) -> None:
    server = FakeApiServer([node("a", L4, 1)], [pod("p", gpus=1)])
    extender = launch(extenders, server)
    obj = server.pod("default/p")
    assert extender.filter("default/p", ["a"]) == "a"
    server.delete_pod("default/p")
    extender.caught_up()
    assert extender.state.snapshot().gpus_allocated == 0  # the deletion released the reservation
    with pytest.raises(BindError) as refused:
        extender.state.bind("default", "p", obj["metadata"]["uid"], "a")
    assert refused.value.kind == "no-reservation"
    extender.assert_matches_rebuild()


def test_pod_deleted_while_its_bind_is_in_flight(extenders: list[Extender]) -> None:
    server = FakeApiServer([node("a", L4, 1)], [pod("p", gpus=1)])
    extender = launch(extenders, server)
    assert extender.filter("default/p", ["a"]) == "a"

    def deleted_under_our_feet(namespace: str, name: str) -> None:
        server.delete_pod(f"{namespace}/{name}")

    server.fail_binding = deleted_under_our_feet
    with pytest.raises(BindError) as refused:
        extender.bind("default/p", "a")
    assert refused.value.kind == "binding" and "404" in refused.value.reason
    extender.assert_matches_rebuild()
    assert extender.state.snapshot().gpus_allocated == 0


# --- node deleted or relabelled while pods are reserved on it ------------------------------------------


def test_node_deleted_while_reserved(extenders: list[Extender]) -> None:
    server = FakeApiServer([node("a", L4, 2), node("b", L4, 2)], [pod("p", gpus=2), pod("q", gpus=1)])
    extender = launch(extenders, server)
    assert extender.filter("default/p", ["a"]) == "a"
    assert extender.filter("default/q", ["a"]) is None  # a is fully reserved
    server.delete_node("a")
    extender.caught_up()
    with pytest.raises(BindError) as refused:
        extender.bind("default/p", "a")
    assert refused.value.kind == "node-unknown"
    extender.assert_matches_rebuild()
    assert extender.filter("default/q", ["b"]) == "b"  # nothing of p's hold survived anywhere
    extender.bind("default/q", "b")
    extender.assert_matches_rebuild()


def relabel(obj: dict, how: str) -> dict:
    changed = json.loads(json.dumps(obj))
    labels, notes = changed["metadata"]["labels"], changed["metadata"]["annotations"]
    if how == "fewer GPUs":
        labels["nvidia.com/gpu.count"] = "1"
        for part in ("allocatable", "capacity"):
            changed["status"][part]["nvidia.com/gpu"] = "1"
    elif how == "other product":
        labels["nvidia.com/gpu.product"] = A100
    elif how == "cordoned":
        changed["spec"]["unschedulable"] = True
    elif how == "garbage topology":
        notes["gpupack.io/gpu-topology"] = json.dumps({"nvlink": [[0, 1], [1, 0]]})  # 2x2 on 8 GPUs
    elif how == "garbage mig annotation":
        notes["gpupack.io/mig"] = "sometimes"
    return changed


@pytest.mark.parametrize(
    ("how", "binds"),
    [
        # one GPU left: w's two GPUs no longer fit (forgotten; its bind re-decides and fails); p's
        # two 1g instances still fit only if they were placed on GPU 0
        ("fewer GPUs", {"default/w": False}),
        ("other product", {"default/p": True, "default/w": True}),  # 1g.10gb exists on A100-80GB too
        ("cordoned", {"default/p": True, "default/w": True}),  # chosen before the cordon: bound
        ("garbage topology", {"default/p": False, "default/w": False}),  # the node becomes unusable
        ("garbage mig annotation", {"default/p": False, "default/w": False}),
    ],
)
def test_node_relabelled_while_reserved(extenders: list[Extender], how: str, binds: dict[str, bool]) -> None:
    h100 = node("h", mig="dynamic")
    held = {"node": "h", "gpus": [{"index": 0, "mig": "1g.10gb", "start": 0}]}
    bound = pod("old", mig="1g.10gb", node_name="h", assignment=held)
    server = FakeApiServer([h100], [bound, pod("p", mig="1g.10gb", mig_count=2), pod("w", gpus=2)])
    extender = launch(extenders, server)
    assert extender.filter("default/p", ["h"]) == "h"
    assert extender.filter("default/w", ["h"]) == "h"
    server.put_node(relabel(h100, how))
    extender.caught_up()
    for key in ("default/p", "default/w"):
        try:
            extender.bind(key, "h")
        except BindError as refused:
            assert binds.get(key) is not True, refused.reason
            assert refused.kind in ("no-fit", "node-unknown"), refused.reason
            assert "nodeName" not in server.pod(key)["spec"]
        else:
            assert binds.get(key) is not False
            assert server.pod(key)["spec"]["nodeName"] == "h"
    extender.assert_matches_rebuild()


# --- bind API call fails after the annotation patch ----------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "status"),
    [("binding refused", 409), ("binding refused", 500), ("binding made, answer lost", 500),
     ("binding made, answer lost", None)],
)  # fmt: skip
def test_binding_failure_never_leaves_a_claim_on_an_unbound_pod(
    extenders: list[Extender], fault: str, status: int | None
) -> None:
    server = FakeApiServer([node("a", L4, 2)], [pod("p", gpus=1)])
    extender = launch(extenders, server)
    assert extender.filter("default/p", ["a"]) == "a"
    error = ApiException(status=status, reason="etcdserver: request timed out") if status else TimeoutError("read")
    if fault == "binding made, answer lost":
        server.bind_then_fail = lambda ns, name: error
    else:
        server.fail_binding = lambda ns, name: error
    with pytest.raises(BindError) as refused:
        extender.bind("default/p", "a")
    assert refused.value.kind == "binding" and ("HTTP" in refused.value.reason) == (status is not None)
    obj = server.pod("default/p")
    # the annotation and nodeName are one write: both or neither
    assert (ASSIGNMENT in obj["metadata"]["annotations"]) == ("nodeName" in obj["spec"])
    assert ("nodeName" in obj["spec"]) == (fault == "binding made, answer lost")
    extender.caught_up()
    if status == 409:  # a definite refusal gives the capacity back at once
        extender.assert_matches_rebuild()
    # kube-scheduler retries an unbound pod: filter and bind again
    server.fail_binding = server.bind_then_fail = None
    if "nodeName" not in server.pod("default/p")["spec"]:
        assert extender.filter("default/p", ["a"]) == "a"
        extender.bind("default/p", "a")
    extender.caught_up()
    rebuilt = extender.assert_matches_rebuild()
    assert rebuilt.snapshot().gpus_allocated == 1


@pytest.mark.parametrize("status", [500, 504, None])
def test_a_binding_whose_answer_is_lost_keeps_its_gpu_until_the_informer_tells(
    extenders: list[Extender], status: int | None
) -> None:
    """#26 item 9: the Binding was applied, its answer lost; the informer lags. The next pod must not
    get the same GPU (before, the reservation was released at once and it did)."""
    server = FakeApiServer([node("a", L4, 1)], [pod("p", gpus=1), pod("q", gpus=1)])
    extender = launch(extenders, server)
    assert extender.filter("default/p", ["a"]) == "a"
    server.pause()
    lost = ApiException(status=status, reason="Gateway Timeout") if status else ConnectionResetError("reset")
    server.bind_then_fail = lambda ns, name: lost
    with pytest.raises(BindError):
        extender.bind("default/p", "a")
    assert server.pod("default/p")["spec"]["nodeName"] == "a"  # it is bound, gpupack cannot know yet
    assert extender.filter("default/q", ["a"]) is None  # the GPU stays held
    server.resume()
    extender.caught_up()
    assert extender.state.book.ended[Ended.CONFIRMED] == 1  # the informer confirmed the held reservation
    assert extender.filter("default/q", ["a"]) is None
    extender.assert_matches_rebuild()


def test_a_refused_binding_gives_its_gpu_back_at_once(extenders: list[Extender]) -> None:
    server = FakeApiServer([node("a", L4, 1)], [pod("p", gpus=1), pod("q", gpus=1)])
    extender = launch(extenders, server)
    assert extender.filter("default/p", ["a"]) == "a"
    server.fail_binding = lambda ns, name: ApiException(status=409, reason="Conflict")
    with pytest.raises(BindError):
        extender.bind("default/p", "a")
    assert extender.state.book.ended[Ended.BIND_FAILED] == 1
    assert extender.filter("default/q", ["a"]) == "a"


# --- reservation TTL expiry ----------------------------------------------------------------------------


def test_unbound_reservation_expires_and_the_capacity_returns(extenders: list[Extender]) -> None:
    clock = FakeClock()
    server = FakeApiServer([node("a", L4, 1)], [pod("p", gpus=1), pod("q", gpus=1)])
    extender = launch(extenders, server, settings=Settings(reservation_ttl_seconds=5), clock=clock)
    assert extender.filter("default/p", ["a"]) == "a"
    assert extender.filter("default/q", ["a"]) is None
    clock.advance(5.5)
    extender.state.snapshot()  # any read expires what is due
    extender.assert_matches_rebuild()
    assert extender.state.book.ended[Ended.EXPIRED] == 1
    assert extender.filter("default/q", ["a"]) == "a"
    extender.bind("default/q", "a")
    with pytest.raises(BindError) as refused:  # p's bind after its expiry: re-decided, no room
        extender.bind("default/p", "a")
    assert refused.value.kind == "no-fit"
    extender.assert_matches_rebuild()


def test_bound_reservation_outlives_the_ttl_while_the_informer_lags(extenders: list[Extender]) -> None:
    """The Binding exists but the watch has not shown it: the hold must not expire (kubernetes#106361)."""
    clock = FakeClock()
    server = FakeApiServer([node("a", L4, 1)], [pod("p", gpus=1), pod("q", gpus=1)])
    extender = launch(extenders, server, settings=Settings(reservation_ttl_seconds=5), clock=clock)
    assert extender.filter("default/p", ["a"]) == "a"
    server.pause()
    extender.bind("default/p", "a")
    clock.advance(60)
    assert extender.filter("default/q", ["a"]) is None  # p's GPU is not handed out again
    server.resume()
    rebuilt = extender.assert_matches_rebuild()
    assert rebuilt.snapshot().gpus_allocated == 1
    assert extender.state.book.ended[Ended.CONFIRMED] == 1


def test_orphaned_bound_reservation_is_released_at_the_next_relist(extenders: list[Extender]) -> None:
    """A pod created, bound and deleted while the watch was down is never seen: a later relist frees it."""
    clock = FakeClock()
    server = FakeApiServer([node("a", L4, 1)], [pod("q", gpus=1)])
    extender = launch(extenders, server, settings=Settings(reservation_ttl_seconds=5), clock=clock)
    server.pause()
    server.put_pod(pod("p", gpus=1))  # kube-scheduler's informer sees it; gpupack's watch is stuck
    assert extender.filter("default/p", ["a"]) == "a"
    extender.bind("default/p", "a")
    server.delete_pod("default/p")
    server.resume()
    extender.relist()  # too early: a bind younger than the TTL may not be in the list yet
    assert len(extender.state.book.live()) == 1
    clock.advance(6)
    extender.relist()
    assert extender.state.book.live() == [] and extender.state.book.ended[Ended.POD_GONE] == 1
    extender.assert_matches_rebuild()
    assert extender.filter("default/q", ["a"]) == "a"


# --- a pod bound by another scheduler with a request gpupack cannot read (#13) ---------------------------


def test_unreadable_bound_pod_holds_its_node_across_a_restart(extenders: list[Extender]) -> None:
    server = FakeApiServer([node("a", L4, 4)], [pod("p", gpus=1), pod("q", gpus=1)])
    before = launch(extenders, server)
    assert before.filter("default/p", ["a"]) == "a"
    before.bind("default/p", "a")
    server.put_pod(mixed_kinds_pod("mixed", "a"))  # another scheduler's pod: 4 GPUs + 7 MIG slices
    before.caught_up()
    assert before.filter("default/q", ["a"]) is None  # what it can be using is not handed out
    before.assert_matches_rebuild()
    before.stop()
    after = launch(extenders, server)  # rebuilt from the list: p's claim first, then the rest
    assert after.filter("default/q", ["a"]) is None
    assert after.state.snapshot().unreadable_pods == 1
    after.assert_matches_rebuild()
    server.delete_pod("default/mixed")
    after.caught_up()
    assert after.filter("default/q", ["a"]) == "a"
    after.bind("default/q", "a")
    after.assert_matches_rebuild()
