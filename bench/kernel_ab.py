"""One tree's kernel speed, for old-vs-new comparisons run alternately (bench/results/kernel-split-ab.md).

    python bench/kernel_ab.py TREE     # TREE: a checkout of gpupack; prints one JSON line

For 1,000 and 5,000 busy nodes and two policies: µs per `Engine.decide` when the memo holds (the same
request again), when the request shape alternates, and on a cold engine; the fastest of 40 repeats.
"""

from __future__ import annotations

import json
import sys
import time


def decide_times(tree: str) -> dict[str, tuple[float, float, float]]:
    """(memo hit, shape changed, cold engine) µs per decision, by "nodes policy", with `tree`'s code."""
    sys.path.insert(0, tree)
    import gpupack.bench.speed as speed
    from gpupack.scoring import policies
    from gpupack.scoring.engine import Engine

    assert speed.__file__.startswith(tree), "imported another tree's code"
    same, alternating = [speed.POD_REQUEST], [speed.OTHER_REQUEST, speed.POD_REQUEST]
    times: dict[str, tuple[float, float, float]] = {}
    for count in (1000, 5000):
        inventory = speed.busy_inventory(count)
        for name in ("gpupack", "best-fit"):
            spec = policies.gpupack() if name == "gpupack" else policies.baseline(name)
            engine = Engine(inventory, spec)
            engine.decide(speed.POD_REQUEST)
            calls = 100 if count == 1000 else 40
            memo = min(_per_decision(engine, same, calls) for _ in range(40))
            changed = min(_per_decision(engine, alternating, calls) for _ in range(40))
            cold = min(_per_decision(Engine(inventory, spec), same, 1) for _ in range(8))
            times[f"{count} {name}"] = (round(memo, 2), round(changed, 2), round(cold, 1))
    return times


def _per_decision(engine: object, requests: list[object], calls: int) -> float:
    """µs per `engine.decide`, over `calls` decisions cycling through `requests`."""
    started = time.perf_counter()
    for i in range(calls):
        engine.decide(requests[i % len(requests)])  # type: ignore[attr-defined]
    return (time.perf_counter() - started) / calls * 1e6


if __name__ == "__main__":
    print(json.dumps(decide_times(sys.argv[1])))
