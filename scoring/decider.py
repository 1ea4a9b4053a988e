"""The one decider: where a pod goes, as the service, the simulator and the report all decide it.

`Decider` owns the engine, its policy and the source of what a decision takes besides the inventory
and the request: the order that breaks ties between equally scored nodes, and the noise with which
the `random` policy picks a GPU. Everything outside `scoring` decides through it (only benchmarks of
the raw kernel time `Engine.decide` itself), so a policy behaves the same wherever it runs:

- a policy whose ties are FIXED (every one but `random`) breaks them by a fixed node order: inventory
  row order (`FixedOrder.INVENTORY`: the service, the report's drains), or a permutation of the nodes
  drawn from the generator when the decider is made (`FixedOrder.SEEDED`: the simulator; the ATC'23
  simulator orders nodes by seeded random names, and its results are reproduced with that order);
- a PER_POD policy (`random`) gets a fresh node permutation for every decision, and the `random`
  policy fresh noise per node, drawn in that order from the same generator.

`Decider.seeded` (the simulator's) seeds the generator with the run's seed; its draws are the seeded
order, then per decision the permutation (PER_POD) and the noise (random policy), so a run is
reproduced by its seed. The service's generator is unseeded (docs/contracts.md#cli).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import numpy as np

from gpupack.scoring.engine import Decision, Engine
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.layout import P_RANDOM
from gpupack.scoring.policies import PolicySpec, TieBreak
from gpupack.scoring.request import PodRequest

Candidates = Sequence[str] | np.ndarray | None  # node names, a mask over inventory rows, or every node


class FixedOrder(StrEnum):
    """The node order that breaks ties for a policy whose tie-break is FIXED."""

    INVENTORY = "inventory"  # inventory row order (the engine's default)
    SEEDED = "seeded"  # a permutation of the rows drawn once from the decider's generator


class Decider:
    """One policy deciding over one inventory: learns the request, draws the tie order and noise, and
    runs the engine over each candidate set in turn. Nothing is committed."""

    def __init__(
        self,
        inventory: Inventory,
        policy: PolicySpec,
        rng: np.random.Generator | None = None,
        fixed_order: FixedOrder = FixedOrder.INVENTORY,
    ) -> None:
        """`rng` (default: a fresh unseeded generator) draws every tie order and noise of this decider;
        it is `self.rng`, which a caller may replace to draw from another from then on."""
        self.engine = Engine(inventory, policy)
        self.rng = rng if rng is not None else np.random.default_rng()
        self._seeded_rank: np.ndarray | None = None
        if fixed_order == FixedOrder.SEEDED:
            self._seeded_rank = self.rng.permutation(inventory.size).astype(np.int64)

    @classmethod
    def seeded(cls, inventory: Inventory, policy: PolicySpec, seed: int | None) -> Decider:
        """The simulator's decider: generator seeded with `seed` (None: 0), ties in a seeded node order.
        Make it once every node is in `inventory`: nodes added later tie after the others."""
        rng = np.random.default_rng(seed if seed is not None else 0)
        return cls(inventory, policy, rng, FixedOrder.SEEDED)

    @property
    def policy(self) -> PolicySpec:
        """The policy the engine runs."""
        return self.engine.policy

    @property
    def inventory(self) -> Inventory:
        """The inventory decided over (the caller commits and releases placements in it)."""
        return self.engine.inventory

    def observe(self, request: PodRequest) -> None:
        """Tell a learning policy about a request it is asked to place (others ignore it)."""
        self.engine.observe(request)

    def decide(
        self, request: PodRequest, fallbacks: Sequence[Candidates] = (None,), *, observe: bool = True
    ) -> Decision:
        """Where `request` goes: among the nodes of each candidate set in `fallbacks` in turn (None: every
        node) until one places it; the last set's decision when none does.

        `observe`: the policy learns the request first (callers that learn each pod once pass False).
        One tie order and one noise are drawn for the request, shared by its fallbacks.
        """
        if not fallbacks:
            raise ValueError("decide: fallbacks holds no candidate set")
        if observe:
            self.engine.observe(request)
        rank, noise = self._draw()
        for candidates in fallbacks:
            if isinstance(candidates, str):
                raise TypeError(f"decide: fallbacks holds candidate sets, not node names: pass ([{candidates!r}],)")
            decision = self.engine.decide(request, candidates, rank=rank, noise=noise)
            if decision.placement is not None:
                break
        return decision

    def look(self, request: PodRequest, candidates: Candidates = None) -> Decision:
        """Where `request` would go among `candidates`, without learning it or drawing from the
        generator: ties in the fixed node order, no noise. For probes (does a pod fit anywhere?) that
        must not change the decisions that follow."""
        return self.engine.decide(request, candidates, rank=self._fixed_rank(), noise=None)

    def _draw(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(tie order, noise) of one decision; None: the engine's default (row order, no noise).
        The permutation is drawn before the noise (the simulator's runs depend on this order)."""
        policy = self.policy
        n = self.inventory.size
        fixed = policy.tie_break == TieBreak.FIXED
        rank = self._fixed_rank() if fixed else self.rng.permutation(n).astype(np.int64)
        noise = self.rng.random(n) if policy.kernel_id == P_RANDOM else None
        return rank, noise

    def _fixed_rank(self) -> np.ndarray | None:
        """The seeded order (rows added since it was drawn tie last, in row order), or None: row order."""
        rank = self._seeded_rank
        if rank is None:
            return None
        n = self.inventory.size
        if len(rank) < n:
            rank = self._seeded_rank = np.concatenate([rank, np.arange(len(rank), n, dtype=np.int64)])
        return rank
