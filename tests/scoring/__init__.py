"""Tests of the scoring core."""
