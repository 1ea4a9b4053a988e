"""kube.sources.watch_stream (#32): watch lines parsed once, across chunk boundaries; an ERROR event raised
with its code; a line that is no event skipped; close() ends the stream."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpupack.kube.sources.watch_stream import WatchStream, parse_event


class Response:
    """A urllib3 response streaming `segments` (as HTTP chunks arrive)."""

    def __init__(self, segments: list[bytes]) -> None:
        self.segments = segments
        self.closed = self.released = False

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        yield from self.segments

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        self.released = True


def stream_of(response: Response, seen: list[dict[str, Any]] | None = None) -> WatchStream:
    def list_func(**kwargs: Any) -> Response:
        if seen is not None:
            seen.append(kwargs)
        return response

    return WatchStream(list_func, resource_version="7", timeout_seconds=60, request_timeout=(1.0, 90.0))


def test_events_split_across_chunks_are_joined_and_the_request_is_a_watch() -> None:
    segments = [b'{"type":"ADDED","object":{"metadata":{"na', b'me":"a"}}}\n{"type":"BOOKMARK",', b'"object":{}}\n\n']
    response, seen = Response(segments), list[dict[str, Any]]()
    events = list(stream_of(response, seen))
    assert events == [{"type": "ADDED", "object": {"metadata": {"name": "a"}}}, {"type": "BOOKMARK", "object": {}}]
    (kwargs,) = seen
    assert kwargs["watch"] is True and kwargs["resource_version"] == "7" and kwargs["allow_watch_bookmarks"] is True
    assert kwargs["_preload_content"] is False and kwargs["timeout_seconds"] == 60
    assert response.closed and response.released


def test_an_error_event_is_raised_with_its_code() -> None:
    gone = b'{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old"}}\n'
    with pytest.raises(ApiException) as info:
        list(stream_of(Response([gone])))
    assert info.value.status == 410 and "Expired" in str(info.value.reason)


@pytest.mark.parametrize("line", [b"", b"   ", b"not json", b"[1, 2]", b'{"object": {}}'])
def test_a_line_that_is_no_event_is_skipped(line: bytes) -> None:
    assert parse_event(line) is None


def test_a_closed_stream_makes_no_request() -> None:
    seen: list[dict[str, Any]] = []
    stream = stream_of(Response([]), seen)
    stream.close()
    assert list(stream) == [] and seen == []
