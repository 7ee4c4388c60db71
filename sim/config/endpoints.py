"""Where a model runs: the endpoints a config names (``[llm]``'s, a kind's SDK default, a
``[providers.NAME]``, a phase's own ``provider``/``base_url``/``api_key_env``), how a model
string resolves to one (docs/providers.md), and the endpoint lines ``sim check`` prints."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field, replace
from typing import Any

from sim.config.models import (
    Config,
    DeclaredPhaseConfig,
    LLMConfig,
    PhaseConfig,
    describe_base_url,
)
from sim.config.names import PHASE_ALIASES, PHASE_SECTIONS, section_name
from sim.llm.redact import redact_url, redact_urls
from sim.llm.types import ModelTarget, StructuredOutput
from sim.providers import DEFAULT_KIND, find_profile, profile, selectable_kinds


def endpoint(config: Config) -> tuple[str, str | None]:
    """(where [llm]'s requests go, the environment variable whose key they carry) — never
    the key."""
    llm = config.llm
    return _describe_endpoint(llm.provider, llm.base_url, llm.api_key_env, llm.command)


def phase_endpoints(config: Config) -> dict[str, tuple[str, str | None]]:
    """Phase name -> (url, key variable) for each phase whose model runs elsewhere than
    [llm]'s endpoint (its own ``provider``/``base_url``, or a qualified model)."""
    main = endpoint(config)
    table = routing(config)
    out: dict[str, tuple[str, str | None]] = {}
    for section in (*PHASE_SECTIONS, *(f"phases.{n}" for n in config.phases)):
        spec = table.endpoints[table.candidates(section)[0].provider]
        where = _describe_endpoint(spec.kind, spec.base_url, spec.api_key_env, spec.command)
        if where != main:
            out[section_name(section)] = where
    return out


def named_endpoints(config: Config) -> dict[str, tuple[str, str | None]]:
    """Endpoint name -> (url, key variable) of every endpoint the phases' models (fallback
    models included) use besides [llm]'s: what ``sim check`` lists."""
    table = routing(config)
    return {
        spec.name: _describe_endpoint(spec.kind, spec.base_url, spec.api_key_env, spec.command)
        for spec in table.used()
        if spec.name != table.default
    }


def _describe_endpoint(
    provider: str,
    base_url: str | tuple[str, ...],
    key_env: str,
    command: tuple[str, ...] = (),
) -> tuple[str, str | None]:
    """The SDKs fall back to their own endpoint (the openai SDK to ``OPENAI_BASE_URL`` first)
    when ``base_url`` is empty; this says which one applies (the kind's profile). A pool's
    URLs are joined. A command-running endpoint (``cli``) is its command (what it sends
    where is the command's business)."""
    base_url = describe_base_url(redact_urls(base_url))  # printed: no credentials
    kind = profile(provider)
    if kind.runs_command:
        return f"the local command {shlex.join(command) or '(none set)'}", None
    if not kind.network:
        return f"none ({provider} provider: no network)", None
    key = kind.key_env if key_env == DEFAULT_KEY_ENV and kind.key_env else key_env
    url = redact_url(kind.url(base_url))
    if not base_url and kind.base_url_env and os.environ.get(kind.base_url_env):
        url += f" (from {kind.base_url_env})"
    return url, key


# -- where a model runs -------------------------------------------------------------------

#: the built-in ``[llm] api_key_env`` (``sim/defaults.toml``): read as a kind's own key
#: variable where the kind has another (``own_key_env``)
DEFAULT_KEY_ENV: str = LLMConfig.model_fields["api_key_env"].default


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
    #: a ``cli`` endpoint's program and arguments
    command: tuple[str, ...] = ()

    def where(self) -> tuple[str, str | tuple[str, ...], str]:
        """What makes two endpoints the same connection: kind, server and key variable."""
        return self.kind, self.base_url, self.api_key_env


def own_key_env(kind: str, key_env: str) -> str:
    """``key_env`` for ``kind``: unset, or the built-in default (``DEFAULT_KEY_ENV``) where
    the kind's profile names a key variable of its own, the profile's (``GEMINI_API_KEY``
    for gemini); a kind no provider has keeps what was set (the config says it is unknown)."""
    found = find_profile(kind)
    own = found.key_env if found is not None else ""
    if not key_env or (key_env == DEFAULT_KEY_ENV and own):
        return own
    return key_env


def normalised_model(model: str) -> str:
    """A model name as candidates are compared: case and surrounding whitespace ignored."""
    return model.strip().casefold()


@dataclass(frozen=True)
class Routing:
    """Every endpoint the config's phases use, and each phase's candidate models.

    Built by ``routing(config)``; ``sim.engine.stack`` builds one adapter stack per endpoint.
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
        llm.command,
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
        own_key_env(kind, ""),
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
        spec.command,
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
    with ``KIND`` a built-in kind (``selectable_kinds``) on the nearest endpoint of that
    kind (``home``'s, else ``[llm]``'s, else the kind's SDK default). Anything else,
    including a name whose first segment is neither (``meta-llama/Llama-3-8B``,
    ``models/gemini-2.5-flash``), is a bare model on ``home`` (default: ``[llm]``'s
    endpoint), sent as written. Only the first segment is read:
    ``chat/openai/gpt-oss-20b`` is ``openai/gpt-oss-20b`` on ``chat``.
    """
    home = home or llm_endpoint(config)
    text = name.strip()
    head, slash, rest = text.partition("/")
    rest = rest.strip()
    if slash and rest:
        if head in config.providers:
            return ModelTarget(head, rest)
        if head in selectable_kinds():
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
            "model": f"{DEFAULT_KIND}/{phase.model.strip()}",
            "fallback_models": tuple(f"{DEFAULT_KIND}/{m.strip()}" for m in phase.fallback_models),
        }

    update: dict[str, Any] = {
        "llm": config.llm.model_copy(update={"provider": DEFAULT_KIND, "chain_mode": "window"}),
        "providers": {},
        "phases": {n: p.model_copy(update=offline(p)) for n, p in config.phases.items()},
    }
    for section in PHASE_SECTIONS:
        phase = config.phase(section)
        update[section] = phase.model_copy(update=offline(phase))
    return config.model_copy(update=update)
