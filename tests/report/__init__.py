"""Tests of gpupack report (gpupack.report)."""
