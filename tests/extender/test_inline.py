"""Light decisions run on the event loop, heavy ones in a worker thread (#13 item 8: a pod asking 56
MIG instances took ~0.8 s per filter at 5,000 nodes on the loop, stalling every other call)."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import orjson
import pytest

from gpupack.extender.inline import INLINE_MIG_INSTANCES
from gpupack.extender.settings import Settings
from gpupack.extender.warm_up import warm_up
from tests.extender_helpers import live_server, node, pod, state_from


def filter_threads(pods: list[dict[str, Any]], verb: str) -> dict[str, str]:
    """The thread each pod's decision ran in, over a live server: pod name -> thread name."""
    settings = Settings()
    state = state_from([node(f"h100-{i}", mig="dynamic") for i in range(4)], settings=settings)
    warm_up(state)
    threads: dict[str, str] = {}
    decide = state.decider.engine.decide

    def recording(request: Any, *args: Any, **kw: Any) -> Any:
        threads[f"{request.kind.name}-{request.mig_instances}"] = threading.current_thread().name
        return decide(request, *args, **kw)

    state.decider.engine.decide = recording  # type: ignore[method-assign]  # a recording double on this one engine
    with live_server(state, settings) as (host, port), httpx.Client(base_url=f"http://{host}:{port}") as client:
        for obj in pods:
            body = {"Pod": obj, "Nodes": None, "NodeNames": [f"h100-{i}" for i in range(4)]}
            answer = client.post(f"/{verb}", content=orjson.dumps(body))
            assert answer.status_code == 200
    return threads


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_a_heavy_mig_request_is_decided_off_the_event_loop(verb: str) -> None:
    light = pod("light", mig="1g.10gb", mig_count=INLINE_MIG_INSTANCES)
    heavy = pod("heavy", mig="1g.10gb", mig_count=INLINE_MIG_INSTANCES + 1)
    threads = filter_threads([light, heavy], verb)
    loop_thread = threads[f"MIG-{INLINE_MIG_INSTANCES}"]
    assert "gpupack-verb" not in loop_thread  # the light one ran on the event loop's thread
    assert "gpupack-verb" in threads[f"MIG-{INLINE_MIG_INSTANCES + 1}"]
