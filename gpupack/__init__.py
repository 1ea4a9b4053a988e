"""gpupack: a GPU-aware kube-scheduler extender, its node agent, simulator and benchmark.

One distribution namespace. The folders the design names stay at the top of the repository and are
mapped in pyproject.toml: `gpupack.extender` (HTTP service), `gpupack.scoring` (pure computation),
`gpupack.agent` (node agent), `gpupack.bench` (simulator and benchmark; needs the `bench` extra).
"""
