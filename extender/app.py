"""The HTTP service kube-scheduler calls (DESIGN.md §5): routes only read the body, call a verb, answer.

- `POST /filter`, `/prioritize`, `/bind`: bodies are read raw (at most `maxBodyBytes`, else 413),
  handled by extender.verbs and answered with the bytes extender.wire produced. A filter or
  prioritize body of at most INLINE_BODY_BYTES (NodeNames of up to ~20,000 nodes) is handled on the
  event loop when the state's lock is free: it is then a fraction of a millisecond of CPU, less
  than the hop to a worker thread. Everything else (bind writes to the API server; large bodies; a
  busy lock, which would stall the loop) runs in a worker thread.
  A body kube-scheduler would never send gets 400 `{"Error": reason}`. An unexpected failure is
  logged (with its traceback the first time per verb and exception type) and answered in the verb's
  own terms — a filter `Error`, a bind `Error`, an empty priority list — never a 500.
- Time limit (`verbTimeoutSeconds`, below kube-scheduler's 5 s `httpTimeout`): a body still
  arriving then gets 408; a verb still working then is answered in its own terms as above (its
  thread finishes on its own: a filter's late reservation is reused by the retry or expires by TTL).
- `GET /healthz` (alive), `GET /readyz` (503 until synced and warmed up), `GET /metrics`,
  `GET /openapi.json` (the bodies as extender.openapi describes them; no docs UI).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from extender import openapi, verbs
from extender.metrics import CONTENT_TYPE, Metrics
from extender.settings import Settings
from extender.state import ClusterState
from extender.wire import ExtenderBindingResult, WireError, filter_error

logger = logging.getLogger(__name__)
JSON = "application/json"
INLINE_BODY_BYTES = 256 << 10


class BodyTooLarge(Exception):
    """The request body exceeds the configured limit."""


class TooSlow(Exception):
    """The verb did not answer within the time limit."""


def create_app(state: ClusterState, settings: Settings, metrics: Metrics | None = None) -> FastAPI:
    """The extender's FastAPI application over `state`."""
    metrics = metrics or Metrics(state)
    app = FastAPI(title="gpupack", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.cluster = state
    app.state.metrics = metrics
    failures_logged: set[tuple[str, str]] = set()

    fallbacks: dict[str, Callable[[str], bytes]] = {
        "filter": lambda reason: filter_error(reason).to_json(),
        "prioritize": lambda reason: b"[]",
        "bind": lambda reason: ExtenderBindingResult(error=reason).to_json(),
    }

    async def answer(request: Request, verb: str, handle: Callable[[bytes], bytes], inline: bool = False) -> Response:
        started = time.perf_counter()
        limit = settings.verb_timeout_seconds
        status = 200
        try:
            try:
                async with asyncio.timeout(limit):  # no extra task, unlike wait_for
                    body = await read_body(request, settings.max_body_bytes)
            except TimeoutError:
                status, content = 408, error_json(f"request body not received within {limit:g} s")
            else:
                if inline and len(body) <= INLINE_BODY_BYTES and state.lock.acquire(blocking=False):
                    try:
                        content = handle(body)
                    finally:
                        state.lock.release()
                else:
                    content = await within(run_in_threadpool(handle, body), limit - (time.perf_counter() - started))
        except BodyTooLarge as exc:
            status, content = 413, error_json(str(exc))
        except WireError as exc:
            status, content = 400, error_json(str(exc))
        except TooSlow:
            logger.warning("%s took longer than %g s; answered with an error", verb, limit)
            content = fallbacks[verb](f"gpupack {verb} took longer than {limit:g} s")
        except Exception as exc:
            signature = (verb, type(exc).__name__)
            if signature in failures_logged:
                logger.error("%s failed: %s: %s", verb, type(exc).__name__, exc)
            else:
                failures_logged.add(signature)
                logger.exception("%s failed unexpectedly", verb)
            content = fallbacks[verb](f"gpupack internal error in {verb}: {type(exc).__name__}")
        metrics.observe(verb, status, time.perf_counter() - started)
        return Response(content=content, status_code=status, media_type=JSON)

    @app.post("/filter", openapi_extra=openapi.filter_extra())
    async def filter_(request: Request) -> Response:
        return await answer(request, "filter", lambda body: verbs.filter_body(state, settings, body), inline=True)

    @app.post("/prioritize", openapi_extra=openapi.prioritize_extra())
    async def prioritize(request: Request) -> Response:
        return await answer(request, "prioritize", lambda body: verbs.prioritize_body(state, body), inline=True)

    @app.post("/bind", openapi_extra=openapi.bind_extra())
    async def bind(request: Request) -> Response:
        return await answer(request, "bind", lambda body: verbs.bind_body(state, body))

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
        return Response(content=await run_in_threadpool(metrics.render), media_type=CONTENT_TYPE)

    return app


async def within(work: Awaitable[bytes], seconds: float) -> bytes:
    """The result of `work`, or TooSlow after `seconds` (the work itself runs on; its errors are dropped).

    A worker thread cannot be interrupted, and awaiting a cancelled `run_in_threadpool` would wait
    for it anyway, so the work runs as its own task and is left to finish.
    """
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=max(seconds, 0.0))
    if not done:
        task.add_done_callback(_drop_result)
        raise TooSlow
    return task.result()


def _drop_result(task: asyncio.Future[bytes]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("a verb that timed out failed later: %s", type(task.exception()).__name__)


async def read_body(request: Request, limit: int) -> bytes:
    """The whole request body, refusing (BodyTooLarge) anything over `limit` bytes before reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise WireError(f"Content-Length {declared!r} is not a number") from None
        if size > limit:
            raise BodyTooLarge(f"request body of {size} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def error_json(reason: str) -> bytes:
    """`{"Error": reason}`: the key kube-scheduler reads in every extender answer."""
    return orjson.dumps({"Error": reason})
