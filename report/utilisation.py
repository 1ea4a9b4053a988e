"""Allocated but idle GPUs, from NVIDIA DCGM exporter's utilisation series in Prometheus (#16 item 4).

dcgm-exporter publishes `DCGM_FI_DEV_GPU_UTIL` (percent) per GPU, or per MIG instance, with labels
`gpu`, `UUID`, `device`, `modelName`, `Hostname` and, for GPUs a pod holds (from the kubelet's
pod-resources API), `namespace`, `pod` and `container` (MIG: also `GPU_I_ID`, `GPU_I_PROFILE`).
Scraped through a Service, Prometheus renames those three to `exported_namespace`, `exported_pod`
and `exported_container` unless `honorLabels` is set: both spellings are read. A series with a pod
of a pod the report sees holding GPUs is an allocated GPU (others, such as the exporter's own pod
name on a GPU nobody holds, are only counted); it is idle when its average over the window is under
the threshold.

Any workload may publish series of that name (#26 low: a tenant's own exporter made a busy GPU look
idle). So `--dcgm-selector` (label matchers such as `job="nvidia-dcgm-exporter"`) narrows the query to
the real exporter; a series whose `Hostname` is not the node of the pod it names is ignored (counted);
and where several series name one pod's GPU, the busiest counts: a second, idle-looking series cannot
hide real work.
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from gpupack.errors import GpupackError

UTILISATION_METRIC = "DCGM_FI_DEV_GPU_UTIL"
TIMEOUT_SECONDS = 30.0  # the whole answer, not each read: a server that drips bytes is cut off too
# A Prometheus answer larger than this is refused before it is parsed (a 150 MB one took 1.6 GB of
# memory): the DCGM series of even a very large cluster are a few MB.
MAX_ANSWER_BYTES = 64 << 20
READ_CHUNK = 1 << 16
_WINDOW = re.compile(r"[0-9]+(ms|s|m|h|d|w|y)")
_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*'
_SELECTOR = re.compile(rf"({_MATCHER}(,{_MATCHER})*)?")  # label matchers only: nothing else reaches PromQL


class UtilisationError(GpupackError, ValueError):
    """Prometheus could not be asked, or answered something unusable; says which and why."""


def idle_gpus(
    prometheus: str, window: str, idle_below_pct: float, pods: Sequence[Mapping[str, Any]], selector: str = ""
) -> dict[str, Any]:
    """Allocated GPUs whose average utilisation over `window` is under `idle_below_pct`, by pod and
    namespace; `pods` are the report's pods (`pod` "namespace/name", `node`), for the nodes; `selector`:
    label matchers the DCGM series must also match."""
    if not _WINDOW.fullmatch(window):
        raise UtilisationError(f"--window {window!r} is not a Prometheus duration such as 30m, 1h or 7d")
    if not _SELECTOR.fullmatch(selector):
        raise UtilisationError(f'--dcgm-selector {selector[:100]!r} is not label matchers such as job="dcgm-exporter"')
    series = query(prometheus, f"avg_over_time({UTILISATION_METRIC}{{{selector}}}[{window}])")
    gpu_pods = {str(p["pod"]): str(p["node"]) for p in pods if p["gpus"] > 0}
    busiest, unknown, elsewhere = _busiest_per_gpu(series, gpu_pods)
    idle: list[dict[str, Any]] = [
        {"namespace": key.split("/", 1)[0], "pod": key.split("/", 1)[1], "node": gpu_pods[key], "gpu": gpu,
         "utilisation_pct": round(value, 2)}
        for (key, gpu, _), value in busiest.items()
        if value < idle_below_pct
    ]  # fmt: skip
    idle.sort(key=lambda g: (g["namespace"], g["pod"], g["gpu"]))
    by_namespace: dict[str, int] = {}
    for gpu_row in idle:
        by_namespace[gpu_row["namespace"]] = by_namespace.get(gpu_row["namespace"], 0) + 1
    return {
        "prometheus": prometheus,
        "window": window,
        "selector": selector,
        "idle_below_pct": idle_below_pct,
        "allocated_gpus_seen": len(busiest),
        "series_of_other_pods": unknown,
        "series_from_other_nodes": elsewhere,
        "idle_gpus": idle,
        "idle_by_namespace": dict(sorted(by_namespace.items())),
    }


def _busiest_per_gpu(
    series: Sequence[tuple[dict[str, str], float]], gpu_pods: Mapping[str, str]
) -> tuple[dict[tuple[str, str, str], float], int, int]:
    """(pod, GPU, instance) -> the highest value among its series; series of other pods; series whose
    Hostname is not the pod's node."""
    busiest: dict[tuple[str, str, str], float] = {}
    unknown = elsewhere = 0
    for labels, value in series:
        key = _pod_of(labels)
        if key not in gpu_pods:
            unknown += bool(key)  # a pod gpupack does not see holding a GPU (or the exporter's own)
            continue
        if labels.get("Hostname", gpu_pods[key]) != gpu_pods[key]:
            elsewhere += 1
            continue
        gpu = (key, _gpu_name(labels), labels.get("GPU_I_ID", ""))
        busiest[gpu] = max(value, busiest.get(gpu, value))
    return busiest, unknown, elsewhere


def query(prometheus: str, promql: str) -> list[tuple[dict[str, str], float]]:
    """An instant vector query: (labels, value) per series. Raises UtilisationError."""
    url = prometheus.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    if not url.startswith(("http://", "https://")):
        raise UtilisationError(f"--prometheus {prometheus!r} is not an http(s) URL")
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as answer:
            text = _read_bounded(answer, prometheus)
        body = json.loads(text)
    except UtilisationError:
        raise
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise UtilisationError(f"cannot query Prometheus at {prometheus}: {exc}") from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict) or body.get("status") != "success" or data.get("resultType") != "vector":
        raise UtilisationError(f"Prometheus at {prometheus} answered {str(body)[:200]}")
    out = []
    for item in data.get("result") or []:
        try:
            out.append(({str(k): str(v) for k, v in item["metric"].items()}, float(item["value"][1])))
        except (KeyError, IndexError, TypeError, ValueError):
            raise UtilisationError(f"Prometheus at {prometheus}: a malformed series {str(item)[:200]}") from None
    return out


def _read_bounded(answer: http.client.HTTPResponse, prometheus: str) -> bytes:
    """The answer's body, within MAX_ANSWER_BYTES and TIMEOUT_SECONDS overall; UtilisationError past either."""
    deadline = time.monotonic() + TIMEOUT_SECONDS
    chunks: list[bytes] = []
    size = 0
    while chunk := answer.read1(READ_CHUNK):  # what has arrived: read() would wait for a whole chunk
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise UtilisationError(f"Prometheus at {prometheus} answered more than {MAX_ANSWER_BYTES >> 20} MiB")
        if time.monotonic() > deadline:
            raise UtilisationError(f"Prometheus at {prometheus} did not answer within {TIMEOUT_SECONDS:g} s")
        chunks.append(chunk)
    return b"".join(chunks)


def _pod_of(labels: Mapping[str, str]) -> str:
    """`namespace/pod` of a series ("" without a pod); the exported_ spelling wins: when Prometheus
    renamed the exporter's labels, the plain ones are the scrape target's (the exporter pod)."""
    if "exported_pod" in labels:
        return f"{labels.get('exported_namespace', '')}/{labels['exported_pod']}"
    pod = labels.get("pod", "")
    return f"{labels.get('namespace', '')}/{pod}" if pod else ""


def _gpu_name(labels: Mapping[str, str]) -> str:
    """`0`, or `0 3g.40gb` for a MIG instance."""
    gpu = labels.get("gpu", "?")
    profile = labels.get("GPU_I_PROFILE")
    return f"{gpu} {profile}" if profile else gpu
