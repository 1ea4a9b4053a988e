"""Submission orders for the simulator: the FGD (ATC'23) standard protocol, plain replay, and order files."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from gpupack.sim.workload import TraceError, TracePod, gpu_milli_demand, gpu_milli_per_gpu, gpu_milli_total

TUNED_SUFFIX = re.compile(r"^(?P<base>.+)-tuned-(?P<k>\d+)$")


def tuned_name(name: str, k: int) -> str:
    """Name of the k-th (0-based) resampled copy of pod `name`, as the Go simulator names it."""
    return f"{name}-tuned-{k}"


def fgd_order(
    pods: list[TracePod],
    total_gpu_milli_capacity: int,
    seed: int,
    ratio: float = 1.3,
    go_quirk: bool = True,
) -> list[TracePod]:
    """The standard FGD protocol's submission order: shuffle, then tune total GPU demand to `ratio`.

    Follows the published Go simulator (kubernetes-scheduler-simulator, Simulate()):

    1. The pods are sorted by name (stable), then shuffled uniformly. Sorting first makes the result
       independent of the file order, as in Go.
    2. target = ratio × total_gpu_milli_capacity; demand is `gpu_milli_total` (num_gpu × gpu_milli).
    3. Demand above target: remove a uniformly random pod of the shuffled list, repeatedly, until demand
       ≤ target (the remaining pods keep their shuffled order). Nothing is appended afterwards, so the
       result may end up to one pod below the target.
    4. Otherwise, demand below target: repeatedly draw a pod uniformly WITH replacement from the
       NAME-SORTED original list (CPU-only pods may be drawn), clone it as "<name>-tuned-<k>" (k = 0, 1,
       ... in append order) and append it AFTER all the shuffled originals, in draw order.
       - `go_quirk=True` (default, Go-compatible): stop, without appending, at the first drawn pod for which
         demand + its PER-GPU milli (the `gpu_milli` column, 1000 for a whole-GPU pod) would exceed the
         target. The stop test thus ignores `num_gpu`: a multi-GPU clone can overshoot the target by up to
         (num_gpu − 1) × 1000, and the final demand may also stay up to one GPU below the target.
       - `go_quirk=False` (the README's wording, "append pods until total GPU demand reaches 130 %, without
         overshooting by more than one pod"): append every drawn pod and stop as soon as demand ≥ target,
         so target ≤ final demand < target + the last pod's total demand.
       If no original pod asks for GPU, nothing is appended (the target can never be reached).

    Randomness comes from `numpy.random.default_rng(seed)`: the same seed gives the same order, but it
    cannot reproduce Go's math/rand stream, so the order differs from the Go simulator's for the same seed.
    For an exact side-by-side comparison replay the Go order with `read_order_file`.
    """
    if ratio <= 0:
        raise ValueError(f"ratio must be positive, got {ratio}")
    if total_gpu_milli_capacity < 0:
        raise ValueError(f"GPU capacity must not be negative, got {total_gpu_milli_capacity}")
    rng = np.random.default_rng(seed)
    originals = sorted(pods, key=lambda pod: pod.name)
    order = [originals[i] for i in rng.permutation(len(originals))]
    target = ratio * total_gpu_milli_capacity
    demand = gpu_milli_demand(order)

    if demand > target:  # tune down; never followed by tuning up, as in Go
        while demand > target and order:
            removed = order.pop(int(rng.integers(len(order))))
            demand -= gpu_milli_total(removed)
    elif demand < target and any(gpu_milli_total(pod) for pod in originals):
        k = 0
        while True:
            drawn = originals[int(rng.integers(len(originals)))]
            if go_quirk and demand + gpu_milli_per_gpu(drawn) > target:
                break
            order.append(drawn.clone(tuned_name(drawn.name, k)))
            k += 1
            demand += gpu_milli_total(drawn)
            if not go_quirk and demand >= target:
                break
    return order


def replay_order(pods: list[TracePod]) -> list[TracePod]:
    """File order, each pod once, no inflation."""
    return list(pods)


def read_order_file(path: str | Path, pods: list[TracePod]) -> list[TracePod]:
    """The submission order in an order file (e.g. the Go simulator's `default_seed42_order.txt`).

    One pod name per line; blank lines and lines starting with '#' are skipped. A name of a trace pod is
    that pod; otherwise `<name>-tuned-<k>` is a copy of trace pod `<name>` under that name. Unknown names
    and repeated entries raise TraceError naming the file and line.
    """
    path = Path(path)
    by_name = {pod.name: pod for pod in pods}
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    order: list[TracePod] = []
    seen: set[str] = set()
    for line_no, raw in enumerate(text.splitlines(), start=1):
        name = raw.strip()
        if not name or name.startswith("#"):
            continue
        if name in seen:
            raise TraceError(f"{path}:{line_no}: {name!r} appears twice")
        seen.add(name)
        pod = by_name.get(name)
        if pod is None:
            match = TUNED_SUFFIX.match(name)
            base = by_name.get(match["base"]) if match else None
            if base is None:
                raise TraceError(
                    f"{path}:{line_no}: {name!r} is not a pod of the trace nor a -tuned- copy of one"
                )
            pod = base.clone(name)
        order.append(pod)
    return order
