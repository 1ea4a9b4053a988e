"""`bench.tune`'s table: each variant against fgd, and against `base` when it runs."""

from __future__ import annotations

import json

from gpupack.bench.tune import cache_key, report
from gpupack.scoring.policies import GpupackWeights

Table = dict[tuple[str, str], dict[int, float | None]]


def test_a_variant_is_compared_with_fgd_and_with_base() -> None:
    seeds = range(8)
    table: Table = {
        ("t", "fgd"): {s: 5.0 for s in seeds},
        ("t", "base"): {s: 4.0 + 0.01 * s for s in seeds},  # below fgd on every seed
        ("t", "new"): {s: 4.5 for s in seeds},  # below fgd, above base, on every seed
    }
    lines = report(table, ["t"], ["fgd", "base", "new"]).splitlines()
    assert lines[0].split()[-5:] == ["p", "vs", "base", "W/L/T", "p"]
    base_line = next(line for line in lines if line.startswith("t ") and " base " in line)
    new_line = next(line for line in lines if line.startswith("t ") and " new " in line)
    assert base_line.split()[2:6] == ["4.035", "-0.96", "8/0/0", "0.008"]  # against fgd; no base column
    assert new_line.split()[2:9] == ["4.500", "-0.50", "8/0/0", "0.008", "+0.46", "0/8/0", "0.008"]


def test_without_base_only_fgd_is_compared() -> None:
    table: Table = {("t", "fgd"): {0: 5.0, 1: 5.0}, ("t", "new"): {0: 4.0, 1: 6.0}}
    lines = report(table, ["t"], ["fgd", "new"]).splitlines()
    assert "vs base" not in lines[0]
    assert next(line for line in lines if " new " in line).split()[2:] == ["5.000", "+0.00", "1/1/0", "1.000"]


def test_the_cache_key_follows_the_arguments_as_they_resolve() -> None:
    order = GpupackWeights().order
    defaults = cache_key("default", "base", "{}", 0)
    assert cache_key("default", "v", json.dumps({"weights": {"order": order}}), 0) == defaults
    assert cache_key("default", "v", json.dumps({"weights": {"order": order + 1}}), 0) != defaults
    assert cache_key("default", "base", "{}", 1) != defaults
    assert cache_key("default", "fgd", "{}", 0) != defaults
