"""Paired-seed comparisons: is gpupack better than a baseline, or is the difference inside seed noise?

Both policies run on the same seeds (the same submission order), so each seed gives one paired
difference. A difference counts as a win or a loss only when the exact two-sided sign test over the
seeds gives p < `SIGNIFICANCE` (seeds with equal values, to `EQUAL` in the metric's units, dropped);
anything else is a tie. With 10 seeds that means at least 9 wins of 10 (or 8 of 8 with 2 equal): a
lead of 0.01 on a median is a tie unless it holds on nearly every seed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SIGNIFICANCE = 0.05
EQUAL = 0.005  # per-seed values closer than this are equal (the report shows 2 decimals)

PerSeed = Mapping[int, float | None]


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign-test p-value of `wins` against `losses` (1.0 when there are none)."""
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1)) / 2**n
    return min(1.0, 2 * tail)


def spread(values: Iterable[float | None]) -> float | None:
    """Interquartile range of the per-seed values (p75 − p25, inclusive method), 2 decimals."""
    present = sorted(v for v in values if v is not None)
    if len(present) < 2:
        return 0.0 if present else None
    low, _, high = statistics.quantiles(present, n=4, method="inclusive")
    return round(high - low, 2)


@dataclass(frozen=True)
class Paired:
    """gpupack against one baseline on the seeds both ran: per-seed differences (gpupack − baseline)."""

    diffs: tuple[float, ...]
    wins: int
    losses: int
    ties: int
    p_value: float

    @property
    def median_diff(self) -> float:
        return round(statistics.median(self.diffs), 2) if self.diffs else 0.0

    @property
    def low(self) -> float:
        return round(min(self.diffs), 2) if self.diffs else 0.0

    @property
    def high(self) -> float:
        return round(max(self.diffs), 2) if self.diffs else 0.0

    @property
    def verdict(self) -> str:
        """`better`, `worse` or `tie` (inside the seed noise)."""
        if self.p_value >= SIGNIFICANCE:
            return "tie"
        return "better" if self.wins > self.losses else "worse"

    def counts(self) -> str:
        """`wins/losses/ties`, e.g. `9/1/0`."""
        return f"{self.wins}/{self.losses}/{self.ties}"

    def describe(self, unit: str = "") -> str:
        """The paired evidence in words, for a finding line."""
        seeds = len(self.diffs)
        return (
            f"paired over {seeds} seed{'s' * (seeds != 1)}: median difference {self.median_diff:+.2f}{unit} "
            f"(range {self.low:+.2f} to {self.high:+.2f}), gpupack better on {self.wins}, worse on "
            f"{self.losses}, equal on {self.ties}; sign test p = {self.p_value:.3g}"
        )


def paired(mine: PerSeed, theirs: PerSeed, higher_is_better: bool) -> Paired:
    """Compare gpupack's per-seed values with a baseline's on the seeds both have."""
    both = [(m, t) for s in sorted(mine) if (m := mine[s]) is not None and (t := theirs.get(s)) is not None]
    diffs = tuple(float(m) - float(t) for m, t in both)
    gains = [d if higher_is_better else -d for d in diffs]
    wins = sum(1 for g in gains if g >= EQUAL)
    losses = sum(1 for g in gains if g <= -EQUAL)
    return Paired(diffs, wins, losses, len(gains) - wins - losses, sign_test(wins, losses))
