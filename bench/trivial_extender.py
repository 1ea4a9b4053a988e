"""The throughput baseline: a kube-scheduler extender that does nothing but answer and bind.

`/filter` answers the first candidate name, found in the request bytes without parsing the JSON;
`/prioritize` answers no scores; `/bind` creates the Binding with one POST through the official
client, in a worker thread, as gpupack's binder does. It runs under uvicorn with gpupack's own server
configuration (`extender.service.uvicorn_config`), so a side-by-side run measures what gpupack's
decisions, state and watches cost, not a different HTTP stack.

    python -m bench.trivial_extender --kubeconfig PATH --port PORT
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from extender.sources.kube_api import load_kube_config

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
JSON = [(b"content-type", b"application/json")]
NO_NODE = b'{"NodeNames":[],"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":"no candidates"}'


def first_candidate(body: bytes) -> bytes | None:
    """The first name of `NodeNames` (nodeCacheCapable: true), as its JSON string bytes."""
    start = body.find(b'"NodeNames":[')
    if start < 0:
        return None
    first = body.find(b'"', start + len(b'"NodeNames":['))
    end = body.find(b'"', first + 1)
    return body[first : end + 1] if 0 <= first < end else None


def filter_answer(body: bytes) -> bytes:
    """ExtenderFilterResult that keeps the first candidate only."""
    name = first_candidate(body)
    if name is None:
        return NO_NODE
    return b'{"NodeNames":[' + name + b'],"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}'


class TrivialExtender:
    """An ASGI app: filter keeps the first candidate, bind posts the Binding."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client

        api_client = load_kube_config(kubeconfig)
        self.core = client.CoreV1Api(api_client)
        self.client = client

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
        binding = self.client.V1Binding(
            api_version="v1",
            kind="Binding",
            metadata=self.client.V1ObjectMeta(name=args["PodName"], namespace=args["PodNamespace"], uid=args["PodUID"]),
            target=self.client.V1ObjectReference(api_version="v1", kind="Node", name=args["Node"]),
        )
        try:
            response = self.core.create_namespaced_pod_binding(
                args["PodName"], args["PodNamespace"], binding, _preload_content=False
            )
            response.read()
            response.release_conn()
        except Exception as exc:  # the answer carries it to kube-scheduler, which retries the pod
            return orjson.dumps({"Error": str(exc)[:500]})
        return b'{"Error":""}'


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

    from extender.service import uvicorn_config
    from extender.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = TrivialExtender(args.kubeconfig)
    uvicorn.Server(uvicorn_config(app, Settings(port=args.port))).run()


if __name__ == "__main__":
    main()
