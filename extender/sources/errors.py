"""Errors raised by cluster sources."""


class SourceError(ValueError):
    """A cluster source cannot be set up: malformed cluster file, missing Kubernetes config, ..."""
