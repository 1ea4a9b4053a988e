"""The MIG churn script of the real-scheduler comparison (#30), and its replay in the simulator.

`tests/e2e/dra_churn.py` plays a seed's script through the real kube-scheduler: arrivals of pods asking one
MIG profile of an H100 through a ResourceClaimTemplate, and departures of earlier arrivals. Here is that
script, and `replay`, which places the same script with the simulator's state code: gpupack's arm through
`Decider` with the policy `gpupack serve` runs by default (the DRA path decides without feeding the mix,
`observe=False`, as `extender.dra_plan` does), upstream's through `sim.dra_churn.FirstFit` (kube-scheduler's
node score, random among ties, then the allocator's first fit in published order). A replay is how the
real run's size and length were chosen on seeds 0-41 without spending hours of control plane on each
candidate: `python -m gpupack.sim.dra_script --seeds 0-41 --draws 5` prints, per rig, how often gpupack
rejected fewer claims than upstream's draws.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gpupack.scoring.decider import Decider
from gpupack.scoring.facts import MigMode, Placement
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.policies import GpupackArgs, gpupack
from gpupack.scoring.request import Kind, PodRequest
from gpupack.sim.dra_churn import FirstFit
from gpupack.sim.scenarios import H100, ClusterSpec, NodeSpec
from gpupack.sim.simulate import build_inventory

PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
MIX = (0.45, 0.15, 0.15, 0.10, 0.15)  # how often an arrival asks each of PROFILES
SLICES = {"1g.10gb": 1, "2g.20gb": 2, "3g.40gb": 3, "4g.40gb": 4, "7g.80gb": 7}  # compute slices of each
TARGET = 0.9  # the script keeps what it holds under this share of the compute slices, so rejections are
# what fragmentation costs, not a full cluster
POD_CPU_MILLI, POD_MEMORY = 100, 128 << 20  # what each pod of the real run asks (`dra_cluster.claim_pod`)
NODE_CPU_MILLI, NODE_MEMORY = 32_000, 256 << 30  # what each fake node of the real run has


@dataclass(frozen=True)
class Rig:
    """The fake H100 nodes of a run: `nodes` of `gpus` GPUs each, in DynamicMIG."""

    nodes: int
    gpus: int

    @property
    def compute_slices(self) -> int:
        return self.nodes * self.gpus * 7

    def __str__(self) -> str:
        return f"{self.nodes} nodes x {self.gpus} H100"


@dataclass(frozen=True)
class Event:
    """Arrival `arrival` (its pod asks `profile`), or its departure."""

    arrival: int
    profile: str
    departs: bool = False

    @property
    def pod(self) -> str:
        return f"a{self.arrival:03d}-{self.profile.replace('.', '-')}"


def churn_events(seed: int, events: int, rig: Rig) -> list[Event]:
    """The seed's script: each event is an arrival drawn from MIX, unless with it the pods the script holds
    would ask more than TARGET of the rig's compute slices: then a random one of them departs (a departure
    of an arrival that the arm rejected is a no-op there)."""
    rng = random.Random(seed)
    room = TARGET * rig.compute_slices
    script: list[Event] = []
    live: list[Event] = []
    arrivals = 0
    next_profile = rng.choices(PROFILES, MIX)[0]
    for _ in range(events):
        if live and sum(SLICES[e.profile] for e in live) + SLICES[next_profile] > room:
            leaving = live.pop(rng.randrange(len(live)))
            script.append(Event(leaving.arrival, leaving.profile, departs=True))
            continue
        event = Event(arrivals, next_profile)
        arrivals += 1
        script.append(event)
        live.append(event)
        next_profile = rng.choices(PROFILES, MIX)[0]
    return script


def rig_inventory(rig: Rig) -> Inventory:
    """The rig's nodes, empty, in the simulator's state."""
    node = NodeSpec(H100, rig.nodes, rig.gpus, NODE_CPU_MILLI, NODE_MEMORY, mig=MigMode.DYNAMIC)
    return build_inventory(ClusterSpec("dra-e2e", (node,)).build())


def _placer(arm: str, inventory: Inventory, draw: int) -> Callable[[PodRequest], Placement | None]:
    if arm == "gpupack":
        decider = Decider(inventory, gpupack(GpupackArgs()))
        return lambda request: decider.decide(request, observe=False).placement
    if arm == "upstream":
        return FirstFit(inventory, np.random.default_rng(draw)).place
    raise ValueError(f"arm must be gpupack or upstream, not {arm!r}")


def replay(arm: str, script: Sequence[Event], rig: Rig, draw: int = 0) -> int:
    """Claims `arm` rejects over `script` on `rig` (no retry); `draw` seeds upstream's choice among tied nodes."""
    inventory = rig_inventory(rig)
    place = _placer(arm, inventory, draw)
    held: dict[int, Placement] = {}
    rejected = 0
    for event in script:
        if event.departs:
            if (placement := held.pop(event.arrival, None)) is not None:
                inventory.release(placement)
            continue
        placement = place(PodRequest(POD_CPU_MILLI, POD_MEMORY, Kind.MIG, mig=((event.profile, 1),)))
        if placement is None:
            rejected += 1
        else:
            inventory.commit(placement)
            held[event.arrival] = placement
    return rejected


@dataclass
class Tally:
    """gpupack against upstream's draws over seeds: rejected claims and (seed, draw) pairs won, tied, lost."""

    gpupack: int = 0
    upstream: float = 0.0  # mean over the draws
    wins: int = 0
    ties: int = 0
    losses: int = 0

    def line(self, rig: Rig, events: int) -> str:
        return (
            f"{rig}, {events} events: rejected gpupack {self.gpupack}, upstream {self.upstream:.1f} (mean of draws); "
            f"gpupack fewer / equal / more on {self.wins} / {self.ties} / {self.losses} (seed, draw) pairs"
        )


def tally(rig: Rig, events: int, seeds: Sequence[int], draws: int) -> Tally:
    """gpupack's replay against `draws` upstream replays of each seed's script."""
    result = Tally()
    for seed in seeds:
        script = churn_events(seed, events, rig)
        mine = replay("gpupack", script, rig)
        theirs = [replay("upstream", script, rig, 1000 * seed + draw) for draw in range(draws)]
        result.gpupack += mine
        result.upstream += sum(theirs) / draws
        result.wins += sum(mine < t for t in theirs)
        result.ties += sum(mine == t for t in theirs)
        result.losses += sum(mine > t for t in theirs)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gpupack.sim.dra_script", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-41", help="FIRST-LAST")
    parser.add_argument("--draws", type=int, default=5, help="upstream replays per seed (its node ties are random)")
    parser.add_argument("--rigs", default="2x4:200,4x8:300", help="NODESxGPUS:EVENTS, comma-separated")
    args = parser.parse_args(argv)
    first, _, last = args.seeds.partition("-")
    seeds = range(int(first), int(last or first) + 1)
    for spec in args.rigs.split(","):
        size, _, events = spec.partition(":")
        nodes, _, gpus = size.partition("x")
        rig = Rig(int(nodes), int(gpus))
        print(tally(rig, int(events), seeds, args.draws).line(rig, int(events)), flush=True)


if __name__ == "__main__":
    main()
