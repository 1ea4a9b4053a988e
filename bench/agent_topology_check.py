"""Real-GPU check (#14): the topology `gpupack agent` reads through NVML equals `gpupack topology` on
`nvidia-smi topo -m` from the same machine. Read-only: it never changes MIG mode or creates instances.

    python bench/agent_topology_check.py [OUT_DIR]

Prints one JSON object (and writes it, with the raw `topo -m` bytes, to OUT_DIR): the machine, both
topologies, what NVML reported underneath (link kinds, NUMA sources), and whether they match.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupack.agent.nvml_topology import read_topology
from gpupack.agent.real_nvml import RealNvml
from gpupack.agent.topology import parse_topo_matrix


def main(out_dir: Path | None) -> int:
    """Compare, report, exit 0 when both readings agree."""
    raw = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, check=True).stdout
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    driver = subprocess.run(query, capture_output=True, text=True, check=True).stdout.split()[0]
    from_text = parse_topo_matrix(raw.decode("utf-8", errors="replace"))
    with RealNvml() as nvml:
        gpus = nvml.gpus()
        from_nvml = read_topology(nvml)
        underneath = [
            {
                "index": gpu.index,
                "name": gpu.name,
                "bus_id": gpu.bus_id,
                "mig_enabled": nvml.mig_enabled(gpu.index),
                "active_nvlinks_by_remote_type": _by_type(nvml, gpu.index),
                "numa_sysfs_or_nvml": nvml.numa_node(gpu.index),
                "numa_of_cpu_affinity": list(nvml.cpu_affinity_numa_nodes(gpu.index)),
            }
            for gpu in gpus
        ]
    report = {
        "machine": {
            "host": platform.node(),
            "driver": driver,
            "gpus": len(gpus),
            "products": sorted({g.name for g in gpus}),
        },
        "topo_m": from_text.to_json(),
        "nvml": from_nvml.to_json(),
        "nvml_underneath": underneath,
        "nvlink_matches": from_text.nvlink == from_nvml.nvlink,
        "numa_matches": from_text.numa == from_nvml.numa,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "agent_topology_check.json").write_text(text + "\n")
        (out_dir / "topo-m.txt").write_bytes(raw)
    return 0 if report["nvlink_matches"] and report["numa_matches"] else 1


def _by_type(nvml: RealNvml, gpu: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for link in nvml.nvlinks(gpu):
        key = {0: "gpu", 1: "ibmnpu", 2: "switch"}.get(link.remote_type, str(link.remote_type))
        counts[key] = counts.get(key, 0) + 1
    return counts


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
