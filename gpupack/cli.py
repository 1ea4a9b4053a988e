"""`gpupack` command line (docs/contracts.md#cli): serve, simulate, bench, explain, topology, agent, report,
defrag."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TypeAlias

from gpupack.arguments import port_number, seed_list
from gpupack.scoring.defrag_goals import DEFAULT_MAX_EVICTIONS, Goal

# every command's --kubeconfig: the rule is kube/sources/kubeconfig.py's, kubectl's
KUBECONFIG_HELP = "kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster config)"
# the object `add_subparsers` returns: each `_<command>` adds its subcommand to it
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def build_parser(prog: str = "gpupack") -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog=prog, description="GPU-aware kube-scheduler extender")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_serve, _simulate, _bench, _explain, _topology, _report, _agent, _defrag):
        add(sub)
    return parser


def _serve(sub: Subparsers) -> None:
    """`gpupack serve`."""
    serve = sub.add_parser("serve", help="run the scheduler extender HTTP service")
    source = serve.add_mutually_exclusive_group()
    source.add_argument("--cluster-file", help="YAML/JSON list of Node and Pod objects served from memory")
    source.add_argument("--kubeconfig", help=KUBECONFIG_HELP)
    serve.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=port_number, default=None, help="listen port (default 8888)")
    serve.add_argument("--config", help="policy/service config YAML")
    serve.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    serve.add_argument("--tls-key", help="private key for --tls-cert (PEM)")


def _simulate(sub: Subparsers) -> None:
    """`gpupack simulate`."""
    simulate = sub.add_parser("simulate", help="replay a workload trace against a policy")
    simulate.add_argument("--nodes", required=True, help="openb node CSV or YAML/JSON list of Nodes")
    simulate.add_argument("--pods", required=True, help="openb pod CSV or YAML/JSON list of Pods")
    simulate.add_argument("--policy", default="gpupack", help="policy name (default gpupack)")
    simulate.add_argument("--seeds", type=seed_list, default=[42], help="e.g. 42-51 (fgd and churn protocols)")
    simulate.add_argument(
        "--protocol",
        choices=("fgd", "replay", "churn"),
        default="fgd",
        help="fgd: shuffle, inflate to 130 %%, once; replay: file order, once; churn: pods arrive and complete",
    )
    simulate.add_argument(
        "--load", type=float, default=0.9, help="churn: offered GPU demand in service / GPU capacity (default 0.9)"
    )
    simulate.add_argument("--mig", choices=("dynamic",), help="dynamic MIG on MIG-capable GPUs")
    simulate.add_argument("--order", help="fgd protocol: submit in this order (e.g. default_seed42_order.txt)")
    simulate.add_argument("--json", action="store_true", help="print one JSON object")
    simulate.add_argument("--plot", help="write a PNG: every seed's allocation curve (churn: every seed over time)")


def _bench(sub: Subparsers) -> None:
    """`gpupack bench`."""
    bench = sub.add_parser("bench", help="run the standard comparison and write a report")
    bench.add_argument("--quick", action="store_true", help="fewer seeds and smaller scenarios")
    bench.add_argument(
        "--out", help="report folder (default bench/results; with --quick a new temporary folder, printed at the end)"
    )
    bench.add_argument(
        "--throughput",
        action="store_true",
        help="only the real kube-scheduler throughput (needs etcd and the programs `make e2e` builds)",
    )
    bench.add_argument("--only", help="run only these sections, e.g. openb,churn (openb churn mig nvlink cost speed)")
    bench.add_argument("--cache", help="keep finished simulation runs in this folder and reuse them (same code)")
    bench.add_argument("--policies", help="openb: only these policies, e.g. gpupack,fgd,best-fit (default: all)")


def _explain(sub: Subparsers) -> None:
    """`gpupack explain`."""
    explain = sub.add_parser("explain", help="why a pod would go where (a live cluster, or a cluster file)")
    explain.add_argument("pod_ref", nargs="?", metavar="POD", help="NAMESPACE/NAME (or NAME) of the pod; same as --pod")
    explain.add_argument(
        "--pod", help="live cluster: NAMESPACE/NAME or NAME; with --cluster-file: a YAML/JSON file holding one Pod"
    )
    explain_source = explain.add_mutually_exclusive_group()
    explain_source.add_argument("--cluster-file", help="YAML/JSON list of Node and Pod objects instead of a cluster")
    explain_source.add_argument("--kubeconfig", help=KUBECONFIG_HELP)
    explain.add_argument("-n", "--namespace", help="namespace of a pod given as NAME (default: the context's)")
    explain.add_argument("--config", help="policy config YAML")
    explain.add_argument("--json", action="store_true", help="print JSON")


def _topology(sub: Subparsers) -> None:
    """`gpupack topology`."""
    topology = sub.add_parser("topology", help="print gpupack.io/gpu-topology from `nvidia-smi topo -m` text")
    topology.add_argument("file", nargs="?", help="the text (default: standard input)")


def _report(sub: Subparsers) -> None:
    """`gpupack report`."""
    report = sub.add_parser("report", help="cost and waste now: GPU pools, split cost, nodes that could be emptied")
    report_source = report.add_mutually_exclusive_group()
    report_source.add_argument("--cluster-file", help="YAML/JSON list of Node and Pod objects")
    report_source.add_argument("--kubeconfig", help=KUBECONFIG_HELP)
    report_source.add_argument(
        "--from-simulation", nargs=2, metavar=("NODES", "PODS"), help="simulate these files, report the end state"
    )
    report.add_argument("--policy", default="gpupack", help="--from-simulation: policy (default gpupack)")
    report.add_argument("--seed", type=int, default=42, help="--from-simulation: shuffle seed (default 42)")
    report.add_argument("--load", type=float, default=1.0, help="--from-simulation: GPU demand / capacity (1.0)")
    report.add_argument("--save-cluster", help="--from-simulation: write the end state as a cluster file")
    report.add_argument("--config", help="policy config YAML (prices by instance type), or its ConfigMap")
    report.add_argument("--by", action="append", default=[], help="also split cost by this pod label (repeat)")
    report.add_argument("--hours", type=float, default=1.0, help="window of the GPU-hours and cost (default 1)")
    report.add_argument("--prometheus", help="Prometheus URL: DCGM utilisation of the allocated GPUs")
    report.add_argument("--window", default="1h", help="--prometheus: utilisation window (default 1h)")
    report.add_argument("--idle-below", type=float, default=10.0, help="--prometheus: idle under this %% (10)")
    report.add_argument(
        "--dcgm-selector", default="", help='--prometheus: the real DCGM exporter\'s labels, e.g. job="dcgm-exporter"'
    )
    report.add_argument("--json", action="store_true", help="print one JSON object")
    report.add_argument("--html", help="also write a self-contained HTML page with plots to this file")


def _agent(sub: Subparsers) -> None:
    """`gpupack agent`."""
    agent = sub.add_parser("agent", help="run the node agent: node facts and device plugins (DaemonSet)")
    agent.add_argument("--node", help="this node's name (default: $NODE_NAME)")
    agent.add_argument("--kubeconfig", help=KUBECONFIG_HELP)
    agent.add_argument("--plugin-dir", default="/var/lib/kubelet/device-plugins", help="kubelet device-plugin folder")
    agent.add_argument(
        "--fake-nvml",
        metavar="PATH",
        help="GPU-less test clusters only: fake GPUs and MIG instances from this JSON file instead of NVML; MIG "
        "changes are written back to it (default: $GPUPACK_AGENT_FAKE_NVML; format: docs/agent.md)",
    )


def _defrag(sub: Subparsers) -> None:
    """`gpupack defrag`."""
    defrag = sub.add_parser("defrag", help="the pods to move, proven by simulation first (a dry run unless --execute)")
    source = defrag.add_mutually_exclusive_group()
    source.add_argument("--cluster-file", help="YAML/JSON list of Node and Pod objects")
    source.add_argument("--kubeconfig", help=KUBECONFIG_HELP)
    defrag.add_argument("--config", help="policy config YAML, or its ConfigMap")
    defrag.add_argument(
        "--goal", action="append", choices=[g.value for g in Goal], help="only these goals (repeat; default all)"
    )
    defrag.add_argument(
        "--max-evictions",
        type=int,
        default=DEFAULT_MAX_EVICTIONS,
        help=f"at most this many (default {DEFAULT_MAX_EVICTIONS})",
    )
    defrag.add_argument("-n", "--namespace", help="move only this namespace's pods, for its pending pods")
    defrag.add_argument("--execute", action="store_true", help="evict the planned pods (a live cluster only)")
    defrag.add_argument("--json", action="store_true", help="print one JSON object")
    loop = defrag.add_argument_group("loop", "--loop: run in the deployment, leader-elected (docs/defrag.md#the-loop)")
    loop.add_argument("--loop", action="store_true", help="plan (and with --execute, move) every --every seconds")
    loop.add_argument("--every", type=float, default=300.0, metavar="SECONDS", help="between rounds (default 300)")
    loop.add_argument("--window", type=float, default=3600.0, metavar="SECONDS", help="budget window (default 3600)")
    loop.add_argument("--window-evictions", type=int, default=8, metavar="N", help="evictions per window (default 8)")
    loop.add_argument(
        "--settle", type=float, default=300.0, metavar="SECONDS",
        help="a pending pod moved for is not planned for again within this time (default 300)",
    )  # fmt: skip
    loop.add_argument("--lease-namespace", help="the Lease's namespace (default: the pod's own)")
    loop.add_argument("--lease-name", default="gpupack-defrag", help="the Lease (default gpupack-defrag)")
    loop.add_argument("--metrics-port", type=int, default=9403, help="Prometheus metrics port (0: none; default 9403)")


def main(argv: Sequence[str] | None = None, prog: str = "gpupack") -> int:
    """Entry point of the `gpupack` console script."""
    args = build_parser(prog).parse_args(argv)
    if args.command == "serve":
        from gpupack.extender.service import serve

        return serve(args)
    if args.command == "simulate":
        from gpupack.bench.simulate_cli import run

        return run(args)
    if args.command == "bench":
        from gpupack.bench.bench_report import run as run_bench

        return run_bench(args)
    if args.command == "topology":
        from gpupack.agent.topology_cli import run as run_topology

        return run_topology(args)
    if args.command == "report":
        from gpupack.report.cli import run as run_report

        return run_report(args)
    if args.command == "defrag" and args.loop:
        from gpupack.defrag.loop_main import run_loop

        return run_loop(args)
    if args.command == "defrag":
        from gpupack.defrag.cli import run as run_defrag

        return run_defrag(args)
    if args.command == "agent":
        from gpupack.agent.main import run as run_agent

        return run_agent(args)
    from gpupack.extender.explain import run as run_explain

    return run_explain(args)


def kubectl_main() -> int:
    """Entry point of the `kubectl-gpupack` console script: kubectl runs it for `kubectl gpupack ...`
    (a kubectl plugin is any `kubectl-<name>` program on PATH), e.g. `kubectl gpupack explain ns/pod`."""
    return main(sys.argv[1:], prog="kubectl gpupack")


if __name__ == "__main__":
    sys.exit(main())
