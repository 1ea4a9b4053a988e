"""REPORT.md: the bench's prose around the tables of `bench.sections` (every number comes from the run).

Numbers in the prose are read from the run's tables, the cluster specs or the bench's own settings;
the soak section is a separate run and says where it came from.
"""

from __future__ import annotations

import statistics
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from gpupack.bench import speed
from gpupack.bench.markdown import Table, bullet_list
from gpupack.bench.openb_report import TUNING
from gpupack.bench.paired import SIGNIFICANCE
from gpupack.bench.sections import Section
from gpupack.sim.churn import FAMILY_PROFILES, FAMILY_SHARE, INFERENCE_SIZES, ChurnConfig

Config = Mapping[str, Any]  # the run's config as asdict gives it (JSON-like)
HEADINGS = {
    "openb": "## 1. openb (Alibaba GPU traces, FGD protocol)",
    "churn": "## 2. MIG with churn (pods arrive and complete)",
    "mig": "## 3. MIG, no departures (dynamic MIG vs static partitions)",
    "nvlink": "## 4. NVLink (multi-GPU sets)",
    "cost": "## 5. Cost (on-demand and spot)",
    "speed": "## 6. Speed",
}
Clusters = Mapping[str, Sequence[Mapping[str, Any]]]


def seeds_text(seeds: Sequence[int]) -> str:
    """`42–51` for a run of consecutive seeds, else `42, 44`."""
    seeds = list(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}–{seeds[-1]}"
    return ", ".join(map(str, seeds))


def cluster_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """The node groups of a scenario cluster."""
    table = Table(["GPU product", "nodes", "GPUs per node", "cores", "memory GiB", "MIG", "spot", "$/h"])
    for r in rows:
        table.add(r["product"], r["nodes"], r["gpus"], r["cpu_cores"], r["memory_gib"], r["mig"], r["spot"],
                  r["hourly_cost"])  # fmt: skip
    return table


def _images(section: Section) -> str:
    return "\n".join(f"![{name}]({name})" for name in section.plots)


def _tables(section: Section, *names: str) -> str:
    return "\n\n".join(section.tables[name].markdown() for name in names if name in section.tables)


def render(config: Config, info: Mapping[str, object], sections: Mapping[str, Section], clusters: Clusters) -> str:
    """The whole report."""
    not_better = [line for s in sections.values() for line in s.not_better]
    better = [line for s in sections.values() for line in s.better]
    parts = [
        _header(config, info),
        "## Where gpupack is not better than a baseline\n\n"
        "Every comparison of gpupack against a baseline on a headline metric in which gpupack is worse or tied "
        f"(the ones where it is better are listed at the end). Each pairs the two policies seed by seed (same "
        f"submission order); it is called better or worse only when the sign test over the seeds gives "
        f"p < {SIGNIFICANCE}, otherwise it is a tie (`bench.paired`).\n\n" + bullet_list(not_better),
        *[_body(name, config, sections, clusters) for name in HEADINGS],
        "## Where gpupack is better than a baseline\n\n" + bullet_list(better),
    ]
    return "\n\n".join(parts) + "\n"


def _body(name: str, config: Config, sections: Mapping[str, Section], clusters: Clusters) -> str:
    """Section `name`, or a line saying it was not run (`gpupack bench --only`)."""
    if name not in sections:
        ran = ",".join(n for n in HEADINGS if n in sections)
        return (f"{HEADINGS[name]}\n\nNot run in this run (`gpupack bench --only {ran}`); the last report that "
                "ran it is in this file's git history.")  # fmt: skip
    section = sections[name]
    if name == "openb":
        return _openb(config, section)
    if name == "speed":
        return _speed(config, section)
    body = {"churn": _churn, "mig": _mig, "nvlink": _nvlink, "cost": _cost}[name]
    return body(section, clusters[name])


def _header(config: Config, info: Mapping[str, object]) -> str:
    return (
        f"# gpupack bench report ({config['label']} run)\n\n"
        f"- date: {info['date']}; commit `{info['commit']}`\n"
        f"- machine: {info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB RAM, Python {info['python']}\n"
        f"- wall time: simulations {info['simulation_seconds']} s on {config['workers']} worker processes, "
        f"speed benchmarks {info['speed_seconds']} s, total {info['total_seconds']} s; "
        f"{info.get('runs_from_cache', 0)} of {info.get('simulation_runs', '?')} simulation runs read back from "
        "a cache of earlier runs of the same code (`--cache`)\n"
        f"- seeds: openb {seeds_text(config['openb_seeds'])}; "
        f"churn / MIG / NVLink / cost {seeds_text(config['scenario_seeds'])}; "
        f"scenario clusters at {config['scale']} x their full node counts\n"
        f"- tuning: {TUNING}\n"
        "- every number of sections 1–6 comes from this run; `results.json` beside this file holds them all (per "
        "seed). The sections after them, when present, are separate runs that name their own command, machine, "
        "date and commit."
    )


LIMIT_TEXT = (
    "The physical limit (`bench.limit`, docs/limit.md): for the pods each seed has seen by arrived = 100 %, "
    "a pattern LP over node types (column generation, HiGHS through SciPy) bounds from below the unallocated "
    "GPU % that any placement of them could reach, online or offline. `limit` is the median bound; `offline "
    "packing` an achievable offline placement of the same pods built from the LP's patterns and committed pod "
    "by pod to the simulator's inventory (run where listed); `<policy> gap` the median over seeds of the "
    "policy's figure minus the same seed's bound (points of unallocated GPU %; 0 would be perfect)."
)


def _openb(config: Config, openb: Section) -> str:
    limit = config["openb_node_limit"]
    return (
        f"{HEADINGS['openb']}\n\n"
        "Cluster: `openb_node_list_gpu_node.csv`" + (f" (first {limit} nodes only)" if limit else "") + "; "
        "every pod list of the trace folder. Protocol `fgd`: shuffle with the seed, inflate to 130 % of GPU "
        "capacity, submit one pod at a time, drop failures. Cells: unallocated GPU % at arrived = 100 % (lower "
        "is better). `fgd` is given each trace's workload mix in advance (oracle); gpupack learns it online "
        "(where its weights come from: the header). Our seeds shuffle with numpy, not Go's math/rand, so orders "
        "differ from the paper's. The first seed of each (trace, policy) runs to 130 % for the curves; later "
        "seeds stop at arrived = 100 % (the value read is the same).\n\n"
        "gpupack against fgd, per trace (IQR: the seed spread, p75 − p25; the paired columns take gpupack − fgd "
        "seed by seed; `verdict` is the sign test's):\n\n" + _tables(openb, "openb_vs_fgd")
        + "\n\nEvery policy, median:\n\n" + _tables(openb, "openb_unallocated")
        + "\n\n" + LIMIT_TEXT + "\n\n" + _tables(openb, "openb_limit")
        + "\n\nThe limit seed by seed (with gpupack and fgd):\n\n" + _tables(openb, "openb_limit_seeds")
        + "\n\nEvery policy, seed spread (IQR):\n\n" + _tables(openb, "openb_spread")
        + "\n\nThe published figures (ATC'23, median of 10 seeds; from the trace README):\n\n"
        + _tables(openb, "openb_paper")
        + "\n\nSimulator time per run (wall seconds of one worker, and the CPU seconds of its process, which "
        "other work on the machine does not inflate; first seeds run to 130 %, later ones to 100 %):\n\n"
        + _tables(openb, "openb_seconds") + "\n\n" + _images(openb)
    )  # fmt: skip


def _churn(churn: Section, cluster: Sequence[Mapping[str, Any]]) -> str:
    defaults = ChurnConfig()
    sizes = ", ".join(f"{size}g {round(100 * weight)} %" for size, weight in INFERENCE_SIZES)
    families = "; ".join(
        f"{round(100 * share)} % ask for {'/'.join(FAMILY_PROFILES[f].values())}" for f, share in FAMILY_SHARE.items()
    )
    return (
        f"{HEADINGS['churn']}\n\n"
        "Cluster (dynamic MIG on every GPU):\n\n" + cluster_table(cluster).markdown() + "\n\n"
        f"Workload (`sim.churn`, protocol `churn`): inference-style MIG pods, by compute size {sizes}; "
        f"{families} (80 GB profiles run on A100 and H100, the others on H200). Poisson arrivals; exponential "
        f"lifetimes whose mean makes the offered load {defaults.load} x the GPU capacity. The first "
        f"{defaults.warmup:g} mean lifetimes fill the cluster and are not counted; the next {defaults.measure:g} "
        f"are, sampled {defaults.samples} times. A pod that fits nowhere is rejected. Stranded GPUs: GPUs with "
        "free compute on which no profile still to come in the run fits. `placeable % of time`: share of the "
        "samples at which one more instance of that profile would have been placed. Same command: `gpupack "
        "simulate --protocol churn --nodes N.yaml --pods P.yaml` (write them with `python -m "
        "gpupack.sim.churn nodes|pods`).\n\n"
        + _tables(churn, "churn", "churn_per_seed", "churn_rejected_by_profile") + "\n\n" + _images(churn)
    )  # fmt: skip


def _mig(mig: Section, cluster: Sequence[Mapping[str, Any]]) -> str:
    return (
        f"{HEADINGS['mig']}\n\n"
        "Cluster (dynamic MIG on every MIG-capable GPU):\n\n" + cluster_table(cluster).markdown() + "\n\n"
        "Workload: the openb default trace, fgd protocol (ordered and inflated by the trace's milli demand), each "
        "share turned into the smallest 80 GB-family profile with ≥ ⌈milli × 7 / 1000⌉ compute slices "
        "(`sim.simulate.share_to_mig`; CPU and memory kept); whole-GPU pods stay whole GPUs. 80 GB-family "
        "profiles do not exist on the A30, so A30s only take whole-GPU pods. `static-balanced (best-fit)`: the same "
        "nodes in static MIG mode, every GPU pre-partitioned as mig-parted's all-balanced, scheduled by best-fit; "
        "no GPU is whole there, so whole-GPU pods and 4g/7g profiles cannot run at all. Allocation = compute slices "
        "in use over all compute slices. Stranded = at the end of the run, GPUs with free compute on which none of "
        "the failed profiles fits, as % of all GPUs. Nothing departs here, so most of openb's shares become "
        "4g.40gb or 7g.80gb, with one placement per GPU: there is little placement choice to win, which is why "
        "section 2 exists.\n\n" + _tables(mig, "mig", "mig_failed_by_profile") + "\n\n" + _images(mig)
    )


def _nvlink(nvlink: Section, cluster: Sequence[Mapping[str, Any]]) -> str:
    return (
        f"{HEADINGS['nvlink']}\n\n"
        "Cluster: NVSwitch H100 nodes, DGX-1 V100 hybrid cube-mesh nodes, A100 PCIe 4-GPU nodes with NVLink "
        "bridges on (0, 1) and (2, 3); NUMA: first half of the GPUs on node 0.\n\n"
        + cluster_table(cluster).markdown() + "\n\n"
        "Workload: `openb_pod_list_multigpu20.csv`, fgd protocol. `all pairs NVLinked`: placed multi-GPU pods "
        "whose GPUs are pairwise joined by NVLink. `link score vs best free set`: the chosen set's pair score "
        "(as `scoring.kernels.pair_score`) over the best score of any set of that size free on the chosen node "
        "just before the commit (mean over pods). `kube-default` takes the lowest free indices; `+besteffort` "
        "picks sets go-gpuallocator style.\n\n" + _tables(nvlink, "nvlink") + "\n\n" + _images(nvlink)
    )  # fmt: skip


def spot_price_ratio(cluster: Sequence[Mapping[str, Any]]) -> float | None:
    """Median spot / on-demand hourly price over the products that have both."""
    prices = {(r["product"], bool(r["spot"])): float(r["hourly_cost"]) for r in cluster if r["hourly_cost"]}
    ratios = [prices[(p, True)] / prices[(p, False)] for p, spot in prices if spot and (p, False) in prices]
    return statistics.median(ratios) if ratios else None


def _column(table: Table, name: str, row: Sequence[object]) -> object:
    return row[table.columns.index(name)] if name in table.columns else None


def _cost(cost: Section, cluster: Sequence[Mapping[str, Any]]) -> str:
    ratio = spot_price_ratio(cluster)
    table = cost.tables.get("cost") or Table([])
    rows = [row for row in table.rows if _column(table, "load (x capacity)", row) == 1.0]
    on_spot = [
        f"{_column(table, 'policy', row)} {_column(table, 'non-interruptible pods on spot %', row)} %"
        for row in rows
        if not str(_column(table, "policy", row)).startswith("gpupack")
    ]
    price = f"spot at {100 * ratio:.0f} % of on-demand" if ratio else "no spot prices"
    return (
        f"{HEADINGS['cost']}\n\n"
        f"Cluster ({price}):\n\n" + cluster_table(cluster).markdown() + "\n\n"
        "Workload: openb default pods (qos BE = interruptible), fgd protocol with the inflation ratio set to the "
        "load (1.0: one pass up to 100 % of GPU capacity; 0.6: a part-loaded cluster, where idle nodes could "
        "scale to zero). Busy nodes: nodes holding at least one pod at the end of the run; their hourly cost is "
        "what the cluster costs if the rest scale to zero.\n\n"
        "Read the cost columns with the spot columns: gpupack keeps pods that are not interruptible off spot "
        "nodes unless little else fits (docs/contracts.md#gpupackiointerruptible), so those pods need on-demand nodes"
        + (f", which cost {1 / ratio:.1f} times as much" if ratio else "")
        + ("; at load 1.0 the baselines, which ignore capacity type, put " + ", ".join(on_spot)
           + " of them on spot" if on_spot else "")
        + ". `gpupack[spot_avoid=0]` is gpupack without that rule, to tell the price of the rule from the price "
        "of the packing.\n\n" + _tables(cost, "cost") + "\n\n" + _images(cost)
    )  # fmt: skip


def _speed(config: Config, speed_section: Section) -> str:
    return (
        f"{HEADINGS['speed']}\n\n"
        "Kernel: one 1-GPU pod decided on N nodes x 8 H100-like GPUs with random allocations, numba engine "
        "(`Engine.decide`) vs plain-Python reference (`scoring.reference.reference_decide`); mean of "
        f"{config['kernel_calls']} numba calls; the reference gets {config['reference_calls']} calls at 1,000 nodes "
        "and proportionally fewer (at least one) on larger clusters. `numba ms` is warm: the engine's per-node "
        "memo holds every node's verdict and score, as in the extender, where kube-scheduler sends the same "
        "candidates pod after pod and a decision changes one node; `shape changed`: each call asks for another "
        "shape than the one before, so every node is scored again from its cached sums; `numba cold ms` is the "
        "first decision of a fresh engine. `reference / numba` compares with `shape changed`.\n\n"
        + _tables(speed_section, "speed_kernel")
        + "\n\nHTTP: `POST /filter` over loopback to `gpupack serve --cluster-file` running as a process of "
        "its own (default config, decision log lines sent to /dev/null), from a keep-alive httpx client in "
        f"another process. The servers run at the same time and are measured in {speed.HTTP_ROUNDS} alternating "
        f"rounds, each after {speed.HTTP_WARMUP} unmeasured requests; p50 and p99 are over all of a server's "
        "requests, and `/ bare` divides them by the bare handler's. NodeNames = nodeCacheCapable true; Nodes = "
        "false, the Node objects in the body. Each request lists the candidates in a fresh random order and is a "
        "new 1-GPU pod whose reservation is kept. `bare FastAPI` reads the same body and answers a constant, in "
        "its own process under the same uvicorn config. `gpupack, reportNotChosen` also names every other "
        "feasible candidate in FailedNodes, which kube-scheduler drops once a node is chosen.\n\n"
        + _tables(speed_section, "speed_http") + "\n\n" + _images(speed_section)
    )  # fmt: skip


def soak_text(out: Path, repo: Path) -> str:
    """Section 7: the soak, a separate run (`python -m gpupack.bench.soak`) whose report sits beside this one;
    its source, and the commit and date it records (or, if it records none, those of the commit that last
    changed it). Empty when there is no soak report."""
    soak = out / "soak.md"
    if not soak.exists():
        return ""
    saved = out / "soak.json"
    recorded = orjson.loads(saved.read_bytes()) if saved.exists() else {}
    commit, date = recorded.get("commit"), recorded.get("date")
    source = f"`{soak.name}` and `{saved.name}`, written by `python -m gpupack.bench.soak`"
    if commit and date:
        where = f"run on commit `{commit}` on {date}"
    else:
        last = _git(repo, "log", "-1", "--format=%H %cd", "--date=format:%Y-%m-%d %H:%M UTC", "--", str(saved))
        commit, _, date = last.partition(" ")
        where = "the run recorded no commit or date" + (
            f"; the file was last committed in `{commit}` ({date})" if last else ", and git has no record of it"
        )
    body = soak.read_text(encoding="utf-8").split("\n", 1)[1].split("```json", 1)[0]
    return f"\n## 7. Soak (a separate run: {source}; {where})\n\n{body}"


SEPARATE_RUNS = ("preemption", "gangs")  # sections 8 and 9: `python -m gpupack.bench.<name>` writes <name>.md


def separate_runs_text(out: Path) -> str:
    """Sections 8 on: the benches that run apart from `make bench` (`SEPARATE_RUNS`, #28, #29), each from the
    `<name>.md` it wrote beside this report, which says its own command, machine, date and commit. A bench
    without a report there is left out, and the sections after it move up."""
    parts = [part for name in SEPARATE_RUNS if (part := out / f"{name}.md").exists()]
    return "".join(separate_run_text(part, number) for number, part in enumerate(parts, start=8))


def separate_run_text(part: Path, number: int) -> str:
    """Section `number` from a separate bench's markdown `part`: its title as the heading, its own headings one
    level down."""
    title, _, body = part.read_text(encoding="utf-8").partition("\n")
    heading = title.removeprefix("# ")
    body = body.replace("\n## ", "\n### ")
    return f"\n## {number}. {heading} (a separate run: `{part.name}` and `{part.with_suffix('.json').name}`)\n{body}"


def _git(repo: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()
