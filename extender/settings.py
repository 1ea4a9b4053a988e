"""The service's configuration: one pydantic-settings model fed by defaults, a YAML file and the environment.

Sources, strongest first: explicit values (CLI flags), environment variables `GPUPACK_*` (nested keys
with `__`, e.g. `GPUPACK_POLICY__WEIGHTS__FRAGMENTATION=2`), the YAML file given with `--config`
(the `policy.yaml` of manifests/policy-config.yaml, camelCase keys), then the defaults below.

YAML keys are camelCase (`decideInFilter`, `reservationTTLSeconds`, `modelFit`, ...) and are turned
into the snake_case field names; unknown keys are errors, so a misspelt option never goes unnoticed.
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gpupack.errors import GpupackError
from gpupack.scoring.policies import POLICY_NAMES, GpupackArgs, GpupackWeights, PolicySpec, baseline, gpupack

_DEFAULT_ARGS = GpupackArgs()
_CONFIG_FILE: ContextVar[Path | None] = ContextVar("gpupack_config_file", default=None)


class SettingsError(GpupackError, ValueError):
    """Configuration that cannot be used; the message names the file or variable and the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Mix(_Section):
    """How the gpupack policy learns the workload mix (scoring.policies.GpupackArgs)."""

    half_life: float = Field(_DEFAULT_ARGS.mix_half_life, gt=0)
    coverage: float = Field(_DEFAULT_ARGS.mix_coverage, gt=0, le=1)
    prior_weight: float = Field(_DEFAULT_ARGS.mix_prior_weight, ge=0)
    with_memory: bool = _DEFAULT_ARGS.mix_with_memory  # a shape is its memory request too
    whole_weight: float = Field(_DEFAULT_ARGS.mix_whole_weight, gt=0)  # a whole-GPU request's weight in the mix


class Policy(_Section):
    """The scoring policy: `gpupack` (default) or a baseline that needs no workload oracle."""

    name: str = "gpupack"
    weights: GpupackWeights = GpupackWeights()
    mix: Mix = Mix()

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        usable = [p for p in POLICY_NAMES if p != "fgd"]
        if name not in usable:
            raise ValueError(f"unknown policy {name!r}; choose from {', '.join(usable)} (fgd needs an oracle)")
        return name


class Spot(_Section):
    """Pods without `gpupack.io/interruptible: "true"` on spot nodes: `avoid` (score) or `forbid` (filter)."""

    non_interruptible_on_spot: Literal["avoid", "forbid"] = "avoid"


class Gangs(_Section):
    """Gang placement (#29, docs/gangs.md): how long a plan's unclaimed placements are held, and the rack label."""

    hold_seconds: float = Field(60.0, gt=0, description="a group's planned placements no member claimed are released")
    rack_label: str = Field("gpupack.io/rack", min_length=1, description="the node label that names a node's rack")


class Price(_Section):
    """One row of the price table: hourly price of an instance type on a capacity type."""

    instance_type: str = Field(min_length=1)
    capacity_type: Literal["spot", "on-demand"]
    hourly: float = Field(ge=0, allow_inf_nan=False)


class Settings(BaseSettings):
    """Everything `gpupack serve` can be told; defaults are the documented ones."""

    model_config = SettingsConfigDict(
        env_prefix="GPUPACK_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    host: str = "127.0.0.1"
    port: int = Field(8888, ge=1, le=65535)
    policy: Policy = Policy()
    spot: Spot = Spot()
    gangs: Gangs = Gangs()
    prices: list[Price] = Field(default_factory=list)
    decide_in_filter: bool = True
    report_not_chosen: bool = Field(
        False,
        description="decide in filter: FailedNodes names only the infeasible candidates, each with its reason; "
        "true also names every feasible candidate not chosen as 'gpupack chose another node'. kube-scheduler "
        "drops the statuses of a filter that chose a node, and at 5,000 candidates that map is ~200 KiB per call",
    )
    reservation_ttl_seconds: float = Field(30.0, gt=0, description="an unbound filter decision is released")
    max_body_bytes: int = Field(16 << 20, ge=1024, description="larger request bodies get HTTP 413")
    verb_timeout_seconds: float = Field(
        4.5, gt=0, description="a verb answers within this time, body read included (kube-scheduler waits 5 s)"
    )
    request_timeout_seconds: float = Field(5.0, gt=0, description="timeout of Kubernetes API writes in bind")
    header_timeout_seconds: float = Field(
        5.0, gt=0, description="a connection whose request line and headers are not in within this time is closed"
    )
    max_connections: int = Field(256, ge=1, description="connections beyond this many are closed at once")
    metrics_max_age_seconds: float = Field(
        1.0,
        ge=0,
        description="/metrics answers with text rendered at most this long ago (0: render every scrape): however "
        "often it is scraped, rendering costs at most one render (~2 ms) a period",
    )
    # Bounds on what one request can cost (#13 item 3): 16 MiB of unknown NodeNames once cost a 65 MiB
    # answer, and four 16 MiB bodies at once 2.8 GB of RSS, past the sidecar's 2Gi memory limit.
    max_candidates: int = Field(
        20_000,
        ge=1,
        description="NodeNames or Nodes items per filter/prioritize call; more get HTTP 400 (kube-scheduler "
        "sends at most the cluster's nodes, and Kubernetes' scalability limit is 5,000)",
    )
    heavy_body_bytes: int = Field(
        1 << 20,
        ge=1024,
        description="a body larger than this is heavy: parsing it costs up to ~20x its size in memory, so "
        "only maxHeavyInFlight are read and decided at once (5,000 NodeNames are ~100 KiB)",
    )
    max_heavy_in_flight: int = Field(
        1,
        ge=1,
        description="heavy bodies read, parsed and decided at once; the others wait, within "
        "verbTimeoutSeconds, and are then answered in the verb's own terms (kube-scheduler retries)",
    )

    @field_validator("prices")
    @classmethod
    def _unique_prices(cls, prices: list[Price]) -> list[Price]:
        seen: set[tuple[str, str]] = set()
        for row in prices:
            key = (row.instance_type, row.capacity_type)
            if key in seen:
                raise ValueError(f"price of {key[0]} ({key[1]}) is given twice")
            seen.add(key)
        return prices

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Explicit values, then the environment, then the `--config` YAML file."""
        return init_settings, env_settings, _YamlSource(settings_cls, _CONFIG_FILE.get())

    # ------------------------------------------------------------------ derived
    def gpupack_args(self) -> GpupackArgs:
        """Arguments of the gpupack policy."""
        mix = self.policy.mix
        return GpupackArgs(
            weights=self.policy.weights,
            forbid_spot_for_non_interruptible=self.spot.non_interruptible_on_spot == "forbid",
            mix_half_life=mix.half_life,
            mix_coverage=mix.coverage,
            mix_prior_weight=mix.prior_weight,
            mix_with_memory=mix.with_memory,
            mix_whole_weight=mix.whole_weight,
        )

    def policy_spec(self) -> PolicySpec:
        """The policy the engine runs."""
        if self.policy.name == "gpupack":
            return gpupack(self.gpupack_args())
        return baseline(self.policy.name)

    def price_table(self) -> dict[tuple[str, str], float]:
        """(instance type, "spot" | "on-demand") -> hourly price, as node_facts takes it."""
        return {(row.instance_type, row.capacity_type): row.hourly for row in self.prices}


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Settings from `config_file` (optional), the environment and `overrides` (None values are ignored).

    Raises SettingsError with every problem named by its key.
    """
    values = {key: value for key, value in overrides.items() if value is not None}
    token = _CONFIG_FILE.set(Path(config_file) if config_file else None)
    try:
        return Settings(**values)
    except ValidationError as exc:
        where = f"config {config_file} / environment GPUPACK_*" if config_file else "environment GPUPACK_*"
        spelled = _spelled_keys(_read_raw_yaml(Path(config_file))) if config_file else {}
        raise SettingsError(f"{where}: {_describe(exc, spelled)}") from None
    finally:
        _CONFIG_FILE.reset(token)


class _YamlSource(PydanticBaseSettingsSource):
    """The `--config` YAML file, camelCase keys turned into field names."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self._data = _read_yaml(path) if path else {}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """Unused: `__call__` hands over the whole file."""
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self._data


def _read_yaml(path: Path) -> dict[str, Any]:
    return _snake_keys(_read_raw_yaml(path))


def _read_raw_yaml(path: Path) -> dict[str, Any]:
    """The file's mapping as written (camelCase keys)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"config {path}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"config {path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"config {path}: expected a mapping of options, got {type(data).__name__}")
    return data


_CAMEL_1 = re.compile(r"([a-z0-9])([A-Z])")
_CAMEL_2 = re.compile(r"([A-Z]+)([A-Z][a-z])")


def snake_case(key: str) -> str:
    """`reservationTTLSeconds` -> `reservation_ttl_seconds`, `modelFit` -> `model_fit`."""
    return _CAMEL_1.sub(r"\1_\2", _CAMEL_2.sub(r"\1_\2", key)).lower()


_ACRONYMS = {"ttl": "TTL"}  # written in capitals in the YAML (`reservationTTLSeconds`)


def camel_case(field: str) -> str:
    """A field name as the YAML writes it: `reservation_ttl_seconds` -> `reservationTTLSeconds`."""
    head, *rest = field.split("_")
    return head + "".join(_ACRONYMS.get(word, word.capitalize()) for word in rest)


def _spelled_keys(value: Any) -> dict[str, str]:
    """snake_case -> the key as the YAML spells it, for every mapping key at any depth."""
    spelled: dict[str, str] = {}
    if isinstance(value, dict):
        for key, item in value.items():
            spelled[snake_case(str(key))] = str(key)
            spelled.update(_spelled_keys(item))
    elif isinstance(value, list):
        for item in value:
            spelled.update(_spelled_keys(item))
    return spelled


def _snake_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {snake_case(str(k)): _snake_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_snake_keys(v) for v in value]
    return value


def _describe(exc: ValidationError, spelled: dict[str, str]) -> str:
    """Every problem, its key path in the YAML's spelling: as the file wrote it, else camelCase."""

    def key(part: str | int) -> str:
        return str(part) if isinstance(part, int) else spelled.get(part) or camel_case(part)

    return "; ".join(
        f"{'.'.join(key(part) for part in error['loc']) or 'settings'}: {error['msg']}"
        for error in exc.errors(include_url=False)
    )
