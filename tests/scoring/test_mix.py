"""LearnedMix: what it learns, and that a refresh moving only weights keeps the kernel's type layout."""

from __future__ import annotations

import numpy as np

from gpupack.scoring.inventory import Inventory
from gpupack.scoring.mix import LearnedMix, TaskType, default_prior
from gpupack.scoring.request import Kind, PodRequest

ONE_GPU = PodRequest(4000, 16 << 30, Kind.WHOLE, gpus=1)
QUARTER = PodRequest(1000, 4 << 30, Kind.SHARE, milli=250)


def test_types_keep_their_first_seen_order_while_weights_move() -> None:
    mix = LearnedMix(default_prior(), refresh_every=8, coverage=1.0)  # every type stays: only weights move
    for _ in range(8):
        mix.observe(ONE_GPU)
    learned = TaskType.of(ONE_GPU)
    types_before = list(mix.types)
    assert types_before[-1] == learned  # new shapes come after the prior
    weights_before = mix.weights.copy()
    for _ in range(8):
        mix.observe(ONE_GPU)
    assert mix.types == types_before  # the same set in the same order ...
    assert mix.weights[-1] / mix.weights.sum() > weights_before[-1] / weights_before.sum()  # ... heavier

    models = Inventory().models
    layout_before = mix.arrays(models, 4)[1:]
    for _ in range(8):
        mix.observe(ONE_GPU)
    assert all(np.array_equal(a, b) for a, b in zip(layout_before, mix.arrays(models, 4)[1:], strict=True))


def test_a_shape_that_dominates_crowds_the_rarest_prior_types_out() -> None:
    mix = LearnedMix(default_prior(), refresh_every=1, half_life=50)
    for _ in range(400):
        mix.observe(QUARTER)
    current, weights = mix.current()
    assert TaskType.of(QUARTER) in current
    assert weights[current.index(TaskType.of(QUARTER))] > 0.9
    assert len(current) < len(default_prior()) + 1
