"""Tests of the benchmarks (gpupack.bench)."""
