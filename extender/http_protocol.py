"""The HTTP/1.1 protocol gpupack serves with: uvicorn's httptools protocol, guarded (#13, #32).

httptools (llhttp, the parser of Node.js) parses a request in C; h11, which gpupack served with before,
parses in Python and was a quarter of the extender's CPU per request under kube-scheduler
(bench/results/throughput.md). The guards h11 gave or gpupack added to it stay:

- TCP_NODELAY on every TCP connection, so kube-scheduler's keep-alive calls do not pay Nagle +
  delayed-ACK stalls of ~40 ms (extender-wire/README.md). asyncio sets it by itself only when the
  listening socket's proto is IPPROTO_TCP, which a socket handed over by a supervisor (or a test) need not be.
- A deadline for the request line and headers: uvicorn arms its keep-alive timer only after a response,
  so a connection that never sends a whole request line and header block would stay open for ever.
  `header_timeout` seconds after a connection opens, or after a request begins to arrive, it is closed if
  the headers are still incomplete. httptools parses every byte as it arrives, a pipelined request's
  too, so `data_received` sees each request begin. Idle keep-alive connections between requests are
  uvicorn's `timeout_keep_alive`.
- A cap on open connections: those beyond `max_connections` are closed at once.
- A cap on the size of the request line and headers (`HEAD_LIMIT`, h11's default): llhttp keeps no such
  limit, and uvicorn would collect headers without end. Beyond it the answer is 431 and the connection closes.

Each refusal is logged once, by gpupack with its reason (uvicorn's own reasonless line for a request it cannot
parse is filtered out), and counted by reason through `count_refusal` (`gpupack_connections_refused_total`).

Bodies are bounded by the app (extender.app), whatever the protocol.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpupack.extender.settings import Settings

logger = logging.getLogger(__name__)

HEAD_LIMIT = 16 * 1024  # bytes of request line and headers, as h11's max_incomplete_event_size
# httptools hands a header over only once it is whole, buffering it until then: bytes received since the
# read in which a request began are capped too. That read may also hold the previous request's end, up
# to asyncio's largest read (256 KiB), which the cap allows so that no request under HEAD_LIMIT is refused.
RAW_HEAD_LIMIT = HEAD_LIMIT + 256 * 1024
_HEAD_TOO_LARGE_NOTE = b"request line and headers over %d KiB" % (HEAD_LIMIT // 1024)
HEAD_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_HEAD_TOO_LARGE_NOTE), _HEAD_TOO_LARGE_NOTE)
)


UNPARSEABLE_NOTE = "Invalid HTTP request received."  # uvicorn's note, in its log line and its 400 answer
REFUSAL_REASONS = ("head-too-large", "header-timeout", "too-many-connections", "unparseable")


def _count_nothing(reason: str) -> None:
    """The default `count_refusal`: a protocol made without metrics (a bench server) counts nothing."""


class _DropUvicornParseWarning(logging.Filter):
    """Drops uvicorn's reasonless line for a request it cannot parse: the protocol logs it with its reason."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != UNPARSEABLE_NOTE


class HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a request whose head is over `HEAD_LIMIT`."""


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with TCP_NODELAY, a header deadline, a connection cap and a head limit."""

    header_timeout = 5.0  # seconds; `protocol_for` sets both from the settings
    max_connections = 256
    count_refusal: Callable[[str], None] = staticmethod(_count_nothing)
    _header_timer: asyncio.TimerHandle | None = None
    _in_head = False  # a request has begun and its headers are not all in
    _head_bytes = 0  # of the current request's line and headers, as parsed
    _received = 0  # bytes received on this connection
    _read_start = 0  # `_received` before the read being parsed
    _head_start = 0  # `_received` before the read in which the current request began

    # uvicorn's HttpToolsProtocol narrows asyncio's BaseTransport to Transport (with the same ignore): TCP only
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Refuse connections beyond the cap, disable Nagle's algorithm, then proceed as uvicorn does."""
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                logger.debug("could not set TCP_NODELAY", exc_info=True)
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            logger.warning("more than %d connections open; closing a new one", self.max_connections)
            self.count_refusal("too-many-connections")
            transport.close()
            return
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        """As uvicorn does, then start the header deadline when a request has begun to arrive; a head
        still incomplete past `RAW_HEAD_LIMIT` bytes is refused."""
        self._read_start = self._received
        self._received += len(data)
        super().data_received(data)
        if self._in_head and self._received - self._head_start > RAW_HEAD_LIMIT:
            self._refuse_head()
        elif self._awaiting_headers():
            self._arm_header_timer()

    def on_message_begin(self) -> None:
        """As uvicorn does; the request's head is now arriving."""
        super().on_message_begin()
        self._in_head, self._head_bytes, self._head_start = True, 0, self._read_start

    def on_url(self, url: bytes) -> None:
        """As uvicorn does, within the head limit."""
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """As uvicorn does, within the head limit."""
        self._count_head(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        """The head is in: no deadline applies to it any more; then as uvicorn does."""
        self._in_head = False
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        """As uvicorn does, and drop the header deadline."""
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def _awaiting_headers(self) -> bool:
        """Either no request has come on this connection yet, or one is partly in."""
        return self._in_head or self.cycle is None

    def _count_head(self, size: int) -> None:
        """Count `size` bytes of the head; past `HEAD_LIMIT`, stop the parser (answered in send_400_response)."""
        self._head_bytes += size
        if self._head_bytes > HEAD_LIMIT:
            raise HeadTooLarge  # httptools stops parsing and raises HttpParserCallbackError to data_received

    def send_400_response(self, msg: str) -> None:
        """As uvicorn does for a request it cannot parse, logged and counted; one whose head passed
        `HEAD_LIMIT` gets 431 instead."""
        if self._head_bytes > HEAD_LIMIT:
            self._refuse_head()
            return
        if not self.transport.is_closing():
            logger.info("answering 400 and closing a connection: the request is not valid HTTP/1.1")
            self.count_refusal("unparseable")
        super().send_400_response(msg)

    def _refuse_head(self) -> None:
        if self.transport.is_closing():
            return
        logger.info("answering 431 and closing a connection: the request head passed %d bytes", HEAD_LIMIT)
        self.count_refusal("head-too-large")
        self.transport.write(HEAD_TOO_LARGE)
        self.transport.close()

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._header_deadline)

    def _header_deadline(self) -> None:
        self._header_timer = None
        if self._awaiting_headers() and not self.transport.is_closing():
            logger.info("closing a connection whose request headers did not arrive within %g s", self.header_timeout)
            self.count_refusal("header-timeout")
            self.transport.close()


def protocol_for(
    settings: Settings, count_refusal: Callable[[str], None] | None = None
) -> type[GuardedHttpProtocol]:
    """The protocol class with the header deadline and connection cap of `settings`, counting each refused
    connection by one of `REFUSAL_REASONS` through `count_refusal` (given none, nothing is counted)."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(each, _DropUvicornParseWarning) for each in uvicorn_log.filters):
        uvicorn_log.addFilter(_DropUvicornParseWarning())
    limits = {
        "header_timeout": settings.header_timeout_seconds,
        "max_connections": settings.max_connections,
        "count_refusal": staticmethod(count_refusal or _count_nothing),
    }
    return type("GpupackHttpProtocol", (GuardedHttpProtocol,), limits)
