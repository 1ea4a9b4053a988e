"""One watch request of the official client, read as lines of JSON with orjson (#32).

`kubernetes.watch.Watch` parses every line with the standard library's json, then (for any return type)
dumps the object again and parses it once more to deserialise it: three passes per event, on every pod
change of the cluster. Here the client's own list method makes the request (`watch=True`, its auth, its
pool, `_preload_content=False`, so a non-2xx answer raises its `ApiException`), and each line is parsed
once. The semantics are the installed client's with `timeout_seconds` given: no resuming; an ERROR event
(410 Gone, or any other code) is raised as `ApiException(status=code)`; BOOKMARK events pass through.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException

logger = logging.getLogger(__name__)

WatchEvent = dict[str, Any]


class WatchStream:
    """The events of one watch request, as ``{"type": ..., "object": dict}``; `close()` from another thread
    unblocks a pending read. The request is made at the first `next()`."""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        resource_version: str,
        timeout_seconds: int,
        request_timeout: tuple[float, float],
    ) -> None:
        self._open = lambda: func(
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_seconds,
            _preload_content=False,
            _request_timeout=request_timeout,
        )
        self._response: Any = None
        self._events: Iterator[WatchEvent] | None = None
        self._closed = False

    def __iter__(self) -> WatchStream:
        return self

    def __next__(self) -> WatchEvent:
        if self._events is None:
            if self._closed:
                raise StopIteration
            self._response = self._open()
            self._events = self._read(self._response)
        return next(self._events)

    def _read(self, response: Any) -> Iterator[WatchEvent]:
        try:
            pending = b""
            for segment in response.stream(amt=None, decode_content=False):
                *lines, pending = (pending + segment).split(b"\n")
                for line in lines:
                    event = parse_event(line)
                    if event is not None:
                        yield event
                if self._closed:
                    return
        finally:
            response.close()
            response.release_conn()

    def close(self) -> None:
        """Stop the watch. A read blocked in another thread is woken by shutting the socket down (closing
        it would wait for the SSL lock that read holds)."""
        self._closed = True
        connection = getattr(self._response, "connection", None)
        sock = getattr(connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def parse_event(line: bytes) -> WatchEvent | None:
    """The event of one line (None for a blank one or one that is not a JSON event, logged); an ERROR event
    raises ApiException with its code."""
    if not line.strip():
        return None
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        logger.warning("watch: a line that is not JSON was skipped (%d bytes)", len(line))
        return None
    if not isinstance(event, dict) or "type" not in event:
        logger.warning("watch: a line that is not an event was skipped")
        return None
    if event["type"] == "ERROR":
        found = event.get("object")
        status: dict[str, Any] = found if isinstance(found, dict) else {}
        raise ApiException(status=status.get("code"), reason=f"{status.get('reason')}: {status.get('message')}")
    return {"type": event["type"], "object": event.get("object")}


__all__ = ["WatchEvent", "WatchStream", "parse_event"]
