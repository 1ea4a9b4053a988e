"""The DRA inventory (#30 item 1): ResourceSlices, ResourceClaims and DeviceClasses, held in the same inventory
as device-plugin nodes, each GPU counted once (docs/dra.md#rules).

- A node with GPU slices of `gpu.nvidia.com` is a *DRA node*: its GPUs are the slices' (`kube.dra`), whatever
  its allocatable advertises; `facts` gives the ledger its NodeFacts.
- Every device an allocated ResourceClaim names is committed once, as a one-slot hold that takes no pod slot,
  reserved or not (an allocated claim holds its devices until it is deallocated). A device tainted
  NoSchedule/NoExecute is held the same way. A device whose slice is not (yet) there holds nothing until it is.
- A slice deleted while an allocated claim names one of its devices is kept (its GPUs stay) until no claim
  does: a driver restart must not make held GPUs look free.
- `serves` says whether a pod's GPU request on a DRA node is served by a claim (KEP-5004), so that the ledger
  charges it its CPU and memory only.

Bad objects are logged once and change nothing already held; a bad slice that names its node makes the node
unusable with the reason. Like the ledger, not thread-safe: its caller holds the state lock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpupack.kube.dra import (
    DRIVER,
    ClaimInfo,
    DeviceKey,
    DraError,
    DraGpus,
    ResourceSliceInfo,
    dra_node_facts,
    gpus_of_node,
    read_claim,
    read_device_class,
    read_slice,
)
from gpupack.kube.keys import RESOURCE_GPU, RESOURCE_MIG_PREFIX
from gpupack.kube.node_facts import NodeFactsError, PriceTable, facts_from_node, node_name
from gpupack.kube.sources.events import DraDeleted, DraUpserted
from gpupack.scoring.facts import GpuSlot, NodeFacts, Placement
from gpupack.scoring.geometry import resource_profile
from gpupack.scoring.inventory import Inventory, InventoryError
from gpupack.scoring.request import Kind, PodRequest

logger = logging.getLogger(__name__)

TAINT = ""  # the holder of a tainted device


class DraInventory:
    """The DRA objects the source has shown, and the devices they hold in the inventory."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self.nodes: dict[str, Mapping[str, Any]] = {}  # raw Nodes, to rebuild one when its slices change
        self._slices: dict[str, ResourceSliceInfo] = {}
        self._by_node: dict[str, set[str]] = {}  # node -> names of its slices
        self._gone: set[str] = set()  # deleted slices kept while a claim holds one of their devices
        self._bad_slices: dict[str, tuple[str, str]] = {}  # slice -> (node, reason)
        self._claims: dict[str, ClaimInfo] = {}
        self._classes: dict[str, str] = {}  # DeviceClass -> its extendedResourceName ("" for none)
        self.class_specs: dict[str, Mapping[str, Any]] = {}  # DeviceClass -> its raw spec (selectors, config)
        self._gpus: dict[str, DraGpus] = {}  # DRA nodes, as last read
        self._where: dict[DeviceKey, tuple[str, GpuSlot]] = {}  # every DRA node's devices
        self._holder: dict[DeviceKey, str] = {}  # device -> claim key allocating it (TAINT: a taint)
        self._held: dict[DeviceKey, Placement] = {}  # committed in the inventory
        self._held_on: dict[str, set[DeviceKey]] = {}  # node -> its committed devices
        self._stale: set[str] = set()  # nodes whose slices changed since their GPUs were read
        self._told: set[str] = set()  # objects whose problem was logged

    # ------------------------------------------------------------------ reading
    def is_dra_node(self, node: str) -> bool:
        """The node's GPUs come from its slices."""
        return node in self._gpus

    def dra_nodes(self) -> list[str]:
        """The nodes whose GPUs come from their slices."""
        return list(self._gpus)

    def gpus(self, node: str) -> DraGpus | None:
        """The DRA node's GPUs as last read (None: not a DRA node)."""
        return self._gpus.get(node)

    def holders(self) -> dict[DeviceKey, str]:
        """Every device an allocated claim (or a taint, "") holds, committed or waiting for its slice."""
        return dict(self._holder)

    def held(self) -> dict[DeviceKey, Placement]:
        """The devices committed in the inventory, each once."""
        return dict(self._held)

    def facts(self, node: Mapping[str, Any], prices: PriceTable) -> NodeFacts:
        """The node's NodeFacts: GPUs from its slices on a DRA node, else from the Node alone.
        Raises NodeFactsError (a bad slice of the node, slices gpupack cannot map, garbage in the Node)."""
        name = node_name(node)
        self.nodes[name] = node
        if name in self._gpus and name not in self._stale:  # a heartbeat: the slices are as they were read
            return dra_node_facts(node, self._gpus[name], prices)
        self._stale.discard(name)
        self._forget_devices(name)
        bad = next((why for _, (n, why) in sorted(self._bad_slices.items()) if n == name), None)
        if bad is not None:
            raise NodeFactsError(name, "ResourceSlices", bad)
        gpus = gpus_of_node(name, (self._slices[s] for s in self._by_node.get(name, ())))
        if gpus is None:
            return facts_from_node(node, prices)
        facts = dra_node_facts(node, gpus, prices)
        self._gpus[name] = gpus
        for key, slot in gpus.slots.items():
            self._where[key] = (name, slot)
        for key in gpus.tainted:
            self._holder.setdefault(key, TAINT)
        return facts

    def serves(self, node: str, request: PodRequest, extended_claim: str | None) -> bool:
        """A bound pod's GPU request is served by a ResourceClaim, not by a device plugin (KEP-5004): the node is
        a DRA node and the pod names its claim (`status.extendedResourceClaimStatus`), or the Node advertises
        none of the requested resources while a DeviceClass backs each of them."""
        if request.kind not in (Kind.WHOLE, Kind.MIG) or node not in self._gpus:
            return False
        if extended_claim is not None:
            return True
        names = _resource_names(request)
        allocatable = _allocatable(self.nodes.get(node) or {})
        return not (names & allocatable) and names <= set(self._classes.values())

    # ------------------------------------------------------------------ events
    def apply(self, event: DraUpserted | DraDeleted) -> tuple[set[str], set[str]]:
        """Apply one DRA event: (nodes whose facts must be read again, nodes where capacity was freed)."""
        rebuild: set[str] = set()
        freed: set[str] = set()
        if event.kind == "ResourceSlice":
            rebuild = self._slice_event(event)
        elif event.kind == "ResourceClaim":
            rebuild, freed = self._claim_event(event)
        elif event.kind == "DeviceClass":
            self._class_event(event)
        self._stale |= rebuild
        return rebuild, freed

    def _slice_event(self, event: DraUpserted | DraDeleted) -> set[str]:
        if isinstance(event, DraDeleted):
            return self._slice_deleted(event.key)
        name = event.key
        nodes = self._drop_slice(name)
        try:
            piece = read_slice(event.obj)
        except DraError as exc:
            node = _node_named(event.obj)
            self._tell(name, f"{exc}; {f'node {node} is unusable' if node else 'ignored'}")
            if node:  # a node whose GPUs gpupack cannot see must not look empty
                self._bad_slices[name] = (node, str(exc))
                nodes.add(node)
            return nodes
        self._told.discard(name)
        self._slices[name] = piece
        if piece.node:
            self._by_node.setdefault(piece.node, set()).add(name)
            nodes.add(piece.node)
        return nodes

    def _slice_deleted(self, name: str) -> set[str]:
        if self._claims_a_device_of(name):
            self._gone.add(name)  # kept until no claim holds its devices
            return set()
        return self._drop_slice(name)

    def _claims_a_device_of(self, name: str) -> bool:
        piece = self._slices.get(name)
        return piece is not None and any(
            self._holder.get((piece.driver, piece.pool, d.name), TAINT) != TAINT for d in piece.devices
        )

    def _drop_slice(self, name: str) -> set[str]:
        """Forget a slice; the nodes it was published for."""
        self._gone.discard(name)
        nodes = {self._bad_slices.pop(name, ("", ""))[0]} - {""}
        piece = self._slices.pop(name, None)
        if piece is not None and piece.node:
            names = self._by_node.get(piece.node, set())
            names.discard(name)
            if not names:
                self._by_node.pop(piece.node, None)
            nodes.add(piece.node)
        return nodes

    def _claim_event(self, event: DraUpserted | DraDeleted) -> tuple[set[str], set[str]]:
        key = event.key
        old = self._claims.pop(key, None)
        if isinstance(event, DraUpserted):
            try:
                self._claims[key] = read_claim(event.obj)
                self._told.discard(key)
            except DraError as exc:
                self._tell(key, f"{exc}; what it held stays held")
                if old is not None:
                    self._claims[key] = old
                return set(), set()
        before, after = _devices(old), _devices(self._claims.get(key))
        freed = {self._unhold(device, key) for device in before - after} - {""}
        for device in sorted(after - before):
            if self._holder.get(device, TAINT) == TAINT:
                self._holder[device] = key
        for device in sorted(after):  # new ones, and any an earlier event could not commit (a hold was there)
            if self._holder.get(device) == key:
                self._commit(device)
        return self._release_gone(), freed

    def _class_event(self, event: DraUpserted | DraDeleted) -> None:
        if isinstance(event, DraDeleted):
            self._classes.pop(event.key, None)
            self.class_specs.pop(event.key, None)
            return
        try:
            name, resource = read_device_class(event.obj)
        except DraError as exc:
            self._tell(event.key, f"{exc}; ignored")
            return
        self._classes[name] = resource
        spec = event.obj.get("spec")
        self.class_specs[name] = spec if isinstance(spec, Mapping) else {}

    # ------------------------------------------------------------------ holding devices
    def _unhold(self, device: DeviceKey, claim: str) -> str:
        """`claim` no longer allocates `device`: another claim naming it (the API server allows none, but a
        stale view may show one) or its taint keeps it held, else it is given back; the node freed, or ""."""
        if self._holder.get(device) != claim:
            return ""
        other = next((k for k in sorted(self._claims) if device in _devices(self._claims[k])), None)
        where = self._where.get(device)
        if other is not None or (where is not None and device in self._gpus[where[0]].tainted):
            self._holder[device] = other or TAINT
            return ""
        del self._holder[device]
        return self._release(device)

    def attach(self, node: str) -> None:
        """Commit the held devices of a node just added to the inventory (before its pods take anything)."""
        gpus = self._gpus.get(node)
        for key in gpus.slots if gpus is not None else ():
            if key in self._holder:
                self._commit(key)

    def detached(self, node: str) -> None:
        """The node left the inventory, and with it what was committed there."""
        for key in self._held_on.pop(node, ()):
            del self._held[key]

    def forget_node(self, node: str) -> None:
        """The Node is deleted: forget it (its slices stay until they are deleted too)."""
        self.detached(node)
        self.nodes.pop(node, None)
        self._forget_devices(node)

    def reconcile(self, node: str) -> bool:
        """After the node's facts were read again (in place, or unchanged): each of its devices held where it now
        is, and no more what nothing holds (a taint lifted). True when capacity was given back."""
        freed = False
        for key in list(self._held_on.get(node, ())):
            where = self._where.get(key)
            if key not in self._holder or where is None or self._held[key].slots != (where[1],):
                freed = bool(self._release(key)) or freed
        self.attach(node)
        return freed

    def _forget_devices(self, node: str) -> None:
        """Forget where the node's devices were (before its slices are read again); taints go with them."""
        gpus = self._gpus.pop(node, None)
        for key in gpus.slots if gpus is not None else ():
            if self._where.get(key, ("",))[0] == node:
                del self._where[key]
            if self._holder.get(key) == TAINT:
                del self._holder[key]

    def _commit(self, key: DeviceKey) -> None:
        where = self._where.get(key)
        if key in self._held or where is None or where[0] not in self.inventory.index:
            return  # held already, or its slice (or node) is not there yet: it holds nothing until it is
        placement = Placement(where[0], (where[1],), pod_slots=0)
        try:
            self.inventory.commit(placement)
        except InventoryError as exc:
            self._tell(f"device {'/'.join(key)}", f"{self._holder.get(key) or 'a taint'} holds it but {exc}")
            return
        self._held[key] = placement
        self._held_on.setdefault(placement.node, set()).add(key)

    def _release(self, key: DeviceKey) -> str:
        """Give back a committed device; its node ("" when nothing was committed)."""
        placement = self._held.pop(key, None)
        if placement is None:
            return ""
        on_node = self._held_on.get(placement.node, set())
        on_node.discard(key)
        if not on_node:
            self._held_on.pop(placement.node, None)
        try:
            self.inventory.release(placement)
        except InventoryError:
            logger.exception("inventory out of step while releasing DRA device %s", "/".join(key))
        return placement.node

    def _release_gone(self) -> set[str]:
        """Drop the deleted slices no claim holds a device of any more; the nodes they were published for."""
        nodes: set[str] = set()
        for name in [name for name in self._gone if not self._claims_a_device_of(name)]:
            nodes |= self._drop_slice(name)
        return nodes

    def _tell(self, what: str, reason: str) -> None:
        if what not in self._told:
            self._told.add(what)
            logger.warning("DRA: %s", reason)


def _devices(claim: ClaimInfo | None) -> set[DeviceKey]:
    """The devices of NVIDIA's GPU driver a claim's allocation names."""
    if claim is None:
        return set()
    return {(d.driver, d.pool, d.device) for d in claim.devices if d.driver == DRIVER}


def _node_named(obj: Mapping[str, Any]) -> str:
    """`spec.nodeName` of a raw slice, "" when it has none gpupack can read."""
    spec = obj.get("spec")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    return node if isinstance(node, str) else ""


def _resource_names(request: PodRequest) -> set[str]:
    if request.kind == Kind.WHOLE:
        return {RESOURCE_GPU}
    return {RESOURCE_MIG_PREFIX + resource_profile(profile) for profile, _ in request.mig}


def _allocatable(node: Mapping[str, Any]) -> set[str]:
    """The resources the Node advertises (allocatable, else capacity) with a non-zero amount."""
    status = node.get("status") or {}
    resources = status.get("allocatable") or status.get("capacity") or {}
    return (
        {key for key, value in resources.items() if str(value) not in ("0", "")}
        if isinstance(resources, Mapping)
        else set()
    )
