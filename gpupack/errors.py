"""The base of every error gpupack raises on purpose (#17): `except GpupackError` catches them all.

Each error keeps its own name and message and also derives from the builtin it always was
(`RequestError` is still a `ValueError`), so existing handlers keep working. This module imports
nothing, so that `gpupack.scoring` can use it without importing the extender.
"""


class GpupackError(Exception):
    """An error gpupack raises on purpose, with a message meant for the person who reads it."""
