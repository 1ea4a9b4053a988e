"""schemathesis against the OpenAPI spec the app publishes at /openapi.json: zero 5xx.

The verb routes read raw bytes; their request and response bodies are described in the spec from the
wire models (extender.openapi), so schemathesis generates real ExtenderArgs / ExtenderBindingArgs
bodies — positive and negative — for /filter, /prioritize, /preempt and /bind, and probes every other method.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings

from gpupack.extender.app import create_app
from tests.extender.test_fuzz import CONFIG, assert_consistent, warm_state

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (dev extra)")
from schemathesis.checks import not_a_server_error  # noqa: E402

SCHEMA_STATE = warm_state()
SCHEMA_APP = create_app(SCHEMA_STATE, CONFIG)
schema = schemathesis.openapi.from_asgi("/openapi.json", SCHEMA_APP)
schema.config.generation.update(max_examples=60)


def test_the_spec_describes_the_bodies() -> None:
    spec = TestClient(SCHEMA_APP).get("/openapi.json").json()
    for verb in ("filter", "prioritize", "preempt", "bind"):
        operation = spec["paths"][f"/{verb}"]["post"]
        properties = operation["requestBody"]["content"]["application/json"]["schema"]["properties"]
        assert properties
        assert {"200", "400", "413"} <= set(operation["responses"])
    filter_body = spec["paths"]["/filter"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(filter_body["properties"]) == {"Pod", "Nodes", "NodeNames"}
    assert "metadata" in filter_body["properties"]["Pod"]["properties"]
    preempt_body = spec["paths"]["/preempt"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(preempt_body["properties"]) == {"Pod", "NodeNameToVictims", "NodeNameToMetaVictims"}


@pytest.mark.slow
@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_schemathesis_never_5xx(case) -> None:
    response = case.call()
    case.validate_response(response, checks=[not_a_server_error])
    assert response.status_code < 500


@pytest.mark.slow
def test_the_state_is_consistent_after_schemathesis() -> None:
    """Runs after the generated cases (pytest keeps definition order): nothing leaked or overlaps."""
    assert_consistent(SCHEMA_STATE)
