"""Tests of the extender service (gpupack.extender)."""
