"""Ready means fast: after the warm-up no request compiles a kernel (#13: the first real /filter after
/readyz took 3–7 s with an empty numba cache, compiling the name-lookup kernels)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.extender_helpers import ROOT

# Runs in a fresh interpreter, so kernels compiled by other tests in this process cannot hide a gap.
PROBE = """
import orjson, yaml
from numba.core.registry import CPUDispatcher
from gpupack.extender.warm_up import warm_up
from gpupack.scoring import kernels
from gpupack.scoring import names as name_kernels  # `names` below is the candidates
from gpupack.extender.settings import Settings
from gpupack.kube.sources import ClusterFileSource
from gpupack.extender.state import ClusterState
from gpupack.extender.verbs import filter_body, prioritize_body

def compiled():
    return {
        f"{module.__name__}.{name}": len(kernel.signatures)
        for module in (kernels, name_kernels)
        for name, kernel in vars(module).items()
        if isinstance(kernel, CPUDispatcher)
    }

for decide_in_filter in (True, False):
    settings = Settings(decide_in_filter=decide_in_filter)
    state = ClusterState(settings)
    warm_up(state)
    after_warm_up = compiled()
    source = ClusterFileSource("manifests/examples/cluster.yaml", state.apply)
    source.start()
    names = [node["metadata"]["name"] for node in source.nodes]
    pods = [pod for pod in yaml.safe_load_all(open("manifests/examples/pods.yaml")) if pod]
    for number, pod in enumerate(pods):
        pod["metadata"].update(namespace="default", uid=f"probe-{number}")
        body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": [*names, "no-such-node"]})
        filter_body(state, settings, body)
        prioritize_body(state, body)
    grown = {name: n for name, n in compiled().items() if n != after_warm_up[name]}
    assert not grown, f"compiled after the warm-up: {grown}"
print("no kernel compiled after the warm-up")
"""


@pytest.mark.slow
def test_no_kernel_compiles_after_the_warm_up() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no kernel compiled after the warm-up" in done.stdout
