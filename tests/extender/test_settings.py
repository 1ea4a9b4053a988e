"""Settings: the shipped policy config, environment and CLI overrides, clear validation errors."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest
import yaml
from pydantic import BaseModel

from gpupack.cli import build_parser
from gpupack.extender.service import serve
from gpupack.extender.settings import Settings, SettingsError, camel_case, load_settings, snake_case
from gpupack.scoring.policies import GpupackArgs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    """The policy.yaml of manifests/policy-config.yaml, as the Deployment mounts it."""
    (config_map,) = [d for d in yaml.safe_load_all((ROOT / "manifests" / "policy-config.yaml").read_text()) if d]
    path = tmp_path / "policy.yaml"
    path.write_text(config_map["data"]["policy.yaml"])
    return path


def test_shipped_config_loads_with_the_benchmarked_defaults(shipped: Path) -> None:
    settings = load_settings(shipped)
    assert settings.gpupack_args() == GpupackArgs()
    assert (settings.host, settings.port, settings.decide_in_filter) == ("127.0.0.1", 8888, True)
    assert settings.reservation_ttl_seconds == 30
    assert settings.price_table()[("p5.48xlarge", "spot")] == pytest.approx(39.33)


def test_the_mix_whole_weight_and_share_slack_are_read_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("policy:\n  weights: {shareSlack: 0.0}\n  mix: {wholeWeight: 2.0}\n")
    args = load_settings(path).gpupack_args()
    assert (args.weights.share_slack, args.mix_whole_weight) == (0.0, 2.0)
    assert (GpupackArgs().weights.share_slack, GpupackArgs().mix_whole_weight) == (0.5, 0.5)


def test_defaults_without_a_file() -> None:
    settings = Settings()
    assert (settings.host, settings.port, settings.max_body_bytes) == ("127.0.0.1", 8888, 16 << 20)
    assert settings.policy_spec().name == "gpupack"


def test_environment_and_cli_override_the_file(shipped: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPACK_PORT", "9000")
    monkeypatch.setenv("GPUPACK_POLICY__WEIGHTS__FRAGMENTATION", "2.5")
    monkeypatch.setenv("GPUPACK_SPOT__NON_INTERRUPTIBLE_ON_SPOT", "forbid")
    monkeypatch.setenv("GPUPACK_POLICY__MIX__WITH_MEMORY", "false")
    settings = load_settings(shipped, host="0.0.0.0", port=None)
    assert (settings.host, settings.port) == ("0.0.0.0", 9000)
    args = settings.gpupack_args()
    assert args.weights.fragmentation == 2.5 and args.weights.packing == 0.05  # deep merge with the file
    assert args.forbid_spot_for_non_interruptible
    assert not args.mix_with_memory and GpupackArgs().mix_with_memory
    assert load_settings(shipped, port=7000).port == 7000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("reservationTTLSecnds: 3\n", "reservationTTLSecnds: Extra inputs are not permitted"),
        ("spot: {nonInterruptibleOnSpot: sometimes}\n", "spot.nonInterruptibleOnSpot: Input should be"),
        ("port: 0\n", "port: Input should be"),
        ("policy: {name: fgd}\n", "fgd needs an oracle"),
        ("policy: {weights: {packing: -1}}\n", "policy.weights.packing"),
        ("policy: {weights: {modelFit: -1}}\n", "policy.weights.modelFit: Input should be"),
        ("prices: [{instanceType: a, capacityType: spot, hourly: 1},\n"
         "         {instanceType: a, capacityType: spot, hourly: 2}]\n", "given twice"),
        ("prices: [{instanceType: a, capacityType: reserved, hourly: 1}]\n", "prices.0.capacityType"),
        ("prices: [{capacityType: spot, hourly: 1}]\n", "prices.0.instanceType: Field required"),
        ("maxBodyBytes: 10\nreservationTTLSeconds: -1\n", "reservationTTLSeconds: Input should be"),
        ("- a list\n", "expected a mapping"),
        ("port: [\n", "not valid YAML"),
    ],
)  # fmt: skip
def test_bad_config_is_a_clear_error(tmp_path: Path, text: str, expected: str) -> None:
    """Keys are named as the YAML writes them (camelCase), never as the Python fields (snake_case)."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SettingsError, match=r"bad\.yaml") as err:
        load_settings(path)
    assert expected in str(err.value)
    assert not re.search(r"[a-z]_[a-z]", str(err.value).split(": ", 1)[1]), str(err.value)


def test_every_field_has_one_yaml_spelling_that_reads_back() -> None:
    """camel_case (the errors' spelling) and snake_case (how the YAML is read) undo each other for every
    field, and the shipped ConfigMap writes each key that way."""

    def fields(model: type[BaseModel]) -> Iterator[str]:
        for name, info in model.model_fields.items():
            yield name
            for inner in (info.annotation, *get_args(info.annotation)):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    yield from fields(inner)

    names = set(fields(Settings))
    assert {"reservation_ttl_seconds", "model_fit", "instance_type"} <= names
    for name in names:
        assert snake_case(camel_case(name)) == name
    assert camel_case("reservation_ttl_seconds") == "reservationTTLSeconds"
    shipped_text = next(d for d in yaml.safe_load_all((ROOT / "manifests" / "policy-config.yaml").read_text()) if d)
    for key in re.findall(r"^\s*-?\s*\{?([A-Za-z]+):", shipped_text["data"]["policy.yaml"], re.MULTILINE):
        assert camel_case(snake_case(key)) == key


def test_missing_config_file() -> None:
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings("/nonexistent/policy.yaml")


def test_snake_case() -> None:
    assert snake_case("reservationTTLSeconds") == "reservation_ttl_seconds"
    assert snake_case("modelFit") == "model_fit"
    assert snake_case("decideInFilter") == "decide_in_filter"
    assert snake_case("port") == "port"


def test_a_port_out_of_range_is_named_as_such(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--port", "70000"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "port 70000 is out of range 1..65535" in err and "environment" not in err


def test_serve_refuses_bad_config_and_half_tls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("nope: 1\n")
    base = dict(cluster_file=None, kubeconfig=None, host=None, port=None, tls_cert=None, tls_key=None)
    assert serve(argparse.Namespace(**{**base, "config": str(bad)})) == 2
    assert "nope" in capsys.readouterr().err
    assert serve(argparse.Namespace(**{**base, "config": None, "tls_cert": "c.pem"})) == 2
    assert "--tls-key" in capsys.readouterr().err
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    for cert in (str(tmp_path / "none.pem"), str(garbage)):  # one line, no traceback (#13)
        assert serve(argparse.Namespace(**{**base, "config": None, "tls_cert": cert, "tls_key": cert})) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"gpupack serve: cannot load --tls-cert {cert}") and err.count("\n") == 1, err
    missing = argparse.Namespace(**{**base, "config": None, "cluster_file": str(tmp_path / "none.yaml")})
    assert serve(missing) == 2
