"""A restricted master problem: max values·x subject to A·x ≤ rhs, x ≥ 0, over the columns found so far.

Both LPs of the limit (`pattern_lp`'s bound, `node_lp`'s whole-node columns) grow one of these by column
generation; it keeps the columns, solves the LP for its row prices, and picks the best integer use of
the columns it holds.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

Column = TypeVar("Column", bound=Hashable)


class RestrictedLp(Generic[Column]):
    """The columns taken so far (a pattern each, with its coefficients and value) and the right-hand side."""

    def __init__(self, name: str, rhs: np.ndarray) -> None:
        self.name = name
        self.rhs = rhs
        self.patterns: list[Column] = []
        self.known: set[Column] = set()
        self._columns: list[np.ndarray] = []
        self._values: list[float] = []

    def take(self, pattern: Column, column: np.ndarray, value: float) -> None:
        """Add `pattern` with its coefficients in every row and the value of one use."""
        self.patterns.append(pattern)
        self.known.add(pattern)
        self._columns.append(column)
        self._values.append(float(value))

    def solve(self) -> tuple[float, np.ndarray]:
        """The LP's optimum and the row prices (duals, all ≥ 0)."""
        a, values = np.column_stack(self._columns), np.array(self._values)
        result = linprog(-values, A_ub=a, b_ub=self.rhs, bounds=(0, None), method="highs")
        if result.status != 0:
            raise RuntimeError(f"{self.name}: {result.message}")
        return -float(result.fun), -np.asarray(result.ineqlin.marginals, dtype=float)

    def integer_choice(self, seconds: float) -> dict[Column, int]:
        """How often to use each column: HiGHS's best integer answer within `seconds`; empty if none."""
        a, values = np.column_stack(self._columns), np.array(self._values)
        result = milp(
            -values, constraints=LinearConstraint(a, -np.inf, self.rhs), integrality=np.ones(len(values)),
            bounds=Bounds(0, np.inf), options={"time_limit": seconds, "mip_rel_gap": 1e-5},
        )  # fmt: skip
        if result.x is None:
            return {}
        return {p: int(n) for p, n in zip(self.patterns, np.rint(result.x).astype(int), strict=True) if n > 0}
