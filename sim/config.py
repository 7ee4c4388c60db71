"""Typed configuration: ``config.toml`` layers merged and validated once, strictly.

Layers, later wins: built-in defaults (``sim/defaults.toml``, identical to the shipped
``config.toml``) < ``--config FILE`` or ``./config.toml`` < the world's ``config.toml`` <
command-line overrides. Each file is validated as it is merged, so an error names the file
that holds the bad key, and every error of every file is reported at once.

Types are strict (``"16"`` or ``true`` is not a number) and numbers finite. A world's own
``config.toml`` is untrusted (worlds are shared): it may not change where requests go or
which credential they carry (``ROUTING_KEYS``) unless the user trusts it
(``--trust-world-config``) or sets the same value in their own config.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    ValidationError,
)

from sim.errors import InputError
from sim.llm.types import CallSettings, ModelTarget, StructuredOutput

PHASE_SECTIONS = ("phase1", "phase2a", "phase2b", "phase4")
PHASE_ALIASES = {
    "intentions": "phase1",
    "resolution": "phase2a",
    "narrative": "phase2b",
    "memory": "phase4",
}
PROVIDERS = ("offline", "openai", "chat", "gemini", "anthropic")
#: providers that keep response chains on their server (``chain_mode = "server"``)
SERVER_CHAIN_PROVIDERS = ("openai",)
#: the built-in phases, in their default order
BUILTIN_PHASES = ("intentions", "resolution", "narrative", "apply", "memory")
DEFAULT_ORDER = BUILTIN_PHASES
#: phase and verb names: they become chain keys (``opinion:{id}``) and file names
NAME_PATTERN = r"^[a-z][a-z0-9_]{0,39}$"
#: config keys that decide where requests (and the API key) go. The trust rule for world
#: configs applies to every key whose last part is in this set, wherever it appears:
#: ``llm.*``, ``phase1.*`` .. ``phase4.*`` and ``phases.<name>.*``.
ENDPOINT_KEYS = frozenset({"provider", "base_url", "api_key_env"})
#: ... and these too (a future ``api_key``, ``organization``, ``headers``), plus anything
#: under ``[providers.*]``: a world's config may not set them on its own
ROUTING_KEYS = ENDPOINT_KEYS | {"api_key", "organization", "headers"}
ROUTING_TABLES = frozenset({"providers"})
#: a ``[providers.NAME]`` name: what a qualified model string starts with (``local/qwen``)
PROVIDER_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,39}$"


def _distinct_urls(value: str | tuple[str, ...]) -> str | tuple[str, ...]:
    if isinstance(value, tuple):
        if not value:
            raise ValueError("expected at least one URL (or a single URL as a string)")
        if any(not url for url in value):
            raise ValueError("expected non-empty URLs")
        if len(set(value)) != len(value):
            raise ValueError("a URL is listed twice")
    return value


#: ``base_url``: one server, or several (a TOML array: a pool, ``sim.llm.pool``); use this
#: type wherever a config section takes a ``base_url``
BaseUrl = Annotated[
    str | Annotated[tuple[str, ...], Strict(False)],  # a TOML array becomes the tuple
    AfterValidator(_distinct_urls),
]


def base_urls(value: str | tuple[str, ...]) -> tuple[str, ...]:
    """The servers a ``base_url`` names: none ("": the provider's default), one, or a pool."""
    if isinstance(value, tuple):
        return value
    return (value,) if value else ()


def describe_base_url(value: str | tuple[str, ...]) -> str:
    """A ``base_url`` for messages: the URL, or a pool's URLs joined by ", "."""
    return ", ".join(value) if isinstance(value, tuple) else value


#: what a failed or denied call does to its tick (``[llm]`` and per phase)
FailurePolicy = Literal["degrade", "fail"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


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
    #: one server, or a list of servers of the same provider (a pool: ``sim.llm.pool``)
    base_url: BaseUrl = ""
    api_key_env: str = Field("OPENAI_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    requests_per_minute: int = Field(0, ge=0)
    tokens_per_minute: int = Field(0, ge=0)
    max_failed_fraction: float = Field(0.25, ge=0.0, le=1.0)
    transient_retries: int = Field(2, ge=0, le=20)
    backoff_base_seconds: float = Field(0.5, ge=0)
    backoff_cap_seconds: float = Field(20, ge=0)
    breaker_threshold: int = Field(5, ge=1)
    breaker_cooldown_seconds: float = Field(30, ge=0)
    #: schema-feedback retries after an answer that does not fit the schema (spec 000: 2)
    json_max_retries: int = Field(2, ge=0, le=10)
    #: degrade: a failed or denied call falls back for its entity (bounded by
    #: max_failed_fraction); fail: the first one leaves the tick uncommitted
    llm_failure_policy: FailurePolicy = "degrade"
    #: send each phase's calls as one OpenAI Batch API batch (half price, hours of waiting)
    batch: bool = False
    #: seconds between two polls of a batch in progress
    batch_poll_seconds: float = Field(30, gt=0)


#: providers whose wire format the Batch API takes (``[llm] batch``)
BATCH_PROVIDERS = ("openai", "chat")


class ProviderConfig(_Strict):
    """``[providers.NAME]``: a named endpoint, used by qualified models (``NAME/model``).

    Unset optional keys take ``[llm]``'s value; ``api_key_env`` left empty is the kind's
    own variable (``OPENAI_API_KEY``, ``GEMINI_API_KEY``, ``ANTHROPIC_API_KEY``).
    """

    kind: str
    base_url: BaseUrl = ""
    api_key_env: str = Field("", pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")
    #: how a ``chat`` endpoint is asked for the schema; unset: the phase's (or [llm]'s)
    structured_output: StructuredOutput | None = None
    max_concurrency: int | None = Field(None, ge=1, le=10_000)
    requests_per_minute: int | None = Field(None, ge=0)
    tokens_per_minute: int | None = Field(None, ge=0)


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
    # Gemini API list prices entered on 2026-11-23 (2.5 Pro: prompts up to 200k tokens);
    # check them against Google's pricing page
    "gemini-2.5-pro": PriceConfig(input=1.25, cached_input=0.125, output=10.0),
    "gemini-2.5-flash": PriceConfig(input=0.3, cached_input=0.03, output=2.5),
    "gemini-2.5-flash-lite": PriceConfig(input=0.1, cached_input=0.01, output=0.4),
    "gemini-2.0-flash": PriceConfig(input=0.1, cached_input=0.025, output=0.4),
    # Anthropic list prices entered on 2026-11-23 (Sonnet: prompts up to 200k tokens;
    # cache reads as cached_input, cache writes priced as input): check Anthropic's pricing page
    "claude-opus-4-5": PriceConfig(input=5.0, cached_input=0.5, output=25.0),
    "claude-opus-4-1": PriceConfig(input=15.0, cached_input=1.5, output=75.0),
    "claude-sonnet-4-5": PriceConfig(input=3.0, cached_input=0.3, output=15.0),
    "claude-haiku-4-5": PriceConfig(input=1.0, cached_input=0.1, output=5.0),
}


#: (provider, base_url, api_key_env): where a phase's requests go
PhaseEndpoint = tuple[str, str | tuple[str, ...], str]


class PhaseConfig(_Strict):
    model: str = Field("gpt-4.1-mini", min_length=1)
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    max_output_tokens: int = Field(800, gt=0)
    response_chain_depth: int = Field(0, ge=0)
    fallback_models: tuple[str, ...] = Field((), strict=False)  # a TOML array
    #: this phase's structured-output form; unset: ``[llm] structured_output``
    structured_output: StructuredOutput | None = None
    #: this phase's provider, server and key variable ("" = [llm]'s): endpoint keys
    #: (ENDPOINT_KEYS), under the trust rule for world configs
    provider: str = ""
    base_url: BaseUrl = ""
    api_key_env: str = Field("", pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")
    #: this phase's failure policy; unset: ``[llm] llm_failure_policy``
    llm_failure_policy: FailurePolicy | None = None

    def failure_policy(self, llm: LLMConfig) -> FailurePolicy:
        """``degrade`` or ``fail``: this phase's, else ``[llm]``'s."""
        return self.llm_failure_policy or llm.llm_failure_policy

    def endpoint(self, llm: LLMConfig) -> PhaseEndpoint:
        """(provider, base_url, api_key_env) this phase's requests go to. A phase that
        names another provider does not inherit [llm]'s server."""
        key = self.api_key_env or llm.api_key_env
        if self.provider and self.provider != llm.provider:
            return self.provider, self.base_url, key
        return llm.provider, self.base_url or llm.base_url, key

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


class PolicyConfig(_Strict):
    """``[policy]``: the gates every LLM call passes before it is sent (docs/policies.md)."""

    #: the models calls may use (a call's model and its fallback_models); empty: any
    allowed_models: tuple[str, ...] = Field((), strict=False)  # a TOML array
    #: a tick whose estimated cost exceeds this asks a person once before its first
    #: call; 0: never asks
    approve_above_usd: float = Field(0.0, ge=0.0)
    #: calls about one character or location in one tick, all phases together; 0: no limit
    max_calls_per_entity_per_tick: int = Field(0, ge=0)
    #: policies from the ``sim.policies`` entry-point group, by name, asked in this order
    custom: tuple[Annotated[str, StringConstraints(min_length=1)], ...] = Field((), strict=False)


class HistoryConfig(_Strict):
    #: logs of the last N ticks are kept (0: all)
    keep_ticks: int = Field(0, ge=0)
    #: Zstandard level of a committed tick's log (1 fastest .. 19 smallest; 0 leaves it plain)
    compress_level: int = Field(3, ge=0, le=19)


class LimitsConfig(_Strict):
    #: the largest entity file loaded; a larger one is refused by name
    max_entity_bytes: int = Field(8 * 1024 * 1024, ge=1024)


class Phase1Config(PhaseConfig):
    #: schema: answer an Intention; tools: choose one of move_to/say/act/wait
    mode: Literal["schema", "tools"] = "schema"
    #: tools mode: how many look/recall/inventory steps a character may take before acting
    max_tool_steps: int = Field(3, ge=0, le=10)


class TickConfig(_Strict):
    #: the phases of a tick, in order: built-ins by name, declared ones by their section
    phases: tuple[str, ...] = Field(DEFAULT_ORDER, strict=False)  # a TOML array


class DeclaredPhaseConfig(PhaseConfig):
    """``[phases.<name>]``: a phase the world declares (or settings for a Python phase).

    For a phase declared in TOML, ``instructions`` and ``schema`` are required; a phase
    from the ``sim.phases`` entry-point group brings its own and takes only the settings.
    """

    per: Literal["character", "location", "world"] = "character"
    instructions: str = ""
    input: str = ""
    schema_: str = Field("", alias="schema")
    writes: dict[str, str] = Field(default_factory=dict)
    mode: Literal["schema"] = "schema"
    #: tools from the engine's registry the model may call before answering (look, recall,
    #: inventory), each answered by the engine; then it answers by calling ``answer``
    tools: tuple[str, ...] = Field((), strict=False)  # a TOML array
    #: with ``tools``: how many query steps a subject may take before it must answer
    max_tool_steps: int = Field(3, ge=0, le=10)

    model_config = ConfigDict(populate_by_name=True)  # merged with _Strict's


VerbName = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
ProviderName = Annotated[str, StringConstraints(pattern=PROVIDER_NAME_PATTERN)]


class Config(_Strict):
    llm: LLMConfig = LLMConfig()
    budget: BudgetConfig = BudgetConfig()
    #: named endpoints (``[providers.local]``), for ``local/<model>`` model strings
    providers: dict[ProviderName, ProviderConfig] = Field(default_factory=dict)
    prices: dict[str, PriceConfig] = Field(default_factory=lambda: dict(DEFAULT_PRICES))
    phase1: Phase1Config = Phase1Config(temperature=0.8, max_output_tokens=400)
    phase2a: PhaseConfig = PhaseConfig(max_output_tokens=900, response_chain_depth=2)
    phase2b: PhaseConfig = PhaseConfig(temperature=0.9, max_output_tokens=500)
    phase4: PhaseConfig = PhaseConfig(temperature=0.3, max_output_tokens=400)
    history: HistoryConfig = HistoryConfig()
    policy: PolicyConfig = PolicyConfig()
    limits: LimitsConfig = LimitsConfig()
    tick: TickConfig = TickConfig()
    phases: dict[Annotated[str, StringConstraints(pattern=NAME_PATTERN)], DeclaredPhaseConfig] = (
        Field(default_factory=dict)
    )
    #: verbs the world adds to the intention schema: name -> what it does
    actions: dict[VerbName, Annotated[str, StringConstraints(min_length=1)]] = Field(
        default_factory=dict
    )

    def phase(self, section: str) -> PhaseConfig:
        """A phase's settings by section (``phase2a``, ``phases.opinion``) or by name.

        A Python phase without a ``[phases.<name>]`` section gets the defaults.
        """
        section = PHASE_ALIASES.get(section, section)
        if section in PHASE_SECTIONS:
            value = getattr(self, section)
            assert isinstance(value, PhaseConfig)
            return value
        name = section.removeprefix("phases.")
        return self.phases.get(name) or DeclaredPhaseConfig()

    def call_settings(self, section: str) -> CallSettings:
        """A phase's call settings with its models resolved to where they run: the
        primary's endpoint in ``provider``, the fallbacks as ``ModelTarget``s,
        deduplicated by (provider, normalised model)."""
        phase = self.phase(section)
        primary, *fallbacks = routing(self).candidates(section)
        return replace(
            phase.settings(self.llm),
            model=primary.model,
            provider=primary.provider,
            fallback_models=tuple(fallbacks),
        )

    def with_phase(self, section: str, **update: Any) -> Config:
        """A copy with one phase's settings changed (``sim tune``)."""
        section = PHASE_ALIASES.get(section, section)
        phase = self.phase(section).model_copy(update=update)
        if section in PHASE_SECTIONS:
            return self.model_copy(update={section: phase})
        assert isinstance(phase, DeclaredPhaseConfig)
        name = section.removeprefix("phases.")
        return self.model_copy(update={"phases": {**self.phases, name: phase}})


#: config section -> phase name, for the built-in LLM phases
SECTION_NAMES = {section: name for name, section in PHASE_ALIASES.items()}


def phase_section(name: str, declared: tuple[str, ...] = ()) -> str:
    """Map ``phase2a``, ``resolution`` or a declared phase's name (``opinion`` ->
    ``phases.opinion``) to its config section; raise on anything else."""
    section = PHASE_ALIASES.get(name, name)
    if section in PHASE_SECTIONS:
        return section
    bare = name.removeprefix("phases.")
    if bare in declared and bare not in BUILTIN_PHASES:
        return f"phases.{bare}"
    choices = ", ".join(
        (*PHASE_SECTIONS, *PHASE_ALIASES, *(d for d in declared if d not in BUILTIN_PHASES))
    )
    raise InputError(None, "--depth", f"unknown phase {name!r}; expected one of: {choices}")


def section_name(section: str) -> str:
    """The phase name of a config section (``phase2a`` -> ``resolution``)."""
    return SECTION_NAMES.get(section, section.removeprefix("phases."))


def endpoint_paths(data: Mapping[str, Any]) -> list[str]:
    """Dotted paths of the endpoint keys (``ENDPOINT_KEYS``) a raw config layer sets, e.g.
    ``["llm.base_url", "phases.opinion.provider"]``: what the trust rule checks."""
    out: list[str] = []
    for section, value in data.items():
        if not isinstance(value, Mapping):
            continue
        if section == "phases":
            for name, phase in value.items():
                if isinstance(phase, Mapping):
                    out.extend(f"phases.{name}.{k}" for k in phase if k in ENDPOINT_KEYS)
        elif section == "llm" or section in PHASE_SECTIONS:
            out.extend(f"{section}.{k}" for k in value if k in ENDPOINT_KEYS)
    return out


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise InputError(path, None, "config file not found") from None
    except OSError as exc:
        raise InputError(path, None, f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(path, None, "not UTF-8 text") from None
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


class InvalidConfig(InputError):
    """Every problem found in the config layers, one per line (exit 2)."""

    def __init__(self, problems: list[InputError]) -> None:
        first = problems[0]
        super().__init__(first.path, first.field, first.problem)
        self.problems = problems
        if len(problems) > 1:
            lines = "\n  ".join(str(p) for p in problems)
            self.args = (f"config is invalid ({len(problems)} problems):\n  {lines}",)

    def __str__(self) -> str:
        return str(self.args[0])


def _problems(
    data: Mapping[str, Any], source: Path | None, *, combined: bool = True
) -> list[InputError]:
    """Every validation problem of ``data``, each naming ``source`` and the field."""
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        out: list[InputError] = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            problem = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].lower()
            if err["type"] == "finite_number":
                problem = "expected a finite number"
            got = err.get("input")
            if err["type"] != "extra_forbidden" and not isinstance(got, Mapping):
                problem += f" (got {got!r})"
            out.append(InputError(source, field, problem))
        return out
    problems: list[InputError] = []
    if config.llm.provider not in PROVIDERS:
        problems.append(
            InputError(
                source,
                "llm.provider",
                f"unknown provider {config.llm.provider!r}; "
                f"expected one of: {', '.join(PROVIDERS)}",
            )
        )
    elif config.llm.provider in ("gemini", "anthropic") and config.llm.chain_mode == "server":
        api = "the Gemini API" if config.llm.provider == "gemini" else "the Messages API"
        problems.append(
            InputError(
                source,
                "llm.chain_mode",
                f'server chains are not offered for provider "{config.llm.provider}" ({api} '
                'keeps no responses to chain); use chain_mode = "window"',
            )
        )
    elif (
        combined
        and config.llm.chain_mode == "server"
        and config.llm.provider not in SERVER_CHAIN_PROVIDERS
    ):
        problems.append(
            InputError(
                source,
                "llm.chain_mode",
                f"provider {config.llm.provider!r} cannot keep chains on its server; "
                f'use chain_mode = "window" ("server" needs: '
                f"{', '.join(SERVER_CHAIN_PROVIDERS)})",
            )
        )
    if config.llm.chain_mode == "server" or config.llm.batch:
        pooled = [
            f"{section}.base_url"
            for section in ("llm", *PHASE_SECTIONS, *(f"phases.{n}" for n in config.phases))
            if len(
                base_urls(
                    config.llm.base_url if section == "llm" else config.phase(section).base_url
                )
            )
            > 1
        ]
        if config.llm.batch:  # a named endpoint keeps no server chains, but it batches
            pooled += [
                f"providers.{name}.base_url"
                for name, named in config.providers.items()
                if len(base_urls(named.base_url)) > 1
            ]
        why = (
            "a list of servers cannot keep server-side chains (a response id is known "
            'only to the server that made it); use chain_mode = "window" with a pool'
            if config.llm.chain_mode == "server"
            else "a list of servers cannot take one Batch API upload (a batch lives on the "
            "server that made it); use batch = false with a pool, or one server"
        )
        problems.extend(InputError(source, field, why) for field in pooled)
    if (
        combined
        and config.llm.batch
        and config.llm.provider in PROVIDERS
        and config.llm.provider not in BATCH_PROVIDERS
    ):
        problems.append(
            InputError(
                source,
                "llm.batch",
                f"the Batch API is not offered for provider {config.llm.provider!r}; "
                f"set batch = false or a provider that has it ({', '.join(BATCH_PROVIDERS)})",
            )
        )
    for section in (*PHASE_SECTIONS, *(f"phases.{n}" for n in config.phases)):
        provider = config.phase(section).provider
        if provider and provider not in PROVIDERS:
            problems.append(
                InputError(
                    source,
                    f"{section}.provider",
                    f"unknown provider {provider!r}; expected one of: {', '.join(PROVIDERS)}",
                )
            )
    for name, spec in config.providers.items():
        if name in PROVIDERS or name == "replay":
            problems.append(
                InputError(
                    source,
                    f"providers.{name}",
                    f"{name!r} is a provider kind ({name}/model already means it); "
                    "give the endpoint another name",
                )
            )
        if spec.kind not in PROVIDERS:
            problems.append(
                InputError(
                    source,
                    f"providers.{name}.kind",
                    f"unknown kind {spec.kind!r}; expected one of: {', '.join(PROVIDERS)}",
                )
            )
    for verb in config.actions:
        if verb in ("move", "speak", "act", "wait"):
            problems.append(
                InputError(source, f"actions.{verb}", "a built-in action; choose another verb")
            )
    for name in config.phases:
        if name in BUILTIN_PHASES:
            problems.append(
                InputError(
                    source,
                    f"phases.{name}",
                    "a built-in phase: configure it in its own section "
                    f"([{PHASE_ALIASES.get(name, name)}])"
                    if name in PHASE_ALIASES
                    else "a built-in phase without settings",
                )
            )
    return problems


def _validate(data: Mapping[str, Any], source: Path | None) -> Config:
    problems = _problems(data, source)
    if problems:
        raise InvalidConfig(problems)
    return Config.model_validate(data)


def _routing_settings(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value of every routing setting in a config layer."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if (not prefix and key in ROUTING_TABLES) or key in ROUTING_KEYS:
            out[dotted] = value
        elif isinstance(value, Mapping):
            out.update(_routing_settings(value, f"{dotted}."))
    return out


def _lookup(data: Mapping[str, Any], dotted: str) -> Any:
    value: Any = data
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


_MISSING = object()


def _untrusted_routing(
    world: Mapping[str, Any],
    users: Mapping[str, Any],
    source: Path,
    flags: Mapping[str, Any],
) -> list[InputError]:
    """A problem for each routing setting the world's config changes from the user's (a
    setting the user's flags override is moot)."""
    problems: list[InputError] = []
    for dotted, value in _routing_settings(world).items():
        if _lookup(flags, dotted) is not _MISSING:
            continue  # the command line decides this one
        if dotted.rpartition(".")[2] == "provider" and value == "offline":
            continue  # the one choice that sends nothing and carries no key
        chosen = _lookup(users, dotted)
        if chosen == value or (chosen is _MISSING and value == ""):
            continue  # the user chose the same thing (or the world restates the default)
        problems.append(
            InputError(
                source,
                dotted,
                "a world's config may not change where requests go or which credential "
                "they carry; set it in your own config (--config or ./config.toml) or pass "
                "--trust-world-config if you trust this world",
            )
        )
    return problems


def _phase_layers(data: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Section -> settings of every phase section a raw config layer sets."""
    out: dict[str, Mapping[str, Any]] = {}
    for section in PHASE_SECTIONS:
        if isinstance(data.get(section), Mapping):
            out[section] = data[section]
    declared = data.get("phases")
    if isinstance(declared, Mapping):
        for name, value in declared.items():
            if isinstance(value, Mapping):
                out[f"phases.{name}"] = value
    return out


def _untrusted_models(
    world: Mapping[str, Any],
    users: Mapping[str, Any],
    source: Path,
    flags: Mapping[str, Any],
) -> list[InputError]:
    """A problem for each model string in the world's config qualified with an endpoint the
    user did not choose: a kind other than ``offline`` and the user's ``[llm] provider``
    (``openai/gpt-4.1`` would send ``OPENAI_API_KEY`` to OpenAI). A provider name only the
    world declares is reported by its ``[providers.*]`` table (``_untrusted_routing``)."""
    chosen_kind = _lookup(flags, "llm.provider")  # --provider, else the user's config
    if chosen_kind is _MISSING:
        chosen_kind = _lookup(users, "llm.provider")
    declared = users.get("providers")
    chosen_names = set(declared) if isinstance(declared, Mapping) else set()
    problems: list[InputError] = []
    for section, settings in _phase_layers(world).items():
        for key in ("model", "fallback_models"):
            if key not in settings or _lookup(flags, f"{section}.{key}") is not _MISSING:
                continue
            value = settings[key]
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, (list, tuple)):
                continue  # a type error, reported by validation
            for name in names:
                if not isinstance(name, str):
                    continue
                head, slash, rest = name.strip().partition("/")
                if not slash or not rest.strip() or head in chosen_names:
                    continue
                if head not in PROVIDERS or head in ("offline", chosen_kind):
                    continue  # a bare name, or an endpoint the user's config chose
                problems.append(
                    InputError(
                        source,
                        f"{section}.{key}",
                        f"{name!r} runs on {head!r}, an endpoint your config does not use: "
                        "a world's config may not change where requests go or which "
                        "credential they carry; set it in your own config (--config or "
                        "./config.toml) or pass --trust-world-config if you trust this world",
                    )
                )
    return problems


def _untrusted_policy(
    world: Mapping[str, Any], users: Mapping[str, Any], source: Path
) -> list[InputError]:
    """A problem for each ``[policy]`` key a world's config changes from the user's: the
    gates are the user's safety (what may be spent, on which models), so a shared world
    may not lift them on its own."""
    table = world.get("policy")
    if not isinstance(table, Mapping):
        return []
    mine = users.get("policy")
    mine = mine if isinstance(mine, Mapping) else {}
    problems: list[InputError] = []
    for key, value in table.items():
        if key in mine and mine[key] == value:
            continue  # the user chose the same (or the world restates the default)
        problems.append(
            InputError(
                source,
                f"policy.{key}",
                "a world's config may not change the policy gates (docs/policies.md); "
                "set it in your own config (--config or ./config.toml) or pass "
                "--trust-world-config if you trust this world",
            )
        )
    return problems


#: the model of a gemini phase whose model was left at the built-in default, when
#: ``GEMINI_MODEL`` is unset
GEMINI_DEFAULT_MODEL = "gemini-2.5-flash"


def provider_models(config: Config, environ: Mapping[str, str]) -> Config:
    """The config with the provider's default model where a phase did not choose one.

    With ``provider = "gemini"``, a phase whose ``model`` is still the built-in default
    (no config file, world config or ``--model`` changed it) uses ``$GEMINI_MODEL``, or
    ``gemini-2.5-flash`` when that is unset or empty; a model set anywhere is kept as is,
    and so are ``fallback_models``. Other providers are left unchanged.
    """
    if config.llm.provider != "gemini":
        return config
    model = environ.get("GEMINI_MODEL", "").strip() or GEMINI_DEFAULT_MODEL
    defaults = Config.model_validate(defaults_data())
    update: dict[str, Any] = {
        section: config.phase(section).model_copy(update={"model": model})
        for section in PHASE_SECTIONS
        if config.phase(section).model == defaults.phase(section).model
    }
    default_model = DeclaredPhaseConfig().model
    declared = {
        name: phase.model_copy(update={"model": model}) if phase.model == default_model else phase
        for name, phase in config.phases.items()
    }
    if declared:
        update["phases"] = declared
    return config.model_copy(update=update)


def defaults_data() -> dict[str, Any]:
    text = resources.files("sim").joinpath("defaults.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def load_config(
    config_file: Path | None = None,
    world_dir: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    cwd: Path | None = None,
    *,
    trust_world_config: bool = False,
) -> Config:
    """Build the effective config from its layers (see the module docstring).

    Args:
        trust_world_config: let the world's ``config.toml`` set ``ROUTING_KEYS``.

    Raises:
        InputError: a file is missing or malformed, a key is unknown, a value out of range,
            a world's config sets where requests go (``InvalidConfig`` lists every problem).
    """
    defaults = defaults_data()
    data = defaults
    layers: list[tuple[Path, bool]] = []
    if config_file is not None:
        layers.append((config_file, False))
    else:
        local = (cwd or Path.cwd()) / "config.toml"
        if local.is_file():
            layers.append((local, False))
    if world_dir is not None:
        world_config = world_dir / "config.toml"
        if world_config.is_symlink() or world_config.exists():
            layers.append((world_config, True))
    problems: list[InputError] = []
    for path, is_world in layers:
        layer = _read_world_toml(path) if is_world else _read_toml(path)
        if is_world and not trust_world_config:  # the user's layers and flags decide
            problems.extend(_untrusted_routing(layer, data, path, overrides or {}))
            problems.extend(_untrusted_models(layer, data, path, overrides or {}))
            problems.extend(_untrusted_policy(layer, data, path))
        merged = _merge(data, layer)
        # each layer on top of the defaults alone: a problem is reported once, by its file
        problems.extend(_problems(_merge(defaults, layer), path, combined=False))
        data = merged
    if problems:
        raise InvalidConfig(problems)
    if overrides:
        data = _merge(data, overrides)
    return provider_models(_validate(data, None), os.environ)


def _read_world_toml(path: Path) -> dict[str, Any]:
    """A world's ``config.toml``: a regular file inside the world, read without following
    a link, size-limited."""
    from sim import safefs

    try:
        raw = safefs.read_file(path.parent, path.name, 1024 * 1024)
    except FileNotFoundError:
        raise InputError(path, None, "config file not found") from None
    except OSError as exc:
        raise InputError(path, None, f"cannot read: {exc.strerror}") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(path, None, "not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(path, None, f"not valid TOML: {exc}") from None


def endpoint(config: Config) -> tuple[str, str | None]:
    """(where [llm]'s requests go, the environment variable whose key they carry) — never
    the key."""
    llm = config.llm
    return _describe_endpoint(llm.provider, llm.base_url, llm.api_key_env)


def phase_endpoints(config: Config) -> dict[str, tuple[str, str | None]]:
    """Phase name -> (url, key variable) for each phase whose model runs elsewhere than
    [llm]'s endpoint (its own ``provider``/``base_url``, or a qualified model)."""
    main = endpoint(config)
    table = routing(config)
    out: dict[str, tuple[str, str | None]] = {}
    for section in (*PHASE_SECTIONS, *(f"phases.{n}" for n in config.phases)):
        spec = table.endpoints[table.candidates(section)[0].provider]
        where = _describe_endpoint(spec.kind, spec.base_url, spec.api_key_env)
        if where != main:
            out[section_name(section)] = where
    return out


def named_endpoints(config: Config) -> dict[str, tuple[str, str | None]]:
    """Endpoint name -> (url, key variable) of every endpoint the phases' models (fallback
    models included) use besides [llm]'s: what ``sim check`` lists."""
    table = routing(config)
    return {
        spec.name: _describe_endpoint(spec.kind, spec.base_url, spec.api_key_env)
        for spec in table.used()
        if spec.name != table.default
    }


def _describe_endpoint(
    provider: str, base_url: str | tuple[str, ...], key_env: str
) -> tuple[str, str | None]:
    """The SDKs fall back to their own endpoint (the openai SDK to ``OPENAI_BASE_URL`` first)
    when ``base_url`` is empty; this says which one applies. A pool's URLs are joined."""
    import os

    if isinstance(base_url, tuple):
        base_url = describe_base_url(base_url)
    if provider == "offline":
        return "none (offline provider: no network)", None
    if provider in ("gemini", "anthropic"):
        from sim.llm.stack import endpoint_url

        own = "GEMINI_API_KEY" if provider == "gemini" else "ANTHROPIC_API_KEY"
        return endpoint_url(provider, base_url), own if key_env == "OPENAI_API_KEY" else key_env
    url = base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
    if not base_url and os.environ.get("OPENAI_BASE_URL"):
        url += " (from OPENAI_BASE_URL)"
    return url, key_env


def redacted(config: Config) -> dict[str, Any]:
    """The config as plain data, safe to log (holds no secrets by construction)."""
    return config.model_dump(mode="json", by_alias=True)


# -- where a model runs -------------------------------------------------------------------

#: each kind's own key variable (``[llm] api_key_env``'s default names OpenAI's)
KIND_KEY_ENV = {
    "openai": "OPENAI_API_KEY",
    "chat": "OPENAI_API_KEY",
    "gemini": "GEMINI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "offline": "",
}


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """One endpoint requests can go to, resolved from the config: ``[llm]``'s (named by its
    kind), a kind's SDK default, a ``[providers.NAME]``, or a phase's own
    ``provider``/``base_url``/``api_key_env`` (named ``KIND@SECTION``)."""

    name: str
    kind: str
    #: one server, or a pool's (``sim.llm.pool``)
    base_url: str | tuple[str, ...] = ""
    api_key_env: str = ""
    #: the endpoint's own structured-output form (``None``: the phase's)
    structured_output: StructuredOutput | None = None
    max_concurrency: int = 16
    requests_per_minute: int = 0
    tokens_per_minute: int = 0

    def where(self) -> tuple[str, str | tuple[str, ...], str]:
        """What makes two endpoints the same connection: kind, server and key variable."""
        return self.kind, self.base_url, self.api_key_env


def own_key_env(kind: str, key_env: str) -> str:
    """``key_env`` for ``kind``, with the built-in default (OpenAI's variable) read as
    the kind's own (``GEMINI_API_KEY`` for gemini)."""
    if not key_env or (key_env == KIND_KEY_ENV["openai"] and kind in ("gemini", "anthropic")):
        return KIND_KEY_ENV.get(kind, "")
    return key_env


def normalised_model(model: str) -> str:
    """A model name as candidates are compared: case and surrounding whitespace ignored."""
    return model.strip().casefold()


@dataclass(frozen=True)
class Routing:
    """Every endpoint the config's phases use, and each phase's candidate models.

    Built by ``routing(config)``; ``sim.llm.stack`` builds one adapter stack per endpoint.
    """

    default: str
    endpoints: dict[str, EndpointSpec]
    phases: dict[str, tuple[ModelTarget, ...]] = field(default_factory=dict)

    def candidates(self, section: str) -> tuple[ModelTarget, ...]:
        """A phase's model, then its fallback models, each once. A Python phase without a
        ``[phases.<name>]`` section has the default model on the default endpoint."""
        found = self.phases.get(PHASE_ALIASES.get(section, section))
        return found or (ModelTarget(self.default, DeclaredPhaseConfig().model),)

    def used(self) -> list[EndpointSpec]:
        """The default endpoint and every endpoint a phase's candidates name, in order."""
        names = dict.fromkeys(
            [self.default, *(t.provider for ts in self.phases.values() for t in ts)]
        )
        return [self.endpoints[name] for name in names]


def llm_endpoint(config: Config) -> EndpointSpec:
    """``[llm]``'s endpoint, named by its kind."""
    llm = config.llm
    return EndpointSpec(
        llm.provider,
        llm.provider,
        llm.base_url,
        own_key_env(llm.provider, llm.api_key_env),
        None,
        llm.max_concurrency,
        llm.requests_per_minute,
        llm.tokens_per_minute,
    )


def kind_endpoint(config: Config, kind: str) -> EndpointSpec:
    """``KIND/`` as a prefix: ``[llm]``'s endpoint when it is of that kind, else the kind's
    SDK default (its default server and key variable) with ``[llm]``'s pacing."""
    if kind == config.llm.provider:
        return llm_endpoint(config)
    llm = config.llm
    return EndpointSpec(
        kind,
        kind,
        "",
        KIND_KEY_ENV.get(kind, ""),
        None,
        llm.max_concurrency,
        llm.requests_per_minute,
        llm.tokens_per_minute,
    )


def named_endpoint(config: Config, name: str) -> EndpointSpec:
    """``[providers.NAME]``, its unset keys taken from ``[llm]``."""
    spec = config.providers[name]
    llm = config.llm

    def pick(value: int | None, default: int) -> int:
        return default if value is None else value

    return EndpointSpec(
        name,
        spec.kind,
        spec.base_url,
        own_key_env(spec.kind, spec.api_key_env),
        spec.structured_output,
        pick(spec.max_concurrency, llm.max_concurrency),
        pick(spec.requests_per_minute, llm.requests_per_minute),
        pick(spec.tokens_per_minute, llm.tokens_per_minute),
    )


def phase_home(config: Config, section: str) -> EndpointSpec:
    """Where a phase's bare model names run: ``[llm]``'s endpoint, unless the phase sets
    ``provider``/``base_url``/``api_key_env`` (sugar for an endpoint of its own, named
    ``KIND@SECTION``, or the kind's endpoint when it is the same connection)."""
    phase = config.phase(section)
    main = llm_endpoint(config)
    if not (phase.provider or phase.base_url or phase.api_key_env):
        return main
    kind, base_url, key_env = phase.endpoint(config.llm)
    key_env = own_key_env(kind, key_env)
    if (kind, base_url, key_env) == main.where():
        return main
    same_kind = kind_endpoint(config, kind)
    if (kind, base_url, key_env) == same_kind.where():
        return same_kind
    return replace(same_kind, name=f"{kind}@{section}", base_url=base_url, api_key_env=key_env)


def resolve_model(config: Config, name: str, home: EndpointSpec | None = None) -> ModelTarget:
    """Where a model string runs (the rule ``docs/providers.md`` documents).

    ``NAME/model`` with ``NAME`` a ``[providers.NAME]`` runs on that endpoint; ``KIND/model``
    with ``KIND`` one of ``PROVIDERS`` on the nearest endpoint of that kind (``home``'s,
    else ``[llm]``'s, else the kind's SDK default). Anything else, including a name whose
    first segment is neither (``meta-llama/Llama-3-8B``, ``models/gemini-2.5-flash``), is a
    bare model on ``home`` (default: ``[llm]``'s endpoint), sent as written. Only the first
    segment is read: ``chat/openai/gpt-oss-20b`` is ``openai/gpt-oss-20b`` on ``chat``.
    """
    home = home or llm_endpoint(config)
    text = name.strip()
    head, slash, rest = text.partition("/")
    rest = rest.strip()
    if slash and rest:
        if head in config.providers:
            return ModelTarget(head, rest)
        if head in PROVIDERS:
            return ModelTarget(home.name if home.kind == head else head, rest)
    return ModelTarget(home.name, text)


def routing(config: Config) -> Routing:
    """Every phase's candidates (model, then fallback models, deduplicated by (provider,
    normalised model)) and the endpoints they run on."""
    main = llm_endpoint(config)
    endpoints: dict[str, EndpointSpec] = {main.name: main}
    phases: dict[str, tuple[ModelTarget, ...]] = {}
    for section in (*PHASE_SECTIONS, *(f"phases.{n}" for n in config.phases)):
        phase = config.phase(section)
        home = phase_home(config, section)
        endpoints.setdefault(home.name, home)
        seen: dict[tuple[str, str], ModelTarget] = {}
        for name in (phase.model, *phase.fallback_models):
            target = resolve_model(config, name, home)
            if target.provider not in endpoints:
                endpoints[target.provider] = (
                    named_endpoint(config, target.provider)
                    if target.provider in config.providers
                    else kind_endpoint(config, target.provider)
                )
            seen.setdefault(target.key(), target)
        phases[section] = tuple(seen.values())
        if section.startswith("phases."):
            phases.setdefault(section.removeprefix("phases."), phases[section])
    return Routing(main.name, endpoints, phases)


def offline_config(config: Config) -> Config:
    """The config with every model on the offline provider (``sim tune``'s estimate): no
    request leaves the process whatever the phases name. Each model string is kept whole
    as the offline model's name (``offline/openai/gpt-4.1``), so its calls are logged under
    the name the config asked for and ``resolve_model(config, name)`` prices them."""
    cleared = {"provider": "", "base_url": "", "api_key_env": ""}

    def offline(phase: PhaseConfig) -> dict[str, Any]:
        return {
            **cleared,
            "model": f"offline/{phase.model.strip()}",
            "fallback_models": tuple(f"offline/{m.strip()}" for m in phase.fallback_models),
        }

    update: dict[str, Any] = {
        "llm": config.llm.model_copy(update={"provider": "offline", "chain_mode": "window"}),
        "providers": {},
        "phases": {n: p.model_copy(update=offline(p)) for n, p in config.phases.items()},
    }
    for section in PHASE_SECTIONS:
        phase = config.phase(section)
        update[section] = phase.model_copy(update=offline(phase))
    return config.model_copy(update=update)
