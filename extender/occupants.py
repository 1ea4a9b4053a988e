"""The pods on a node that preemption could evict, as scoring.preemption's `Occupant`s (#28).

Built from the pod ledger (extender.pod_records.PodLife): every bound pod of the node that holds
capacity, is not already terminating and has a uid (the answer names victims by uid). A terminating
pod is leaving whatever gpupack answers, so it is no one's victim; what it holds is counted as freed
(`leaving_on`).

GPU-seconds lost if a pod is evicted: the GPUs it holds — a whole GPU 1, a share milli/1000, a MIG
instance its compute slices over its GPU's (7, or 4 on A30) — times the seconds it has run (from
status.startTime, else its creation; 0 when neither is known).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpupack.extender.pod_ledger import PodLedger
from gpupack.extender.pod_records import PodRecord
from gpupack.scoring.facts import Placement
from gpupack.scoring.geometry import SHAPES, MigFamily, resolve_profile
from gpupack.scoring.gpu_models import lookup_model
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.preemption import Occupant

Budgets = Callable[[PodRecord], bool]  # True: evicting this pod now would break a PodDisruptionBudget


def no_budgets(_: PodRecord) -> bool:
    """No PodDisruptionBudget is known to gpupack: no eviction breaks one."""
    return False


def gpus_held(placement: Placement, family: MigFamily | None) -> float:
    """The GPUs a placement holds: whole 1, share milli/1000, MIG compute slices / the GPU's compute slices."""
    total = 0.0
    for slot in placement.slots:
        if slot.mig:
            total += _mig_fraction(slot.mig, family)
        elif slot.milli:
            total += slot.milli / 1000
        else:
            total += 1.0
    return total


def _mig_fraction(profile: str, family: MigFamily | None) -> float:
    if family is not None:
        try:
            shape, _ = resolve_profile(family, profile)
        except KeyError:
            pass
        else:
            return SHAPES[shape].compute / family.compute_total
    head = profile.split("g", 1)[0]  # `3g.40gb`: 3 of 7 compute slices
    return int(head) / 7 if head.isdigit() else 1.0


def node_family(inventory: Inventory, node: str) -> MigFamily | None:
    """The MIG family of the node's GPUs (None: no MIG, or the node is unknown)."""
    row = inventory.index.get(node)
    facts = inventory.facts[row] if row is not None else None
    return lookup_model(facts.gpu_product).mig_family if facts is not None and facts.gpu_product else None


def occupants_on(
    ledger: PodLedger,
    node: str,
    *,
    besides: str = "",
    budgets: Budgets = no_budgets,
    now: float | None = None,
) -> list[Occupant]:
    """Every pod bound to `node` that holds capacity and is not terminating, but the pod `besides`."""
    now = time.time() if now is None else now
    family = node_family(ledger.inventory, node)
    occupants = []
    for record in sorted(ledger.on_node(node), key=lambda r: r.key):
        if record.placement is None or record.life.terminating or record.uid == besides:
            continue
        if record.uid == record.key:  # no metadata.uid (a hand-written object): kube-scheduler could not name it
            continue
        started = record.life.started
        ran = max(0.0, now - started) if started is not None else 0.0
        occupants.append(
            Occupant(
                uid=record.uid,
                key=record.key,
                placement=record.placement,
                priority=record.life.priority,
                interruptible=record.life.interruptible,
                breaks_budget=budgets(record),
                gpu_seconds=gpus_held(record.placement, family) * ran,
            )
        )
    return occupants


def leaving_on(ledger: PodLedger, node: str) -> list[Placement]:
    """What the terminating pods of `node` still hold: free once they are gone, whatever preemption does."""
    return [
        record.placement for record in ledger.on_node(node) if record.placement is not None and record.life.terminating
    ]
