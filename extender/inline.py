"""Which decisions may run on the event loop: light ones only (#13 item 8).

A filter or prioritize call with a small body runs on the event loop while the state's lock is free
(extender.app): a fraction of a millisecond, less than the hop to a worker thread. But the body's
size says nothing of the decision's cost: a pod asking 56 MIG instances took ~0.8 s per filter at
5,000 nodes, and on the loop that stalled every other call, `/healthz` included. So the state
checks each request once it is parsed and, when it is heavy and running on the loop, raises
`HeavyRequest` before it changes anything; the app then runs the whole call in a worker thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from gpupack.scoring.request import Kind, PodRequest

INLINE_MIG_INSTANCES = 4  # MIG instances a decision on the event loop may place; more go to a thread

_on_event_loop: ContextVar[bool] = ContextVar("gpupack_on_event_loop", default=False)


class HeavyRequest(Exception):
    """Raised on the event loop for a request too costly to decide there (nothing was changed)."""


@contextmanager
def on_event_loop() -> Iterator[None]:
    """Mark the calls made inside as running on the event loop."""
    token = _on_event_loop.set(True)
    try:
        yield
    finally:
        _on_event_loop.reset(token)


def leave_the_loop_if_heavy(request: PodRequest) -> None:
    """HeavyRequest when `request` is decided on the event loop and would take long there."""
    if _on_event_loop.get() and request.kind == Kind.MIG and request.mig_instances > INLINE_MIG_INSTANCES:
        raise HeavyRequest
