"""The throughput baseline: a kube-scheduler extender that does nothing but answer and bind.

`/filter` answers the first candidate name, found in the request bytes without parsing the JSON;
`/prioritize` answers no scores; `/bind` POSTs the Binding as pre-assembled JSON over a pooled kept-alive TLS
connection (the minimal extender's `Binder`; no client library: the baseline should cost as little as an extender
can). It runs under uvicorn with gpupack's own server configuration (`extender.service.uvicorn_config`),
so a side-by-side run measures what gpupack's decisions, state, watches and binder cost, not a
different HTTP stack.

    python -m bench.trivial_extender --kubeconfig PATH --port PORT
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from gpupack.bench.minimal_extender import Binder, filter_answer

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
JSON = [(b"content-type", b"application/json")]


class TrivialExtender:
    """An ASGI app: filter keeps the first candidate, bind posts the Binding."""

    def __init__(self, kubeconfig: str) -> None:
        self.binder = Binder(kubeconfig)  # the minimal extender's: pooled kept-alive TLS connections

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """Serve one request (or the lifespan protocol)."""
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        body = await _read_body(receive)
        path = scope["path"]
        if path == "/filter":
            await _respond(send, 200, filter_answer(body))
        elif path == "/prioritize":
            await _respond(send, 200, b"[]")
        elif path == "/bind":
            await _respond(send, 200, await asyncio.to_thread(self.bind, body))
        else:
            await _respond(send, 200, b'{"status":"ok"}')

    def bind(self, body: bytes) -> bytes:
        """Create the Binding that ExtenderBindingArgs asks for; the answer carries any error."""
        args = orjson.loads(body)
        name, namespace = args["PodName"], args["PodNamespace"]
        binding = orjson.dumps(
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace, "uid": args["PodUID"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": args["Node"]},
            }
        )
        try:
            status, answer = self.binder.post(f"/api/v1/namespaces/{namespace}/pods/{name}/binding", binding)
        except (OSError, http.client.HTTPException) as exc:  # the answer carries it; kube-scheduler retries
            return orjson.dumps({"Error": f"{type(exc).__name__}: {exc}"})
        return b'{"Error":""}' if status < 300 else orjson.dumps({"Error": f"HTTP {status}: {answer[:300]!r}"})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _respond(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": JSON})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    """Serve the trivial extender on 127.0.0.1 until interrupted."""
    import uvicorn

    from gpupack.extender.service import uvicorn_config
    from gpupack.extender.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = TrivialExtender(args.kubeconfig)
    uvicorn.Server(uvicorn_config(app, Settings(port=args.port))).run()


if __name__ == "__main__":
    main()
