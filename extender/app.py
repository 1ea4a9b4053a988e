"""The HTTP service kube-scheduler calls: routes only read the body, call a verb, answer.

The routes and bodies are docs/contracts.md#extender-http-api.

- `POST /filter`, `/prioritize`, `/preempt`, `/bind`: plain ASGI endpoints (`VerbEndpoint`). `VerbsFirst`
  hands a POST to its verb before FastAPI sees it: they read raw bytes and answer bytes, so FastAPI's
  per-request machinery (middleware stack, routing, parameter solving, Response objects) buys them nothing
  and costs ~0.1 ms a call (bench/speed.py's bare FastAPI handler pays it). They are in FastAPI's router as
  well, for the schema and for a 405 to another method.
  Bodies are read raw (at most `maxBodyBytes`, else 413), handled by extender.verbs and answered
  with the bytes extender.wire produced. A filter or prioritize body of at most INLINE_BODY_BYTES
  (NodeNames of up to ~20,000 nodes) is handled on the event loop when the state's lock is free: it
  is then a fraction of a millisecond of CPU, less than the hop to a worker thread. Everything else
  (bind writes to the API server; large bodies; a busy lock, which would stall the loop) runs in a
  worker thread.
  A body kube-scheduler would never send gets 400 `{"Error": reason}`. An unexpected failure is
  logged (with its traceback the first time per verb and exception type) and answered in the verb's
  own terms — a filter `Error`, a bind `Error`, an empty priority list, a preempt answer keeping no
  node (nothing is evicted) — never a 500.
- Time limit (`verbTimeoutSeconds`, below kube-scheduler's 5 s `httpTimeout`): a body still
  arriving then gets 408; a verb still working then is answered in its own terms as above, and its
  thread stops at its next phase, committing nothing (extender.verbs.Deadline); so does the work of
  a caller that hung up.
- Heavy bodies (over `heavyBodyBytes`, or without a Content-Length): at most `maxHeavyInFlight` are
  read and decided at once; one that gets no slot within the time limit is answered in the verb's
  own terms ("busy"), so memory stays bounded whatever arrives (#13 item 3).
- `GET /healthz` (alive), `GET /readyz` (503 until synced and warmed up), `GET /metrics`,
  `GET /openapi.json` (the bodies as extender.openapi describes them; no docs UI).
- Unknown paths (`/filter/` included: no slash redirects) and wrong methods: 404 / 405 `{"Error": reason}`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from gpupack.extender import openapi, verbs
from gpupack.extender.inline import HeavyRequest, on_event_loop
from gpupack.extender.service_metrics import CONTENT_TYPE, Metrics
from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.extender.wire import ExtenderBindingResult, WireError, filter_error, preemption_error

logger = logging.getLogger(__name__)
JSON = "application/json"
INLINE_BODY_BYTES = 256 << 10
# the worker threads of the verbs and of /metrics renders (as many as anyio's default): a plain executor
# hop costs less than starlette's run_in_threadpool, and a bind takes one per pod (#32)
VERB_WORKERS = ThreadPoolExecutor(max_workers=40, thread_name_prefix="gpupack-verb")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class BodyTooLarge(Exception):
    """The request body exceeds the configured limit."""


class ClientGone(Exception):
    """The client closed the connection before its body arrived: there is no one to answer."""


class TooSlow(Exception):
    """The verb did not answer within the time limit."""


@dataclass
class VerbEndpoint:
    """The ASGI endpoint of one verb: reads the body, handles it (see the module docstring), answers JSON."""

    verb: str
    handle: Callable[[bytes, verbs.Deadline], bytes]  # body, until when it is wanted -> answer
    fallback: Callable[[str], bytes]  # reason -> the verb's own error answer
    state: ClusterState
    settings: Settings
    metrics: Metrics
    inline: bool = False  # may run on the event loop (see INLINE_BODY_BYTES)
    heavy: verbs.HeavyGate | None = None  # shared by the verbs; None: no limit (bind's bodies are small)
    failures_logged: set[str] = field(default_factory=set)  # exception types already logged with a traceback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        try:
            status, content = await self.answer(scope, receive, started)
        except ClientGone:
            logger.debug("%s: the client left before its body arrived", self.verb)
            return
        self.metrics.observe(self.verb, status, time.perf_counter() - started)
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(content))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    async def answer(self, scope: Scope, receive: Receive, started: float) -> tuple[int, bytes]:
        """(HTTP status, body) for one call."""
        limit = self.settings.verb_timeout_seconds
        lock = self.state.lock
        slot = None
        try:
            if self.heavy is not None and self.is_heavy(scope):
                slot = await self.heavy.take(limit - (time.perf_counter() - started))
                if slot is None:
                    return 200, self.fallback(f"gpupack is busy with other large {self.verb} bodies; retry")
            try:
                async with asyncio.timeout(limit):  # no extra task, unlike wait_for
                    body = await read_body(scope, receive, self.settings.max_body_bytes)
            except TimeoutError:
                return 408, error_json(f"request body not received within {limit:g} s")
            deadline = verbs.Deadline(started + limit)
            if self.inline and len(body) <= INLINE_BODY_BYTES and lock.acquire(blocking=False):
                try:
                    with on_event_loop():
                        return 200, self.handle(body, deadline)
                except HeavyRequest:
                    pass  # decided in a worker thread below (extender.inline)
                finally:
                    lock.release()
            work = asyncio.get_running_loop().run_in_executor(VERB_WORKERS, self.handle, body, deadline)
            watcher = asyncio.ensure_future(watch_disconnect(receive, deadline))
            try:
                return 200, await within(slot.around(work) if slot else work, deadline.at - time.perf_counter())
            finally:
                watcher.cancel()
        except BodyTooLarge as exc:
            return 413, error_json(str(exc))
        except WireError as exc:
            return 400, error_json(str(exc))
        except ClientGone:
            raise
        except verbs.Abandoned as exc:
            if exc.caller_gone:
                raise ClientGone from None
            return self.too_slow(limit)
        except TooSlow:
            return self.too_slow(limit)
        except Exception as exc:
            kind = type(exc).__name__
            self.metrics.internal_error(self.verb, kind)
            if kind in self.failures_logged:
                logger.error("%s failed: %s: %s", self.verb, kind, exc)
            else:
                self.failures_logged.add(kind)
                logger.exception("%s failed unexpectedly", self.verb)
            return 200, self.fallback(f"gpupack internal error in {self.verb}: {kind}")
        finally:
            if slot is not None:
                slot.close()

    def too_slow(self, limit: float) -> tuple[int, bytes]:
        """The verb's own error answer for a call that ran past `limit` seconds."""
        logger.warning("%s took longer than %g s; answered with an error", self.verb, limit)
        return 200, self.fallback(f"gpupack {self.verb} took longer than {limit:g} s")

    def is_heavy(self, scope: Scope) -> bool:
        """A body over `heavyBodyBytes`, or of unknown size (kube-scheduler always sends Content-Length)."""
        declared = next((value for name, value in scope["headers"] if name == b"content-length"), None)
        return declared is None or not declared.isdigit() or int(declared) > self.settings.heavy_body_bytes


@dataclass
class VerbsFirst:
    """The extender's ASGI application: a POST to a verb goes straight to its endpoint, everything else
    (health, metrics, the schema, errors of unknown paths and methods, the lifespan) to FastAPI.

    The verbs answer every failure in their own terms, so FastAPI's middleware stack (its error page,
    exception handlers, body limit, telemetry) adds nothing to them; it cost ~5 % of gpupack's CPU under
    the real kube-scheduler (#32, bench/results/throughput.md).
    """

    app: FastAPI
    verbs: dict[str, VerbEndpoint]

    @property
    def state(self) -> Any:
        """FastAPI's `app.state` (the cluster state and the metrics)."""
        return self.app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.verbs.get(scope["path"])
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(state: ClusterState, settings: Settings, metrics: Metrics | None = None) -> VerbsFirst:
    """The extender's ASGI application over `state` (`VerbsFirst` in front of FastAPI)."""
    metrics = metrics or Metrics(state, settings.metrics_max_age_seconds)
    app = FastAPI(
        title="gpupack", docs_url=None, redoc_url=None, openapi_url="/openapi.json", redirect_slashes=False
    )  # `POST /filter/` is a 404, not a redirect a client may follow with a GET
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.state.cluster = state
    app.state.metrics = metrics
    endpoints = verb_endpoints(state, settings, metrics)
    for verb, endpoint in endpoints.items():  # FastAPI's routes too: the schema, and 405 for another method
        app.router.routes.append(Route(f"/{verb}", endpoint, methods=["POST"], name=verb))
    _serve_schema(app)
    _serve_probes(app, state, metrics)
    return VerbsFirst(app, {f"/{verb}": endpoint for verb, endpoint in endpoints.items()})


def verb_endpoints(state: ClusterState, settings: Settings, metrics: Metrics) -> dict[str, VerbEndpoint]:
    """The four verbs by name, each with its handler and its own error answer; the heavy-body gate shared."""
    heavy = verbs.HeavyGate(settings.max_heavy_in_flight)
    return {
        "filter": VerbEndpoint(
            "filter", lambda body, deadline: verbs.filter_body(state, settings, body, deadline),
            lambda reason: filter_error(reason).to_json(), state, settings, metrics, inline=True, heavy=heavy,
        ),
        "prioritize": VerbEndpoint(
            "prioritize", lambda body, deadline: verbs.prioritize_body(state, body, deadline),
            lambda reason: b"[]", state, settings, metrics, inline=True, heavy=heavy,
        ),
        "preempt": VerbEndpoint(
            "preempt", lambda body, deadline: verbs.preempt_body(state, body, deadline),
            lambda reason: preemption_error().to_json(), state, settings, metrics, heavy=heavy,
        ),
        "bind": VerbEndpoint(
            "bind", lambda body, _deadline: verbs.bind_body(state, body),
            lambda reason: ExtenderBindingResult(error=reason).to_json(), state, settings, metrics,
        ),
    }  # fmt: skip


def _serve_schema(app: FastAPI) -> None:
    """/openapi.json: FastAPI's schema of its own routes plus the verbs (plain ASGI routes, which it does not
    see)."""

    def openapi_schema() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema["paths"] = {**openapi.verb_paths(), **schema.get("paths", {})}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi_schema  # type: ignore[method-assign]  # FastAPI's documented way to replace the schema


def _serve_probes(app: FastAPI, state: ClusterState, metrics: Metrics) -> None:
    """/healthz, /readyz (synced and warmed up) and /metrics."""

    @app.get("/healthz", openapi_extra=openapi.status_extra(200))
    async def healthz() -> Response:
        return Response(content=b'{"status":"ok"}', media_type=JSON)

    @app.get("/readyz", openapi_extra=openapi.status_extra(200, 503))
    async def readyz() -> Response:
        if state.ready:
            return Response(content=b'{"status":"ready"}', media_type=JSON)
        waiting = [what for what, done in (("sync", state.synced), ("warm-up", state.warm)) if not done]
        body = {"status": "not ready", "waiting_for": waiting}
        return Response(content=orjson.dumps(body), status_code=503, media_type=JSON)

    @app.get("/metrics", include_in_schema=False)
    async def metrics_() -> Response:
        text = metrics.cached()  # a fresh render is answered from the loop, without a thread hop
        if text is None:
            text = await asyncio.get_running_loop().run_in_executor(VERB_WORKERS, metrics.render)
        return Response(content=text, media_type=CONTENT_TYPE)


async def within(work: Awaitable[bytes], seconds: float) -> bytes:
    """The result of `work`, or TooSlow after `seconds` (the work itself runs on; its errors are dropped).

    A worker thread cannot be interrupted, so the work runs on as its own future and is left to finish.
    """
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=max(seconds, 0.0))
    if not done:
        task.add_done_callback(_drop_result)
        raise TooSlow
    return task.result()


async def watch_disconnect(receive: Receive, deadline: verbs.Deadline) -> None:
    """Mark `deadline` gone when the client hangs up (the body is in: the next message is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    deadline.gone.set()


def _drop_result(task: asyncio.Future[bytes]) -> None:
    if not task.cancelled() and isinstance(task.exception(), verbs.Abandoned):
        logger.info("a verb that timed out stopped: %s", task.exception())
    elif not task.cancelled() and task.exception() is not None:
        logger.warning("a verb that timed out failed later: %s", type(task.exception()).__name__)


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole request body, refusing (BodyTooLarge) anything over `limit` bytes before reading it all."""
    declared = next((value for name, value in scope["headers"] if name == b"content-length"), None)
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise WireError(f"Content-Length {declared.decode(errors='replace')!r} is not a number") from None
        if size > limit:
            raise BodyTooLarge(f"request body of {size} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    received = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def http_error(_: Request, exc: Exception) -> Response:
    """404, 405 and the like in the form of every other gpupack error: `{"Error": reason}`."""
    assert isinstance(exc, StarletteHTTPException)
    return Response(error_json(exc.detail), status_code=exc.status_code, headers=exc.headers, media_type=JSON)


def error_json(reason: str) -> bytes:
    """`{"Error": reason}`: the key kube-scheduler reads in every extender answer."""
    return orjson.dumps({"Error": reason})
