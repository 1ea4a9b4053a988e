"""`gpupack topology [FILE]`: print a node's `gpupack.io/gpu-topology` value (docs/contracts.md#gpupack-topology)."""

from __future__ import annotations

import argparse
import sys

from gpupack.agent.topology import TopologyTextError, parse_topo_matrix

EXIT_UNREADABLE = 2


def run(args: argparse.Namespace) -> int:
    """Read `nvidia-smi topo -m` text from args.file (or standard input) and print one JSON object."""
    try:
        if args.file in (None, "-"):
            raw = sys.stdin.buffer.read()
        else:
            with open(args.file, "rb") as handle:
                raw = handle.read()
        topology = parse_topo_matrix(raw.decode("utf-8", errors="replace"))
    except (OSError, TopologyTextError) as exc:
        print(f"gpupack topology: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    print(topology.to_annotation())
    return 0
