"""The Helm chart's own files, without helm: version, schema against defaults, the README's values table.

What needs helm (lint, rendering, the API server's dry run, install and upgrade) is in tests/e2e/test_chart.py
and tests/e2e/test_helm_real_node.py.
"""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpupack.harness.chart_values import BEGIN, README, chart_table, readme_with_table, settings, table

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpupack"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def _errors(values: dict[str, Any]) -> list[str]:
    """The schema's complaints about `values`, each with the path it names."""
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [f"/{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(values)]


def _with(path: str, value: Any) -> dict[str, Any]:
    """The default values with the dotted `path` set to `value`."""
    values = copy.deepcopy(VALUES)
    *parents, leaf = path.split(".")
    node = values
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return values


def test_the_chart_runs_the_projects_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version
    assert chart["kubeVersion"] == ">=1.33.0-0"  # the oldest supported minor (harness/kube_programs.py)


def test_the_defaults_meet_the_schema_and_every_setting_is_described() -> None:
    assert _errors(VALUES) == []
    for name, _, node in settings(SCHEMA, VALUES):
        assert node.get("description"), f"{name} has no description for the README's table"


@pytest.mark.parametrize(
    ("path", "value", "complaint"),
    [
        ("policy.weights.fragmentation", -1, "/policy/weights/fragmentation: -1 is less than the minimum of 0"),
        ("policy.spot.nonInterruptibleOnSpot", "sometimes", "/policy/spot/nonInterruptibleOnSpot: 'sometimes' is not"),
        ("policy.reservationTTLSeconds", 0, "/policy/reservationTTLSeconds: 0 is less than or equal to the minimum"),
        ("policy.weights.packing", "-0.1", "/policy/weights/packing: '-0.1' does not match"),  # helm --set's decimal
        ("policy.weights.speed", 1, "/policy/weights: Additional properties are not allowed ('speed' was unexpected)"),
        ("image.digest", "sha256:abc", "/image/digest: 'sha256:abc' does not match"),
        ("scheduler.replicas", 0, "/scheduler/replicas: 0 is less than the minimum of 1"),
        ("agent.metricsPort", 70000, "/agent/metricsPort: 70000 is greater than the maximum of 65535"),
    ],
)
def test_the_schema_names_a_wrong_value(path: str, value: Any, complaint: str) -> None:
    (error,) = _errors(_with(path, value))
    assert error.startswith(complaint)


def test_the_readme_table_is_current() -> None:
    """`make manifests` writes it; a value added to the schema without running it fails here."""
    readme = README.read_text()
    assert readme_with_table(readme, chart_table()) == readme, "run `make manifests`"
    assert BEGIN in readme


def test_the_table_has_one_row_per_setting_with_what_the_schema_allows() -> None:
    schema = {
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "number", "minimum": 0, "description": "x | y"}}},
            "c": {"type": "string", "enum": ["", "on"], "description": "switch"},
            "r": {"type": "object", "properties": {"requests": {}, "limits": {}}, "description": "resources"},
        }
    }
    rows = table(schema, {"a": {"b": 1.5}, "c": "", "r": {"requests": {"cpu": "1"}}}).splitlines()[2:]
    assert rows == [
        "| `a.b` | `1.5` | number ≥ 0 | x \\| y |",
        '| `c` | `""` | `""`, `on` | switch |',
        '| `r` | `{"requests": {"cpu": "1"}}` | object | resources |',
    ]
