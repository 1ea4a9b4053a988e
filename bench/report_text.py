"""REPORT.md: the bench's prose around the tables of `bench.sections` (every number comes from the run)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpupack.bench.markdown import Table, bullet_list
from gpupack.bench.sections import Section


def seeds_text(seeds: Sequence[int]) -> str:
    """`42–51` for a run of consecutive seeds, else `42, 44`."""
    seeds = list(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}–{seeds[-1]}"
    return ", ".join(map(str, seeds))


def cluster_table(rows: Sequence[Mapping[str, object]]) -> Table:
    """The node groups of a scenario cluster."""
    table = Table(["GPU product", "nodes", "GPUs per node", "cores", "memory GiB", "MIG", "spot", "$/h"])
    for r in rows:
        table.add(
            r["product"],
            r["nodes"],
            r["gpus"],
            r["cpu_cores"],
            r["memory_gib"],
            r["mig"],
            r["spot"],  # type: ignore[arg-type]
            r["hourly_cost"],
        )  # type: ignore[arg-type]
    return table


def _images(section: Section) -> str:
    return "\n".join(f"![{name}]({name})" for name in section.plots)


def _tables(section: Section, *names: str) -> str:
    return "\n\n".join(section.tables[name].markdown() for name in names if name in section.tables)


def render(
    config: Mapping[str, object],
    info: Mapping[str, object],
    sections: Mapping[str, Section],
    clusters: Mapping[str, Sequence[Mapping[str, object]]],
) -> str:
    """The whole report."""
    openb, mig, nvlink, cost, speed = (sections[k] for k in ("openb", "mig", "nvlink", "cost", "speed"))
    not_better = [line for s in sections.values() for line in s.not_better]
    better = [line for s in sections.values() for line in s.better]
    scale = config["scale"]
    parts = [
        f"# gpupack bench report ({config['label']} run)",
        f"- date: {info['date']}; commit `{info['commit']}`\n"
        f"- machine: {info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB RAM, Python {info['python']}\n"
        f"- wall time: simulations {info['simulation_seconds']} s on {config['workers']} worker processes, "
        f"speed benchmarks {info['speed_seconds']} s, total {info['total_seconds']} s\n"
        f"- seeds: openb {seeds_text(config['openb_seeds'])}; "  # type: ignore[arg-type]
        f"MIG / NVLink / cost {seeds_text(config['scenario_seeds'])}; "  # type: ignore[arg-type]
        f"scenario clusters at {scale} x their full node counts\n"
        "- every number below comes from this run; `results.json` beside this file holds them all (per seed).",
        "## Where gpupack is not better than a baseline\n\n"
        "Every comparison of gpupack against a baseline on a headline metric in which gpupack is worse or equal "
        "(the ones where it is better are listed at the end).\n\n" + bullet_list(not_better),
        "## 1. openb (Alibaba GPU trace, FGD protocol)\n\n"
        "Cluster: `openb_node_list_gpu_node.csv`"
        + (f" (first {config['openb_node_limit']} nodes only)" if config["openb_node_limit"] else "")
        + ". Protocol `fgd`: shuffle with the seed, inflate to 130 % of GPU capacity, submit one pod at a time, "
        "drop failures. Cells: median unallocated GPU % at arrived = 100 % (lower is better); `paper` columns: "
        "the published FGD-paper figures (ATC'23, median of 10 seeds; from the trace README). Our seeds shuffle "
        "with numpy, not Go's math/rand, so orders differ from the paper's. The first seed of each "
        "(trace, policy) runs to 130 % for the curves; later seeds stop at arrived = 100 % (the value read is the "
        "same). `fgd` is given the trace's workload mix in advance (oracle); gpupack learns it online.\n\n"
        + _tables(openb, "openb_unallocated")
        + "\n\nSimulator time per run (seconds of one worker; first seeds run to 130 %, later ones to 100 %):\n\n"
        + _tables(openb, "openb_seconds")
        + "\n\n"
        + _images(openb),
        "## 2. MIG (dynamic MIG vs static partitions)\n\n"
        "Cluster (dynamic MIG on every MIG-capable GPU):\n\n" + cluster_table(clusters["mig"]).markdown() + "\n\n"
        "Workload: the openb default trace, fgd protocol (ordered and inflated by the trace's milli demand), each "
        "share turned into the smallest 80 GB-family profile with ≥ ⌈milli × 7 / 1000⌉ compute slices "
        "(`bench.simulate.share_to_mig`; CPU and memory kept); whole-GPU pods stay whole GPUs. 80 GB-family "
        "profiles do not exist on the A30, so A30s only take whole-GPU pods. `static-balanced (best-fit)`: the same "
        "nodes in static MIG mode, every GPU pre-partitioned as mig-parted's all-balanced (80 GB: 2g.20gb@0, "
        "1g.10gb@2, 1g.10gb@3, 3g.40gb@4; A30: 2g.12gb@0, 1g.6gb@2, 1g.6gb@3), scheduled by best-fit; no GPU is "
        "whole there, so whole-GPU pods and 4g/7g profiles cannot run at all. Allocation = compute slices in use "
        "(a whole GPU counts all of its slices) over all compute slices. Stranded = at the end of the run, GPUs "
        "with free compute on which none of the failed profiles (nor, for failed whole-GPU pods, a whole GPU) "
        "fits, as % of all GPUs. Why the dynamic policies end close together here: openb's shares are large "
        "(most become 4g.40gb or 7g.80gb, which have one placement per GPU), so there is little placement "
        "choice left for a fragmentation-aware policy to win; the failures are capacity, not geometry.\n\n"
        + _tables(mig, "mig", "mig_failed_by_profile") + "\n\n" + _images(mig),
        "## 3. NVLink (multi-GPU sets)\n\n"
        "Cluster: NVSwitch H100 nodes (every pair 18 links), DGX-1 V100 hybrid cube-mesh nodes (1–2 links per "
        "pair, 16 pairs), A100 PCIe 4-GPU nodes with NVLink bridges on (0, 1) and (2, 3) (12 links); NUMA: first "
        "half of the GPUs on node 0.\n\n" + cluster_table(clusters["nvlink"]).markdown() + "\n\n"
        "Workload: `openb_pod_list_multigpu20.csv`, fgd protocol. `all pairs NVLinked`: placed multi-GPU pods "
        "whose GPUs are pairwise joined by NVLink. `link score vs best free set`: the chosen set's pair score "
        "(100 per link + 20 same NUMA / 10 across, as `scoring.kernels.pair_score`) over the best score of any "
        "set of that size free on the chosen node just before the commit (mean over pods). "
        "`kube-default` takes the lowest free indices; `+besteffort` picks sets go-gpuallocator style.\n\n"
        + _tables(nvlink, "nvlink")
        + "\n\n"
        + _images(nvlink),
        "## 4. Cost (on-demand and spot)\n\n"
        "Cluster (spot at ~35 % of on-demand):\n\n" + cluster_table(clusters["cost"]).markdown() + "\n\n"
        "Workload: openb default pods (qos BE = interruptible), fgd protocol with the inflation ratio set to the "
        "load (1.0: one pass up to 100 % of GPU capacity, as specified; 0.6: a part-loaded cluster, where idle "
        "nodes could scale to zero). Busy nodes: nodes holding at least one pod at the end of the run; their "
        "hourly cost is what the cluster costs if the rest scale to zero.\n\n"
        "Read the cost columns with the spot columns: gpupack keeps pods that are not interruptible off spot "
        "nodes unless little else fits (DESIGN.md §2), so those pods need on-demand nodes, which cost about "
        "three times as much; best-fit and kube-default ignore capacity type and put about half of them on "
        "spot. `gpupack[spot_avoid=0]` is gpupack without that rule, to tell the price of the rule from the price "
        "of the packing.\n\n"
        + _tables(cost, "cost")
        + "\n\n"
        + _images(cost),
        "## 5. Speed\n\n"
        "Kernel: one 1-GPU pod decided on N nodes x 8 H100-like GPUs with random allocations, numba engine "
        "(`Engine.decide`) vs plain-Python reference (`scoring.reference.reference_decide`); mean of "
        f"{config['kernel_calls']} numba calls; the reference gets {config['reference_calls']} calls at 1,000 nodes "
        "and proportionally fewer (at least one) on larger clusters. `numba ms` is warm: the engine's per-node "
        "memo holds every node's verdict and score, as in the extender, where kube-scheduler sends the same "
        "candidates pod after pod and a decision changes one node; `shape changed`: each call asks for another "
        "shape than the one before, so every node is scored again from its cached sums; `numba cold ms` is the "
        "first decision of a fresh engine, which reads every node in full. `reference / numba` compares with "
        "`shape changed`, where both score every node.\n\n"
        + _tables(speed, "speed_kernel")
        + "\n\nHTTP: `POST /filter` over loopback to `gpupack serve --cluster-file` running as a process of "
        "its own, exactly as users run it (default config, decision log lines included, sent to /dev/null), from "
        "a keep-alive httpx client in another process (kube-scheduler is a process of its own too). The servers "
        "run at the same time and are measured in 3 alternating rounds, each after 20 unmeasured requests, so a "
        "slow spell of this shared 2-core VM falls on all; p50 and p99 are over all of a server's requests, and "
        "`/ bare` divides them by the bare handler's. NodeNames = nodeCacheCapable true; Nodes = false, the Node "
        "objects in the body. Each request lists the candidates in a fresh random order, as kube-scheduler does "
        "(its filter checks nodes in parallel and lists them as they finish), so nothing keyed on the candidate "
        "list is reused between calls. Each request is a new 1-GPU pod: filter reserves one GPU for it and the "
        "reservation is kept (the cluster has 8 GPUs per node, far more than the requests). `bare FastAPI` = a "
        "FastAPI handler that reads the same body and answers a constant (70 bytes), in its own process under "
        "the same uvicorn config. gpupack answers the chosen node in NodeNames and the candidates that cannot "
        "take the pod in FailedNodes with their reasons (here every node fits, so none); `gpupack, "
        "reportNotChosen` also names every other feasible candidate (`gpupack chose another node`), about 200 "
        "KiB at 5,000 nodes, which kube-scheduler drops once a node is chosen.\n\n"
        + _tables(speed, "speed_http") + "\n\n" + _images(speed),
        "## Where gpupack is better than a baseline\n\n" + bullet_list(better),
    ]
    return "\n\n".join(parts) + "\n"
