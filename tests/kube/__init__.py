"""Tests of the Kubernetes object layer (gpupack.kube)."""
