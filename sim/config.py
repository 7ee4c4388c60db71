"""Typed configuration: ``config.toml`` layers merged and validated once, strictly.

Layers, later wins: built-in defaults (``sim/defaults.toml``, identical to the shipped
``config.toml``) < ``--config FILE`` or ``./config.toml`` < the world's ``config.toml`` <
command-line overrides. Each file is validated as it is merged, so an error names the file
that holds the bad key.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.errors import InputError
from sim.llm.types import CallSettings, StructuredOutput

PHASE_SECTIONS = ("phase1", "phase2a", "phase2b", "phase4")
PHASE_ALIASES = {
    "intentions": "phase1",
    "resolution": "phase2a",
    "narrative": "phase2b",
    "memory": "phase4",
}
PROVIDERS = ("offline", "openai", "chat")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LLMConfig(_Strict):
    provider: str = "offline"
    chain_mode: Literal["window", "server"] = "window"
    max_concurrency: int = Field(16, ge=1, le=10_000)
    timeout_seconds: float = Field(600, gt=0)
    connect_timeout_seconds: float = Field(10, gt=0)
    first_token_timeout_seconds: float = Field(300, gt=0)
    idle_timeout_seconds: float = Field(60, gt=0)
    stream: bool = False
    structured_output: StructuredOutput = "auto"
    base_url: str = ""
    api_key_env: str = Field("OPENAI_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    requests_per_minute: int = Field(0, ge=0)
    tokens_per_minute: int = Field(0, ge=0)
    max_failed_fraction: float = Field(0.25, ge=0.0, le=1.0)
    transient_retries: int = Field(2, ge=0, le=20)
    backoff_base_seconds: float = Field(0.5, ge=0)
    backoff_cap_seconds: float = Field(20, ge=0)
    breaker_threshold: int = Field(5, ge=1)
    breaker_cooldown_seconds: float = Field(30, ge=0)


class BudgetConfig(_Strict):
    max_total_tokens: int = Field(0, ge=0)
    max_cost_usd: float = Field(0.0, ge=0.0)


class PriceConfig(_Strict):
    input: float = Field(0.0, ge=0.0)
    cached_input: float = Field(0.0, ge=0.0)
    output: float = Field(0.0, ge=0.0)


DEFAULT_PRICES = {
    "offline": PriceConfig(),
    "gpt-4.1": PriceConfig(input=2.0, cached_input=0.5, output=8.0),
    "gpt-4.1-mini": PriceConfig(input=0.4, cached_input=0.1, output=1.6),
    "gpt-4.1-nano": PriceConfig(input=0.1, cached_input=0.025, output=0.4),
    "gpt-4o-mini": PriceConfig(input=0.15, cached_input=0.075, output=0.6),
}


class PhaseConfig(_Strict):
    model: str = Field("gpt-4.1-mini", min_length=1)
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    max_output_tokens: int = Field(800, gt=0)
    response_chain_depth: int = Field(0, ge=0)
    fallback_models: tuple[str, ...] = ()
    #: this phase's structured-output form; unset: ``[llm] structured_output``
    structured_output: StructuredOutput | None = None

    def settings(self, llm: LLMConfig) -> CallSettings:
        return CallSettings(
            model=self.model,
            temperature=self.temperature,
            max_output_tokens=self.max_output_tokens,
            timeout_seconds=llm.timeout_seconds,
            first_token_timeout_seconds=llm.first_token_timeout_seconds,
            idle_timeout_seconds=llm.idle_timeout_seconds,
            stream=llm.stream,
            fallback_models=self.fallback_models,
            structured_output=self.structured_output or llm.structured_output,
        )


class HistoryConfig(_Strict):
    keep_ticks: int = Field(0, ge=0)


class Phase1Config(PhaseConfig):
    #: schema: answer an Intention; tools: choose one of move_to/say/act/wait
    mode: Literal["schema", "tools"] = "schema"


class Config(_Strict):
    llm: LLMConfig = LLMConfig()
    budget: BudgetConfig = BudgetConfig()
    prices: dict[str, PriceConfig] = Field(default_factory=lambda: dict(DEFAULT_PRICES))
    phase1: Phase1Config = Phase1Config(temperature=0.8, max_output_tokens=400)
    phase2a: PhaseConfig = PhaseConfig(max_output_tokens=900, response_chain_depth=2)
    phase2b: PhaseConfig = PhaseConfig(temperature=0.9, max_output_tokens=500)
    phase4: PhaseConfig = PhaseConfig(temperature=0.3, max_output_tokens=400)
    history: HistoryConfig = HistoryConfig()

    def phase(self, section: str) -> PhaseConfig:
        value = getattr(self, section)
        assert isinstance(value, PhaseConfig)
        return value


def phase_section(name: str) -> str:
    """Map ``phase2a`` or ``resolution`` to the config section name; raise on anything else."""
    section = PHASE_ALIASES.get(name, name)
    if section not in PHASE_SECTIONS:
        choices = ", ".join((*PHASE_SECTIONS, *PHASE_ALIASES))
        raise InputError(None, "--depth", f"unknown phase {name!r}; expected one of: {choices}")
    return section


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise InputError(path, None, "config file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(path, None, f"not valid TOML: {exc}") from None


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _validate(data: Mapping[str, Any], source: Path | None) -> Config:
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        problem = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].lower()
        got = err.get("input")
        if err["type"] != "extra_forbidden" and not isinstance(got, Mapping):
            problem += f" (got {got!r})"
        raise InputError(source, field, problem) from None
    if config.llm.provider not in PROVIDERS:
        raise InputError(
            source,
            "llm.provider",
            f"unknown provider {config.llm.provider!r}; expected one of: {', '.join(PROVIDERS)}",
        )
    return config


def defaults_data() -> dict[str, Any]:
    text = resources.files("sim").joinpath("defaults.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def load_config(
    config_file: Path | None = None,
    world_dir: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    cwd: Path | None = None,
) -> Config:
    """Build the effective config from its layers (see the module docstring).

    Raises:
        InputError: a file is missing or malformed, a key is unknown, a value out of range.
    """
    data = defaults_data()
    layers: list[Path] = []
    if config_file is not None:
        layers.append(config_file)
    else:
        local = (cwd or Path.cwd()) / "config.toml"
        if local.is_file():
            layers.append(local)
    if world_dir is not None and (world_dir / "config.toml").is_file():
        layers.append(world_dir / "config.toml")
    for path in layers:
        data = _merge(data, _read_toml(path))
        _validate(data, path)
    if overrides:
        data = _merge(data, overrides)
    return _validate(data, None)


def redacted(config: Config) -> dict[str, Any]:
    """The config as plain data, safe to log (holds no secrets by construction)."""
    return config.model_dump(mode="json")
