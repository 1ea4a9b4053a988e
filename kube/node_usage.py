"""What `gpupack.io/devices-in-use` (written by `gpupack agent`, docs/agent.md) makes `gpupack serve` charge.

The annotation lists, per pod, GPU slots the kubelet handed it that its assignment does not name, and
slots that are blocked (NVML refused to create an instance there; an instance no pod holds could not
be destroyed). The agent leaves out every slot a live pod's assignment already names. Serve charges:
- for a pod it would place by first-fit (no valid assignment), the slots the annotation lists for it
  instead of a first-fit guess (`observed`);
- everything else the annotation lists as one node *hold* (`commit_hold`), committed after the pods'
  own assignments and reservations: a slot that no longer fits (already charged, or garbage such as a
  GPU the node does not have) is skipped, so nothing is counted twice. The hold takes no pod slot: on a
  node at its pod limit it is still charged (#26 item 7).
A change of the annotation rebuilds the node's accounting (as a change of its facts does).

A GPU out of service — a whole-GPU `blocked` slot (the agent's unhealthy or cordoned GPUs, a MIG GPU
with no instance), or an index the operator's `gpupack.io/cordoned-gpus` names (kube.gpu_cordon) — is
*excluded*: everything still free on it is held (`hold_excluded`), whatever its pods hold (a share, MIG
instances), and again whenever something on it is released, so nothing new is placed on any part of
it and nothing is counted twice. Its reason is kept for `explain` and the metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupack.kube.gpu_cordon import cordon_reason, read_cordon
from gpupack.kube.keys import ANNOTATION_CORDONED_GPUS, ANNOTATION_DEVICES_IN_USE, decode_json
from gpupack.kube.node_facts import NodeFactsError, node_name
from gpupack.kube.pod_request import parse_slot
from gpupack.scoring.facts import GpuSlot, Placement
from gpupack.scoring.inventory import Inventory, InventoryError
from gpupack.scoring.request import MAX_GPUS_PER_NODE, PodRequest

logger = logging.getLogger(__name__)
MAX_REASON = 500
# Bounds on one node's annotation. Every change of it re-commits the listed slots under serve's state
# lock, so an unbounded value (the annotation may be 256 KiB) would stall every decision for seconds.
# A real node lists a few slots per pod and a few blocked ones: far below both.
MAX_DEVICES_IN_USE_BYTES = 64 * 1024
MAX_DEVICES_IN_USE_SLOTS = 512


@dataclass(frozen=True)
class Exclusion:
    """A GPU nothing new goes on, and why (`unhealthy: ...`, `cordoned: ...`, or another block's reason)."""

    index: int
    reason: str

    @property
    def why(self) -> str:
        """`unhealthy`, `cordoned` or `blocked`: the label `gpupack_gpus_excluded` counts it under."""
        head = self.reason.partition(":")[0]
        return head if head in ("unhealthy", "cordoned") else "blocked"


@dataclass(frozen=True)
class NodeUsage:
    """One node's `gpupack.io/devices-in-use` and `gpupack.io/cordoned-gpus`, decoded (empty when absent)."""

    node: str
    pods: tuple[tuple[str, tuple[GpuSlot, ...]], ...] = ()  # (namespace/name, extra slots), sorted
    blocked: tuple[GpuSlot, ...] = ()
    excluded: tuple[Exclusion, ...] = ()  # by index, one per GPU
    cordon_invalid: tuple[str, ...] = ()  # entries of gpupack.io/cordoned-gpus that name no GPU by index

    def slots_of(self, pod: str) -> tuple[GpuSlot, ...]:
        """The slots listed for one pod."""
        return next((slots for key, slots in self.pods if key == pod), ())


def read_node_usage(node: Mapping[str, Any], gpu_count: int | None = None) -> NodeUsage:
    """The node's annotations decoded; NodeFactsError naming node and key on a garbage `devices-in-use`.

    `gpu_count` (the node's GPUs) bounds the indexes `gpupack.io/cordoned-gpus` may name; an entry it
    cannot use is kept in `cordon_invalid`, never an error. UUID entries are the agent's to resolve.
    """
    name = node_name(node)
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_DEVICES_IN_USE)
    usage = NodeUsage(name)
    if text is not None:
        if len(text) > MAX_DEVICES_IN_USE_BYTES:
            reason = f"{len(text)} characters, more than the {MAX_DEVICES_IN_USE_BYTES} a node's devices can need"
            raise NodeFactsError(name, ANNOTATION_DEVICES_IN_USE, reason)
        try:
            usage = parse_devices_in_use(name, decode_json(text))
        except ValueError as exc:
            raise NodeFactsError(name, ANNOTATION_DEVICES_IN_USE, str(exc)) from None
    return with_cordon(usage, node, gpu_count)


def with_cordon(usage: NodeUsage, node: Mapping[str, Any], gpu_count: int | None) -> NodeUsage:
    """`usage` with the GPUs `gpupack.io/cordoned-gpus` names by index excluded too (only GPUs the node has)."""
    cordon = read_cordon(node)
    count = MAX_GPUS_PER_NODE if gpu_count is None else gpu_count
    indexes, invalid = cordon.resolve({}, count)
    invalid = tuple(entry for entry in invalid if entry not in cordon.uuids)  # the agent resolves those
    mine = {e.index: e for e in usage.excluded if e.index < count}
    if not indexes and not invalid and len(mine) == len(usage.excluded):
        return usage
    excluded = {i: Exclusion(i, cordon_reason(str(i))) for i in indexes} | mine  # the agent's reason first
    ordered = tuple(excluded[i] for i in sorted(excluded))
    return NodeUsage(usage.node, usage.pods, usage.blocked, ordered, invalid)


def parse_devices_in_use(node: str, data: object) -> NodeUsage:
    """A decoded value: {"pods": {"ns/name": [slot, ...]}, "blocked": [slot + "reason", ...]}; ValueError."""
    if not isinstance(data, dict) or not set(data) <= {"pods", "blocked"}:
        raise ValueError('must be a JSON object with keys "pods" and/or "blocked"')
    pods, blocked = data.get("pods", {}), data.get("blocked", [])
    if not isinstance(pods, dict) or not all(isinstance(k, str) and isinstance(v, list) for k, v in pods.items()):
        raise ValueError("pods must map namespace/name to a list of slots")
    if not isinstance(blocked, list):
        raise ValueError("blocked must be a list of slots")
    listed = len(blocked) + sum(len(slots) for slots in pods.values())
    if listed > MAX_DEVICES_IN_USE_SLOTS:
        raise ValueError(f"{listed} slots listed, more than the {MAX_DEVICES_IN_USE_SLOTS} a node's devices can need")
    parsed = tuple(sorted((key, tuple(parse_slot(i, e) for i, e in enumerate(slots))) for key, slots in pods.items()))
    entries = [_blocked_slot(i, entry) for i, entry in enumerate(blocked)]
    whole = {slot.index: Exclusion(slot.index, reason) for slot, reason in reversed(entries) if _is_whole(slot)}
    excluded = tuple(whole[i] for i in sorted(whole))
    return NodeUsage(node, parsed, tuple(slot for slot, _ in entries), excluded)


def _blocked_slot(position: int, entry: object) -> tuple[GpuSlot, str]:
    if not isinstance(entry, dict):
        raise ValueError(f"blocked[{position}] must be an object")
    reason = entry.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise ValueError(f"blocked[{position}].reason must be a string of at most {MAX_REASON} characters")
    return parse_slot(position, {k: v for k, v in entry.items() if k != "reason"}), reason


def _is_whole(slot: GpuSlot) -> bool:
    return not slot.mig and not slot.milli


@dataclass
class NodeUsageBook:
    """Each node's decoded annotation and the hold committed for it (serve's state holds one book)."""

    inventory: Inventory
    usage: dict[str, NodeUsage] = field(default_factory=dict)
    holds: dict[str, Placement] = field(default_factory=dict)

    def unchanged(self, usage: NodeUsage) -> bool:
        """The node's annotation says what the book already holds."""
        return self.usage.get(usage.node, NodeUsage(usage.node)) == usage

    def set(self, usage: NodeUsage) -> None:
        """Remember a node's new annotation (its hold is committed again by `commit_hold`)."""
        self.forget(usage.node)
        if usage.cordon_invalid:
            logger.warning(
                "node %s: %s entries naming no GPU of the node are ignored: %s",
                usage.node, ANNOTATION_CORDONED_GPUS, list(usage.cordon_invalid),
            )  # fmt: skip
        if usage.pods or usage.blocked or usage.excluded or usage.cordon_invalid:
            self.usage[usage.node] = usage

    def forget(self, node: str) -> None:
        """The node is gone or rebuilt: its annotation and hold are forgotten."""
        self.usage.pop(node, None)
        self.holds.pop(node, None)

    def exclusions(self, node: str) -> tuple[Exclusion, ...]:
        """The node's GPUs out of service, by index."""
        usage = self.usage.get(node)
        return usage.excluded if usage is not None else ()

    def hold_excluded(self, node: str) -> None:
        """Hold whatever is free on the node's excluded GPUs (after a commit, and after every release there)."""
        usage = self.usage.get(node)
        if usage is None or not usage.excluded or node not in self.inventory.index:
            return
        out = {e.index for e in usage.excluded}
        free = tuple(slot for slot in self.inventory.free_slots(node) if slot.index in out)
        if free:  # held until the node is rebuilt, which builds its inventory row anew
            commit_what_fits(self.inventory, Placement(node, free))

    def commit_hold(self, node: str, placed_by_pod: Collection[str]) -> Placement | None:
        """Commit the node's hold: blocked slots and the slots of listed pods not in `placed_by_pod`."""
        usage = self.usage.get(node)
        if usage is None:
            return None
        slots = [*usage.blocked, *(s for pod, listed in usage.pods if pod not in placed_by_pod for s in listed)]
        hold = commit_what_fits(self.inventory, Placement(node, tuple(dict.fromkeys(slots))))
        if hold is not None:
            self.holds[node] = hold
        self.hold_excluded(node)
        return hold

    def observed(self, node: str, pod: str, request: PodRequest) -> Placement | None:
        """For a pod without a valid assignment: its CPU, memory and its listed slots not in the hold.

        None when the annotation does not list the pod or that placement does not fit now (then
        first-fit). Nothing is committed: the caller commits what this returns.
        """
        usage = self.usage.get(node)
        listed = usage.slots_of(pod) if usage is not None else ()
        if not listed:
            return None
        held = self.holds.get(node)
        slots = tuple(s for s in listed if held is None or s not in held.slots)  # the hold charges those
        placement = Placement(node, slots, request.cpu_milli, request.memory_bytes)
        try:
            self.inventory.commit(placement)
        except InventoryError as exc:
            logger.info("node %s: %s for pod %s does not fit (%s)", node, ANNOTATION_DEVICES_IN_USE, pod, exc)
            return None
        self.inventory.release(placement)
        return placement


def commit_what_fits(inventory: Inventory, wanted: Placement) -> Placement | None:
    """Commit the largest prefix-greedy subset of `wanted`'s slots that fits; None when none does."""
    taken: list[GpuSlot] = []
    for slot in wanted.slots:
        trial = Placement(wanted.node, (*taken, slot), pod_slots=0)
        try:
            inventory.commit(trial)
        except InventoryError as exc:
            logger.debug("node %s: %s slot %s skipped: %s", wanted.node, ANNOTATION_DEVICES_IN_USE, slot, exc)
            continue
        inventory.release(trial)
        taken.append(slot)
    if not taken:
        return None
    hold = Placement(wanted.node, tuple(taken), pod_slots=0)
    inventory.commit(hold)
    return hold
