"""Kernel speed of two trees side by side, for old-vs-new comparisons (bench/results/kernel-*-ab.md).

    python bench/kernel_ab.py OLD_TREE NEW_TREE [ROUNDS]   # the trees alternate, ROUNDS each (default 3)
    python bench/kernel_ab.py TREE                         # one tree, one round: one JSON line

A TREE is a checkout of gpupack (e.g. `git archive COMMIT | tar -x -C DIR`); it is imported as the
`gpupack` package through a folder of links that maps its top-level folders as pyproject.toml does,
ahead of the installed (editable) gpupack, and each round runs in a fresh interpreter.

For 1,000 and 5,000 busy nodes and two policies: µs per `Engine.decide` when the memo holds (the same
request again), when the request shape alternates (whole GPUs, then shares), and on a cold engine; the
fastest of 40 repeats per round. Two trees: the median over the rounds per tree, and new / old.
Times are the CPU time of the deciding thread (`time.thread_time`), not wall time: on a shared machine
the time other processes hold the cores is then not counted (their cache traffic still is).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported at run time inside decide_times, from the tree under test
    from gpupack.scoring.engine import Engine
    from gpupack.scoring.request import PodRequest

COLUMNS = ("memo hit", "shape changed", "share changed", "cold engine")


def package_view(tree: str, into: Path) -> Path:
    """A folder holding `gpupack/` as the tree's installed layout would, made of links into the tree.

    The components are the tree's own (its pyproject.toml's package-dir), so trees of different layouts compare.
    """
    source = Path(tree).resolve()
    package = into / "gpupack"
    package.mkdir(parents=True)
    for entry in (source / "gpupack").iterdir():
        (package / entry.name).symlink_to(entry)
    folders = tomllib.loads((source / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for name, folder in folders.items():
        if name != "gpupack":
            (package / name.removeprefix("gpupack.")).symlink_to(source / folder)
    return into


def decide_times(view: str) -> dict[str, list[float]]:
    """µs per decision by "nodes policy": (memo hit, shape changed, share changed, cold engine)."""
    sys.path.insert(0, view)
    import gpupack.bench.speed as speed
    from gpupack.scoring import policies
    from gpupack.scoring.engine import Engine
    from gpupack.scoring.request import Kind, PodRequest

    assert speed.__file__.startswith(view), f"imported {speed.__file__}, not the tree's code"
    same, alternating = [speed.POD_REQUEST], [speed.OTHER_REQUEST, speed.POD_REQUEST]
    shares = [PodRequest(4000, 16 << 30, Kind.SHARE, milli=250), PodRequest(4000, 16 << 30, Kind.SHARE, milli=500)]
    times: dict[str, list[float]] = {}
    for count in (1000, 5000):
        inventory = speed.busy_inventory(count)
        for name in ("gpupack", "best-fit"):
            spec = policies.gpupack() if name == "gpupack" else policies.baseline(name)
            engine = Engine(inventory, spec)
            engine.decide(speed.POD_REQUEST)
            engine.decide(shares[0])
            calls = 100 if count == 1000 else 40
            memo = min(_per_decision(engine, same, calls) for _ in range(40))
            changed = min(_per_decision(engine, alternating, calls) for _ in range(40))
            shared = min(_per_decision(engine, shares, calls) for _ in range(40))
            cold = min(_per_decision(Engine(inventory, spec), same, 1) for _ in range(8))
            times[f"{count} {name}"] = [round(memo, 2), round(changed, 2), round(shared, 2), round(cold, 1)]
    return times


def _per_decision(engine: Engine, requests: Sequence[PodRequest], calls: int) -> float:
    """CPU µs of this thread per `engine.decide`, over `calls` decisions cycling through `requests`."""
    started = time.thread_time()
    for i in range(calls):
        engine.decide(requests[i % len(requests)])
    return (time.thread_time() - started) / calls * 1e6


def one_round(view: Path) -> dict[str, list[float]]:
    """decide_times of one tree, in a fresh interpreter (its numba cache is the tree's own)."""
    out = subprocess.run(
        [sys.executable, __file__, "--view", str(view)], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def compare(old: str, new: str, rounds: int) -> str:
    """Markdown table: the median per tree over `rounds` alternating rounds, and new / old."""
    with tempfile.TemporaryDirectory() as tmp:
        views = [package_view(old, Path(tmp, "old")), package_view(new, Path(tmp, "new"))]
        for view in views:
            one_round(view)  # compiles (or loads) each tree's kernels before anything is timed
        runs: list[list[dict[str, list[float]]]] = [[], []]
        for _ in range(rounds):
            for side, view in enumerate(views):
                runs[side].append(one_round(view))
    lines = [f"| nodes, policy | {' | '.join(f'{c} old → new' for c in COLUMNS)} |", "|---" * (len(COLUMNS) + 1) + "|"]
    for key in runs[0][0]:
        cells = []
        for column in range(len(COLUMNS)):
            before = statistics.median(run[key][column] for run in runs[0])
            after = statistics.median(run[key][column] for run in runs[1])
            cells.append(f"{before:g} → {after:g} ({after / before:.2f})")
        lines.append(f"| {key} | {' | '.join(cells)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1] == "--view":
        print(json.dumps(decide_times(sys.argv[2])))
    elif len(sys.argv) == 2:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(one_round(package_view(sys.argv[1], Path(tmp)))))
    else:
        print(compare(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 3))
