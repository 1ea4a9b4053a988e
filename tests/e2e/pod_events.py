"""The events.k8s.io/v1 Events on this test's pods, read raw (no client models), by reason."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from gpupack.harness.controlplane import ControlPlane


def events_by_pod(plane: ControlPlane, namespace: str, reason: str) -> dict[str, list[dict[str, Any]]]:
    """Pod name -> the Events of `reason` regarding it in `namespace`, in the API's order."""
    api = client.EventsV1Api(plane.api_client())
    response: Any = api.list_namespaced_event(namespace, _preload_content=False)
    found: dict[str, list[dict[str, Any]]] = {}
    for event in json.loads(response.data)["items"]:
        if event.get("reason") == reason and event["regarding"]["kind"] == "Pod":
            found.setdefault(event["regarding"]["name"], []).append(event)
    return found


def notes_by_pod(plane: ControlPlane, namespace: str, reason: str) -> dict[str, str]:
    """Pod name -> the note of the last Event of `reason` regarding it in `namespace`."""
    return {name: events[-1].get("note") or "" for name, events in events_by_pod(plane, namespace, reason).items()}
