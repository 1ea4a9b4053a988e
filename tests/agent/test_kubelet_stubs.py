"""The kubelet protos are gpupack's own, and the committed gRPC modules are what
`python -m gpupack.agent.kubelet.generate` makes from them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpupack.agent.kubelet import deviceplugin_pb2, generate, podresources_pb2

PROTOS = sorted(generate.HERE.glob("*.proto"))
# what an upstream copy would carry: the Kubernetes licence header or the Go-only gogo protobuf options
# (spelled in pieces so that a repository-wide search for the markers finds only real copies)
UPSTREAM_MARKER = re.compile(r"Copyright \d{4} The Kubernetes Authors|gogo" + "proto", re.I)


def test_the_protos_are_there() -> None:
    assert [proto.name for proto in PROTOS] == ["deviceplugin.proto", "podresources.proto"]


@pytest.mark.parametrize("proto", PROTOS, ids=lambda proto: proto.name)
def test_proto_carries_no_upstream_marker(proto: Path) -> None:
    found = UPSTREAM_MARKER.search(proto.read_text())
    assert found is None, f"{proto.name} has {found and found.group(0)!r}: write gpupack's own definitions"


def test_committed_stubs_are_current(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) compiles the protos")
    for path in generate.generate(tmp_path):
        committed = generate.HERE / path.name
        assert committed.read_text() == path.read_text(), (
            f"{path.name} is stale: run python -m gpupack.agent.kubelet.generate"
        )


def _methods(module: object) -> set[str]:
    file = module.DESCRIPTOR  # type: ignore[attr-defined]
    return {f"/{service.full_name}/{method.name}" for service in file.services_by_name.values()
            for method in service.methods}


def test_rpc_paths_are_the_kubelets() -> None:
    """The kubelet dials these exact paths: a renamed package, service or rpc breaks it silently."""
    assert _methods(deviceplugin_pb2) == {
        "/v1beta1.Registration/Register",
        "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        "/v1beta1.DevicePlugin/ListAndWatch",
        "/v1beta1.DevicePlugin/GetPreferredAllocation",
        "/v1beta1.DevicePlugin/Allocate",
        "/v1beta1.DevicePlugin/PreStartContainer",
    }
    assert _methods(podresources_pb2) == {
        "/v1.PodResourcesLister/List",
        "/v1.PodResourcesLister/GetAllocatableResources",
    }
