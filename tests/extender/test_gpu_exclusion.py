"""GPUs out of service in gpupack serve (#26 item 8): unhealthy (the agent's `devices-in-use`) or cordoned
(`gpupack.io/cordoned-gpus`, read by serve itself): nothing new goes on any part of them, nothing is
counted twice, `explain` names them and /metrics counts them."""

from __future__ import annotations

import json
import logging

import pytest

from gpupack.extender.explain import explain
from gpupack.extender.service_metrics import Metrics
from gpupack.kube.sources import NodeUpserted, PodDeleted
from gpupack.scoring.request import MILLI_PER_GPU
from tests.extender_helpers import assert_matches_rebuild, node, pod, state_from

IN_USE, CORDON = "gpupack.io/devices-in-use", "gpupack.io/cordoned-gpus"
XID_79 = "unhealthy: XID 79 (GPU has fallen off the bus)"


def _node(gpus: int = 4, **annotations: str) -> dict:
    notes = {"gpupack.io/" + key.replace("_", "-"): value for key, value in annotations.items()}
    return node("n1", gpus=gpus, annotations=notes)


def _unhealthy(index: int, reason: str = XID_79) -> str:
    return json.dumps({"blocked": [{"index": index, "reason": reason}]})


def _share_on(index: int, name: str = "s", milli: int = 250) -> dict:
    assignment = {"node": "n1", "gpus": [{"index": index, "milli": milli}]}
    return pod(name, milli=milli, node_name="n1", namespace="ml", assignment=assignment)


def _gpus_placed(state, request: dict, tries: int = 8) -> set[int]:
    """The GPUs filter would give `request` (reserving each), until nothing fits."""
    used = set()
    for k in range(tries):
        asked = {**request, "metadata": {**request["metadata"], "name": f"new-{k}", "uid": f"uid-new-{k}"}}
        decision = state.evaluate(asked, ["n1"]).decision
        if decision is None or decision.placement is None:
            break
        state.inventory.commit(decision.placement)
        used |= {slot.index for slot in decision.placement.slots}
    return used


def _milli_free(state, gpu: int) -> int:
    row = state.inventory.index["n1"]
    return int(state.inventory.gpu_milli_free[state.inventory.gpu_rows(row)][gpu])


def test_an_unhealthy_gpu_with_a_live_share_gets_nothing_more_and_is_not_counted_twice() -> None:
    """Before: the whole-GPU block did not fit beside the share and was skipped, so 750 milli stayed open."""
    nodes = [_node(devices_in_use=_unhealthy(0))]
    state = state_from(nodes, [_share_on(0)])
    assert _milli_free(state, 0) == 0  # the share's 250 and the hold's 750: all of GPU 0, no more
    assert state.snapshot().gpus_allocated == pytest.approx(1.0)
    assert 0 not in _gpus_placed(state, pod("x", milli=250))
    assert_matches_rebuild(state_from(nodes, [_share_on(0)]), nodes, [_share_on(0)])


def test_what_a_pod_frees_on_an_unhealthy_gpu_is_held_again() -> None:
    state = state_from([_node(devices_in_use=_unhealthy(0))], [_share_on(0)])
    state.apply(PodDeleted("ml/s", "uid-ml-s"))
    assert _milli_free(state, 0) == 0
    assert 0 not in _gpus_placed(state, pod("x", milli=250)) | _gpus_placed(state, pod("y", gpus=1))


def test_a_gpu_that_comes_back_is_offered_again() -> None:
    state = state_from([_node(devices_in_use=_unhealthy(0))], [_share_on(0)])
    state.apply(NodeUpserted(_node()))  # the agent cleared it
    assert _milli_free(state, 0) == MILLI_PER_GPU - 250
    assert state.excluded_gpus() == {}


@pytest.mark.parametrize("value", ["1", " 1 ,", "GPU-0000, 1", "x, 1, 9"])
def test_a_cordon_by_index_is_honoured_by_serve_alone(value: str) -> None:
    """Without an agent: serve reads the annotation itself (UUIDs are the agent's to resolve)."""
    state = state_from([_node(cordoned_gpus=value)])
    assert 1 not in _gpus_placed(state, pod("w", gpus=1))
    (exclusion,) = state.excluded_gpus()["n1"]
    assert (exclusion.index, exclusion.reason) == (1, f"cordoned: {CORDON} names GPU 1")
    assert state.bad_nodes() == {}


def test_malformed_cordon_entries_are_logged_once_counted_and_never_break_the_node(caplog) -> None:
    caplog.set_level(logging.WARNING)
    bad = _node(cordoned_gpus="x, -1, 9, 2")
    state = state_from([bad])
    state.apply(NodeUpserted(bad))  # the same value again: not logged again
    warnings = [r.getMessage() for r in caplog.records if CORDON in r.getMessage()]
    assert len(warnings) == 1 and "['x', '-1', '9']" in warnings[0], warnings
    assert state.cordon_entries_invalid() == 3
    assert state.bad_nodes() == {} and [e.index for e in state.excluded_gpus()["n1"]] == [2]


def test_explain_names_the_gpus_out_of_service() -> None:
    state = state_from([_node(gpus=2, devices_in_use=_unhealthy(0), cordoned_gpus="1")])
    report = explain(state, pod("want", gpus=1))
    (line,) = report["nodes"]
    assert line["verdict"] == "infeasible"
    assert f"GPU 0 {XID_79}" in line["reason"] and f"GPU 1 cordoned: {CORDON} names GPU 1" in line["reason"]
    assert [g["index"] for g in line["excluded_gpus"]] == [0, 1]


def test_metrics_count_excluded_gpus_by_why() -> None:
    nodes = [_node(devices_in_use=_unhealthy(0), cordoned_gpus="1, 2, nope")]
    text = Metrics(state_from(nodes)).render().decode()
    assert 'gpupack_gpus_excluded{reason="unhealthy"} 1.0' in text
    assert 'gpupack_gpus_excluded{reason="cordoned"} 2.0' in text
    assert "gpupack_cordon_entries_invalid 1.0" in text


def test_a_static_mig_gpu_out_of_service_leaves_the_rest_of_the_node_usable() -> None:
    """The agent leaves the GPU out of `mig-layout` (the kubelet left its instances out of allocatable):
    serve keeps the node, places nothing on that GPU, and still offers the other GPU's instances."""
    layout = json.dumps({"0": ["3g.40gb@0", "3g.40gb@4"]})  # GPU 1's 2 instances are Unhealthy
    annotations = {"gpupack.io/mig-layout": layout, IN_USE: _unhealthy(1, "unhealthy: GPU is lost (NVML)")}
    state = state_from([node("n1", gpus=2, static_mig={"3g.40gb": 2}, annotations=annotations)])
    assert state.bad_nodes() == {}
    assert _gpus_placed(state, pod("m", mig="3g.40gb")) == {0}
    assert _gpus_placed(state, pod("w", gpus=1)) == set()
