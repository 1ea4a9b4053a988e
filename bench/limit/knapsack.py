"""The pricing problems of the pattern LP: integer knapsacks small enough for plain dynamic programming.

Both are unbounded (an item may be taken any number of times): a pattern that takes more pods of a shape
than arrived is still a feasible node or GPU, and the LP's demand rows keep the totals within the counts.
"""

from __future__ import annotations

from collections.abc import Sequence

EPSILON = 1e-9


def best_fill(sizes: Sequence[int], values: Sequence[float], capacity: int) -> tuple[float, list[int]]:
    """The most valuable multiset of items with total size ≤ `capacity`: (value, count of each item).

    Items of value ≤ 0 are never taken; with none worth taking the answer is (0.0, all zeros).
    """
    if len(sizes) != len(values):
        raise ValueError("sizes and values differ in length")
    if any(size <= 0 for size in sizes):
        raise ValueError("every item needs a positive size")
    best = [0.0] * (capacity + 1)  # best[c]: the most value within total size c
    last = [-1] * (capacity + 1)  # the item added last on the way to best[c], -1: none
    for room in range(1, capacity + 1):
        best[room], last[room] = best[room - 1], -1
        for item, (size, value) in enumerate(zip(sizes, values, strict=True)):
            if size <= room and value > EPSILON and best[room - size] + value > best[room] + EPSILON:
                best[room], last[room] = best[room - size] + value, item
    return best[capacity], _counts(sizes, last, capacity)


def _counts(sizes: Sequence[int], last: Sequence[int], room: int) -> list[int]:
    """Walk the `last` choices back from `room` into a count per item."""
    counts = [0] * len(sizes)
    while room > 0:
        if last[room] < 0:
            room -= 1
        else:
            counts[last[room]] += 1
            room -= sizes[last[room]]
    return counts
