"""`gpupack explain` for pods with ResourceClaims (#30): each claim's allocation, and the plan gpupack's DRA
allocator would make for the others (the same call its worker makes), or why kube-scheduler allocates them."""

from __future__ import annotations

from typing import Any

import pytest

from gpupack.extender.explain import explain, render_text
from gpupack.extender.explain_source import load_live
from gpupack.extender.settings import Settings
from gpupack.kube.dra.allocation import allocation_node
from gpupack.kube.objects import make_node, make_pod
from gpupack.kube.sources import SourceError
from tests.extender.test_dra_allocator import (
    GPU_CLASS,
    MIG_CLASS,
    cluster,
    device_class,
    gated_pod,
    mig_request,
    submit,
    unallocated,
)
from tests.kube.dra_bodies import h100_dynamic
from tests.kube.test_sources_dra import DraApiServer

JsonObject = dict[str, Any]


def keyed(*claims: JsonObject) -> dict[str, JsonObject]:
    return {f"{c['metadata']['namespace']}/{c['metadata']['name']}": c for c in claims}


def test_an_unallocated_claim_gets_the_devices_the_allocator_then_writes() -> None:
    state, api = cluster(*h100_dynamic("a", 2), *h100_dynamic("b", 2), nodes=("a", "b"))
    claim = unallocated("small", mig_request("gpu", "1g.10gb"))
    pod = gated_pod("p", ["small"])
    report = explain(state, pod, keyed(claim))
    section = report["claims"]
    assert section["claims"] == [{"claim": "ml/small", "state": "unallocated"}]
    assert section["left_to_scheduler"] is None
    plan = section["plan"]
    assert report["chosen"] == plan["node"] and [n["node"] for n in report["nodes"]] == [plan["node"]]
    submit(state, api, pod, claim)  # reserving nothing: the allocator still has the same choice
    written = api.claims["ml/small"]
    results = written["status"]["allocation"]["devices"]["results"]
    assert allocation_node(written) == plan["node"]
    assert plan["devices"] == {"ml/small": {r["request"]: f"{r['pool']}/{r['device']}" for r in results}}
    text = render_text(report)
    assert f"chosen: {plan['node']}  (its GPUs come through its claims, below)" in text
    assert f"gpupack would allocate on {plan['node']}:" in text and "ml/small: gpu -> " in text


def test_an_allocated_claim_shows_its_devices_and_holds_the_pod_to_its_node() -> None:
    state, api = cluster(*h100_dynamic("a", 2), *h100_dynamic("b", 2), nodes=("a", "b"))
    claim = unallocated("big", mig_request("gpu", "7g.80gb"))
    pod = gated_pod("p", ["big"])
    submit(state, api, pod, claim)
    written = api.claims["ml/big"]
    node = allocation_node(written)
    report = explain(state, pod, keyed(written))
    (entry,) = report["claims"]["claims"]
    assert entry["state"] == "allocated" and entry["node"] == node
    assert list(entry["devices"]) == ["gpu"] and entry["devices"]["gpu"].startswith(f"{node}/gpu-")
    assert report["claims"]["plan"] is None and report["chosen"] == node
    assert f"ml/big: allocated on {node}: gpu -> " in render_text(report)


def test_claims_gpupack_does_not_read_missing_or_unmade_ones_are_left_to_kube_scheduler() -> None:
    state, _ = cluster(*h100_dynamic("a", 1))
    other = unallocated("other", {"name": "x", "exactly": {"deviceClassName": "fpga.example.com", "count": 1}})
    report = explain(state, gated_pod("p", ["other"]), keyed(other))
    assert "kube-scheduler allocates it" in report["claims"]["left_to_scheduler"]
    assert report["claims"]["plan"] is None and len(report["nodes"]) == 1  # any node: kube-scheduler chooses
    missing = explain(state, gated_pod("q", ["gone"]), {})
    assert missing["claims"]["claims"] == [{"claim": "ml/gone", "state": "missing"}]
    assert missing["claims"]["left_to_scheduler"] == "a claim the pod names is not in the cluster"
    templated = gated_pod("r", [])
    templated["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    unmade = explain(state, templated, {})["claims"]
    assert unmade["claims"] == [] and "not made yet" in unmade["left_to_scheduler"]
    assert "left to kube-scheduler: a claim of the pod's templates is not made yet" in render_text(
        explain(state, templated, {})
    )


def test_a_claim_that_fits_nowhere_says_so() -> None:
    state, _ = cluster(*h100_dynamic("a", 1))
    claims = [unallocated(f"c{i}", mig_request("gpu", "7g.80gb")) for i in range(2)]
    report = explain(state, gated_pod("p", ["c0", "c1"]), keyed(*claims))
    assert report["claims"]["plan"] is None
    assert report["claims"]["left_to_scheduler"].startswith("no DRA node has room")


def test_a_pod_without_claims_has_no_claims_section() -> None:
    state, _ = cluster(*h100_dynamic("a", 1))
    report = explain(state, make_pod("plain", requests={"cpu": "1"}), {})
    assert report["claims"] is None and "claims:" not in render_text(report)


def test_live_lists_bring_the_dra_objects_and_the_claims() -> None:
    server = DraApiServer([make_node("a", product=None, cpu="64", memory="512Gi")])
    for piece in (*h100_dynamic("a", 1), device_class("mig.nvidia.com", MIG_CLASS), device_class("g", GPU_CLASS)):
        server.put_dra(piece)
    server.put_dra(unallocated("small", mig_request("gpu", "1g.10gb")))
    pod = gated_pod("p", ["small"])
    server.put_pod(pod)
    state, found, claims = load_live(Settings(), server, "ml/p")
    assert list(claims) == ["ml/small"]
    assert explain(state, found, claims)["claims"]["plan"]["node"] == "a"
    server.served = False  # no resource.k8s.io: a pod with claims cannot be explained, one without can
    with pytest.raises(SourceError, match="cannot list ResourceSlices"):
        load_live(Settings(), server, "ml/p")
    server.put_pod(make_pod("plain", namespace="ml", requests={"cpu": "1"}))
    assert load_live(Settings(), server, "ml/plain")[2] == {}
