"""The committed gRPC modules are what `python -m gpupack.agent.kubelet.generate` makes from the committed protos."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupack.agent.kubelet import generate

UPSTREAM = generate.ROOT.parent / "shared" / "kube" / "proto"


def test_committed_stubs_are_current(tmp_path: Path) -> None:
    for path in generate.generate(tmp_path):
        committed = generate.HERE / path.name
        assert committed.read_text() == path.read_text(), (
            f"{path.name} is stale: run python -m gpupack.agent.kubelet.generate"
        )


@pytest.mark.skipif(not UPSTREAM.is_dir(), reason="the upstream protos live in ../shared (absent in a clone)")
def test_committed_protos_are_upstream_without_gogoproto() -> None:
    for upstream, local in generate.UPSTREAM.items():
        stripped = generate.strip_gogo((UPSTREAM / upstream).read_text())
        assert "gogoproto" not in stripped
        assert (generate.HERE / local).read_text() == stripped


def test_strip_gogo_keeps_the_field() -> None:
    text = 'message A {\n\trepeated string devices_ids = 1 [(gogoproto.customname) = "DevicesIDs"];\n}\n'
    assert generate.strip_gogo(text) == "message A {\n\trepeated string devices_ids = 1;\n}\n"
