"""Errors raised by cluster sources."""

from gpupack.errors import GpupackError


class SourceError(GpupackError, ValueError):
    """A cluster source cannot be set up: malformed cluster file, missing Kubernetes config, ..."""
