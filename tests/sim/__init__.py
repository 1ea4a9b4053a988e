"""Tests of the simulator library (gpupack.sim)."""
