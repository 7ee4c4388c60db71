"""The config's pydantic models, one per section of ``config.toml``: strict types (``"16"``
or ``true`` is not a number), finite numbers, unknown keys refused, per-phase settings
over ``[llm]``'s defaults."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    field_validator,
)

from sim.config.clock import Clock, parse_duration, parse_start, parse_when
from sim.config.names import (
    DEFAULT_ORDER,
    NAME_PATTERN,
    PHASE_ALIASES,
    PHASE_SECTIONS,
    PROVIDER_NAME_PATTERN,
)
from sim.llm.redact import redact_url
from sim.llm.types import CallSettings, StructuredOutput
from sim.providers import DEFAULT_KIND, profile


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


def _command(value: tuple[str, ...]) -> tuple[str, ...]:
    if value and not value[0].strip():
        raise ValueError("expected the program's name or path first")
    if any("\x00" in arg for arg in value):
        raise ValueError("an argument holds a NUL character")
    return value


#: a ``cli`` provider's command: a TOML array of strings, the program first (no shell)
Command = Annotated[
    Annotated[tuple[str, ...], Strict(False)],  # a TOML array becomes the tuple
    AfterValidator(_command),
]


#: what a failed or denied call does to its tick (``[llm]`` and per phase)
FailurePolicy = Literal["degrade", "fail"]
#: how an answer's references are held to the ids valid for its request
#: (``sim.phases.refs``): ``schema`` sends them as enums and checks; ``validate`` checks;
#: ``auto`` picks per provider
ConstrainRefs = Literal["auto", "schema", "validate"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class LLMConfig(_Strict):
    provider: str = DEFAULT_KIND
    chain_mode: Literal["window", "server"] = "window"
    max_concurrency: int = Field(16, ge=1, le=10_000)
    timeout_seconds: float = Field(600, gt=0)
    connect_timeout_seconds: float = Field(10, gt=0)
    first_token_timeout_seconds: float = Field(300, gt=0)
    idle_timeout_seconds: float = Field(60, gt=0)
    stream: bool = False
    structured_output: StructuredOutput = "auto"
    #: references (ids) in answers: sent as enums and checked (schema), or checked
    #: (validate); auto: per provider (docs/providers.md)
    constrain_refs: ConstrainRefs = "auto"
    #: one server, or a list of servers of the same provider (a pool: ``sim.llm.pool``)
    base_url: BaseUrl = ""
    api_key_env: str = Field("OPENAI_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    requests_per_minute: int = Field(0, ge=0)
    tokens_per_minute: int = Field(0, ge=0)
    max_failed_fraction: float = Field(0.25, ge=0.0, le=1.0)
    #: a phase where more of its calls than this came back unusable (refusals, schema
    #: failures, cut-short or empty answers) aborts the tick uncommitted ...
    max_content_failed_fraction: float = Field(0.5, ge=0.0, le=1.0)
    #: ... once at least this many did (fewer never abort)
    min_content_failures: int = Field(3, ge=1)
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
    #: ``provider = "cli"``: the program and its arguments, run once per call with the
    #: prompt on stdin (``{model}`` in an argument is the phase's model); a routing key
    command: Command = ()


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
    #: ``kind = "cli"``: the program and its arguments (``[llm] command``)
    command: Command = ()


class BudgetConfig(_Strict):
    max_total_tokens: int = Field(0, ge=0)
    max_cost_usd: float = Field(0.0, ge=0.0)


class PriceConfig(_Strict):
    input: float = Field(0.0, ge=0.0)
    cached_input: float = Field(0.0, ge=0.0)
    output: float = Field(0.0, ge=0.0)


DEFAULT_PRICES = {
    profile(DEFAULT_KIND).answers_as: PriceConfig(),  # the offline model: $0
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


def _when_list(value: Any) -> Any:
    return (value,) if isinstance(value, str) else value


def _check_when(value: tuple[str, ...]) -> tuple[str, ...]:
    for text in value:
        parse_when(text)
    return value


#: ``when``: the in-world times a phase runs at (``"18:00"``, ``"sun 18:00"``, or a list)
When = Annotated[
    tuple[str, ...],
    BeforeValidator(_when_list),
    Strict(False),
    AfterValidator(_check_when),
]


class PhaseConfig(_Strict):
    model: str = Field("gpt-4.1-mini", min_length=1)
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    max_output_tokens: int = Field(800, gt=0)
    #: the phase's chain depth: how many of an entity's earlier exchanges a call sees (0:
    #: none). One value under the names of its surfaces: ``--depth PHASE=N`` on the command
    #: line, this key in a config, spec 002's ``LLMClient(default_depth=...)`` and
    #: ``LLMRequest.depth_override`` (its public names), ``depth`` everywhere inside
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
    #: this phase's references mode; unset: ``[llm] constrain_refs``
    constrain_refs: ConstrainRefs | None = None
    #: run only in ticks that contain one of these in-world times (needs ``[time]``);
    #: empty: every tick
    when: When = ()

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


class MemoryWeights(_Strict):
    """How much each part of a memory cell's score counts (``[memory] weights``)."""

    recency: float = Field(1.0, ge=0.0, le=100.0)
    importance: float = Field(1.0, ge=0.0, le=100.0)
    relevance: float = Field(1.0, ge=0.0, le=100.0)


class ImportanceRule(_Strict):
    """A declared importance: a cell whose text holds ``contains`` (any case) rates this."""

    contains: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    importance: int = Field(ge=1, le=10)


#: an embedding model's name: a non-empty string without surrounding whitespace
EmbeddingModel = Annotated[
    str, StringConstraints(min_length=1, max_length=200, strip_whitespace=True)
]


#: a memory strategy's name (``[memory] mode``): a built-in (``MEMORY_STRATEGIES``) or one an
#: installed package offers; an unknown one is a problem of the layer (``validate``)
MemoryMode = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]


class MemoryPhaseConfig(_Strict):
    """``[memory.phases.<name>]``: one phase's memory settings, where they differ."""

    mode: MemoryMode | None = None
    k: int | None = Field(None, ge=1, le=100)
    embeddings: Literal["none", "provider"] | None = None
    embedding_model: EmbeddingModel | None = None


class MemoryConfig(_Strict):
    """``[memory]``: what of a character's memory its phases see (docs/phases.md, Memory)."""

    #: window: the last ``k`` cells; retrieve: the ``k`` best-scored cells, evicted ones kept;
    #: or a strategy from an installed package (the ``sim.memory`` entry-point group)
    mode: MemoryMode = "window"
    #: how many cells a phase's input shows
    k: int = Field(3, ge=1, le=100)
    weights: MemoryWeights = MemoryWeights()
    #: recency = decay ** (ticks since the cell)
    decay: float = Field(0.995, gt=0.0, le=1.0)
    #: relevance: none = lexical (BM25) only; provider = + cosine over embeddings
    embeddings: Literal["none", "provider"] = "none"
    #: the model whose embeddings ``embeddings = "provider"`` asks an ``openai`` or
    #: ``chat`` endpoint for (``POST {base_url}/embeddings``); the offline provider's are
    #: hashed and need none
    embedding_model: EmbeddingModel | None = None
    #: model: the resolution rates each outcome 1..10; rule: ``rules``, else ``importance``
    rate: Literal["model", "rule"] = "model"
    #: a cell's importance when nothing rated it (and the floor of ``rule``)
    importance: int = Field(3, ge=1, le=10)
    #: declared importances: the highest rule a cell's text matches
    rules: tuple[ImportanceRule, ...] = Field((), strict=False)  # a TOML array of tables
    #: the long-term store's size per character (oldest dropped beyond it)
    max_archive: int = Field(5000, ge=0, le=1_000_000)
    #: per phase, where it differs: ``[memory.phases.narrative] k = 5``
    phases: dict[str, MemoryPhaseConfig] = Field(default_factory=dict)

    def for_phase(self, name: str) -> MemoryConfig:
        """This config with phase ``name``'s overrides applied."""
        override = self.phases.get(name)
        if override is None:
            return self
        return self.model_copy(update=override.model_dump(exclude_none=True))


class ReflectionConfig(PhaseConfig):
    """``[reflection]``: the reflection phase (docs/phases.md, Reflection)."""

    #: a character reflects once its new cells' importance since its last reflection
    #: adds up to this
    threshold: int = Field(30, ge=1)
    #: the most insights one reflection stores
    insights: int = Field(3, ge=1, le=10)
    #: how many retrieved cells it reflects on
    cells: int = Field(12, ge=1, le=100)


class TimeConfig(_Strict):
    """``[time]``: ticks as in-world time (docs/phases.md, Time)."""

    #: when tick 1 happens: ``YYYY-MM-DDTHH:MM``
    start: str
    #: how long a tick lasts in the world: ``1h``, ``30m``, ``1d``, ``1d12h``, ``2w``
    tick: str = "1h"

    @field_validator("start")
    @classmethod
    def _start(cls, value: str) -> str:
        parse_start(value)
        return value

    @field_validator("tick")
    @classmethod
    def _tick(cls, value: str) -> str:
        parse_duration(value)
        return value

    def clock(self) -> Clock:
        return Clock(parse_start(self.start), parse_duration(self.tick))


class ConversationConfig(PhaseConfig):
    """``[conversation]``: the conversation phase (docs/phases.md, Conversations)."""

    #: the most utterances one conversation holds (each one call)
    max_turns: int = Field(4, ge=1, le=20)
    #: the most conversations one tick holds (the first openers by id)
    max_conversations_per_tick: int = Field(20, ge=0)
    #: the most characters one conversation holds: beyond two, others present join who
    #: mean to speak to someone in it or whom someone in it addresses
    max_participants: int = Field(2, ge=2, le=10)


class PlanningConfig(PhaseConfig):
    """``[planning]``: the planning phase (docs/phases.md, Daily plans)."""

    #: the most items of one day's plan
    items: int = Field(6, ge=1, le=24)


class MessagesConfig(_Strict):
    """``[messages]``: the ``message`` action, a channel along relationships (docs/phases.md,
    Messages). Off unless ``enabled``: a world without it keeps its schemas and inputs."""

    #: add the ``message`` action: a character reaches anyone it has a tie with, anywhere
    enabled: bool = False
    #: the relationship kinds that count as a tie (empty: every kind)
    kinds: tuple[Annotated[str, StringConstraints(min_length=1)], ...] = Field((), strict=False)
    #: the least trust a relationship needs to count as a tie
    min_trust: float = Field(0.0, ge=0.0, le=1.0)


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
    # output caps from the answer schemas' length caps (docs/providers.md): an intention
    # is at most ~700 characters, an outcome ~450 (about 120 tokens), a narrative 1,200
    phase1: Phase1Config = Phase1Config(temperature=0.8, max_output_tokens=300)
    phase2a: PhaseConfig = PhaseConfig(max_output_tokens=600, response_chain_depth=2)
    phase2b: PhaseConfig = PhaseConfig(temperature=0.9, max_output_tokens=400)
    phase4: PhaseConfig = PhaseConfig(temperature=0.3, max_output_tokens=400)
    reflection: ReflectionConfig = ReflectionConfig(temperature=0.5, max_output_tokens=500)
    conversation: ConversationConfig = ConversationConfig(temperature=0.8, max_output_tokens=200)
    planning: PlanningConfig = PlanningConfig(temperature=0.7, max_output_tokens=500)
    history: HistoryConfig = HistoryConfig()
    policy: PolicyConfig = PolicyConfig()
    limits: LimitsConfig = LimitsConfig()
    tick: TickConfig = TickConfig()
    memory: MemoryConfig = MemoryConfig()
    #: in-world time; unset: ticks are plain numbers
    time: TimeConfig | None = None
    #: the message channel; unset: no ``message`` action (left out of the logged config)
    messages: MessagesConfig | None = None
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
        from sim.config.endpoints import routing  # which needs these models

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


def redacted(config: Config) -> dict[str, Any]:
    """The config as plain data that reads back to the same config: it holds no key, only
    the names of the variables holding them; but a ``base_url`` keeps any credentials
    written into it (``user:pw@``, ``?api-key=``). What is printed or stored is
    ``loggable``."""
    data = config.model_dump(mode="json", by_alias=True)
    if data.get("messages", 0) is None:  # a config without [messages] logs as it did before
        del data["messages"]
    return data


def loggable(config: Config) -> dict[str, Any]:
    """The config as the tick log records it: ``redacted``, with the credentials a
    ``base_url`` can carry masked (``sim.llm.redact``)."""
    return _redact_base_urls(redacted(config))


def _redact_base_urls(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out[key] = _redact_base_urls(value)
        elif key == "base_url" and isinstance(value, str):
            out[key] = redact_url(value)
        elif key == "base_url" and isinstance(value, list):
            out[key] = [redact_url(v) if isinstance(v, str) else v for v in value]
        else:
            out[key] = value
    return out
