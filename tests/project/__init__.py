"""Tests of the repository as a whole: components, layers, packaging, docs and manifests."""
