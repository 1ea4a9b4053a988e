"""A real Kubernetes control plane on loopback, for the e2e suite and the throughput benchmark.

Which releases gpupack is tested on, where their programs come from, and the processes that run them.
"""
