"""Build the adapter stack from config.

Per endpoint (``sim.config.routing``: ``[llm]``'s, each ``[providers.NAME]`` and phase
endpoint a phase's models use), innermost first: the provider's adapter -> backpressure (an
adaptive concurrency limit and a shared Retry-After pause per endpoint; not for offline) ->
budget (one budget for the run; each attempt reserves its worst case, priced for the
provider and model actually used) -> rate limiter (requests and tokens per minute, per
endpoint). Then a router sends each attempt to its endpoint's stack (``CallSettings.provider``),
and recovery (retries, fallback models across endpoints, breakers per provider and model)
wraps the router. Phases see only the outermost.
With ``[llm] batch`` (``sim.llm.batch``) an ``openai`` or ``chat`` endpoint has no
backpressure and no rate limiter: calls are lines of a batch upload, not requests in flight.
With a list of ``base_url`` servers, an endpoint's adapter, backpressure and budget are
built once per server under a ``sim.llm.pool.PoolAdapter``, which spreads attempts over
them and moves those a failing server drops.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sim.config import base_urls
from sim.llm.adapters import create_adapter
from sim.llm.backpressure import BackpressureAdapter, Endpoint
from sim.llm.budget import Budget, BudgetAdapter, Price
from sim.llm.pool import PoolAdapter, Server
from sim.llm.ratelimit import RateLimitedAdapter, TokenBucket
from sim.llm.recovery import RecoveryAdapter, RetryPolicy
from sim.llm.redact import redact_url
from sim.llm.types import Adapter, AdapterResponse, ModelRequest, StructuredOutput
from sim.llm.wrapper import AdapterWrapper

if TYPE_CHECKING:
    from sim.config import Config, EndpointSpec


#: the built-in ``[llm] api_key_env``
OPENAI_KEY_ENV = "OPENAI_API_KEY"


def provider_options(
    config: Config, seed: int, endpoint: EndpointSpec | None = None
) -> dict[str, Any]:
    """Constructor options for an endpoint's adapter (default: ``[llm]``'s)."""
    from sim.config import llm_endpoint

    llm = config.llm
    spec = endpoint or llm_endpoint(config)
    if spec.kind == "offline":
        return {"seed": seed}
    if spec.kind == "cli":
        return {"command": spec.command, "timeout_seconds": llm.timeout_seconds}
    urls = base_urls(spec.base_url)
    options: dict[str, Any] = {
        "base_url": urls[0] if urls else None,  # a pool: build_pool sets each server's
        # the [llm] default names OpenAI's variable; gemini's and anthropic's own are
        # GEMINI_API_KEY and ANTHROPIC_API_KEY (``own_key_env``)
        "api_key_env": spec.api_key_env,
        "timeout_seconds": llm.timeout_seconds,
        "connect_timeout_seconds": llm.connect_timeout_seconds,
        "max_concurrency": spec.max_concurrency,
    }
    if spec.kind == "chat":  # the Responses, Gemini and Anthropic APIs take no seed
        options["seed"] = seed
    if spec.kind == "openai":  # the one provider that keeps responses (server chains)
        options["store"] = llm.chain_mode == "server" and spec.name == llm.provider
    return options


#: the endpoints the SDKs use when ``base_url`` is empty (the OpenAI SDK reads
#: ``OPENAI_BASE_URL`` first, the Anthropic SDK ``ANTHROPIC_BASE_URL``)
DEFAULT_URLS = {
    "gemini": ("", "https://generativelanguage.googleapis.com"),
    "anthropic": ("ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
}


def endpoint_url(provider: str, base_url: str) -> str:
    """Where requests go: ``base_url``, else the provider's SDK default."""
    if base_url:
        return base_url
    env, url = DEFAULT_URLS.get(provider, ("OPENAI_BASE_URL", "https://api.openai.com/v1"))
    return (os.environ.get(env) if env else None) or url


def make_budget(config: Config) -> Budget:
    return Budget(
        max_total_tokens=config.budget.max_total_tokens or None,
        max_cost_usd=config.budget.max_cost_usd or None,
        prices={
            model: Price(p.input, p.cached_input, p.output) for model, p in config.prices.items()
        },
    )


def _endpoint(config: Config, url: str, max_concurrency: int | None = None) -> Endpoint:
    """The backpressure state of one server (its adaptive concurrency limit)."""
    llm = config.llm
    return Endpoint(
        redact_url(url),  # its name in messages and the tick log: no credentials
        max_concurrency or llm.max_concurrency,
        down_threshold=llm.breaker_threshold,
        down_cooldown=llm.breaker_cooldown_seconds,
    )


def build_pool(
    config: Config,
    urls: tuple[str, ...],
    budget: Budget,
    *,
    kind: str,
    options: Mapping[str, Any],
    max_concurrency: int | None = None,
    name: str = "",
    batchable: bool = True,
) -> PoolAdapter:
    """A pool over ``urls``: per server, its own provider adapter (its own SDK clients) ->
    backpressure (its own adaptive limit) -> budget (the run's shared ``Budget``).

    Args:
        kind: the provider (``chat``, ``openai``...) every server speaks.
        options: its adapter's constructor options (``provider_options``); each server's
            ``base_url`` replaces the one in them.
        max_concurrency: each server's ceiling (default ``[llm] max_concurrency``).
        name, batchable: the endpoint's name and whether it batches, for its budget gate.

    Raises:
        LLMConfigurationError: unknown provider, missing API key.
    """
    llm = config.llm
    servers = []
    for url in urls:
        adapter = create_adapter(kind, **{**options, "base_url": url})
        endpoint = _endpoint(config, url, max_concurrency)
        servers.append(
            Server(
                redact_url(url),  # as the tick log records it
                BudgetAdapter(
                    BackpressureAdapter(adapter, endpoint),
                    budget,
                    name,
                    kind=kind,
                    batchable=batchable,
                ),
                endpoint,
            )
        )
    return PoolAdapter(
        servers,
        breaker_threshold=llm.breaker_threshold,
        breaker_cooldown=llm.breaker_cooldown_seconds,
    )


class Router(AdapterWrapper):
    """Sends each attempt to the stack of the endpoint its settings name
    (``CallSettings.provider``; empty: the default endpoint).

    ``inner`` is the default endpoint's stack, so code that looks inside a stack (its
    budget, its endpoint's backpressure) finds ``[llm]``'s. An endpoint's own
    ``structured_output`` (``[providers.NAME]``) replaces the phase's for its requests:
    it describes that server.
    """

    def __init__(
        self,
        routes: Mapping[str, Adapter],
        default: str,
        structured: Mapping[str, StructuredOutput] | None = None,
    ) -> None:
        super().__init__(routes[default])
        self.default = default
        self.routes = dict(routes)
        self.structured = dict(structured or {})

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        name = request.settings.provider
        if name not in self.routes:
            # a request built from another config than this stack's (``sim replay --live``
            # re-runs a tick with its logged config and sends drifted requests where the
            # config now points): the default endpoint. A run's own requests always name
            # an endpoint of its stack (both come from ``sim.config.routing``).
            name = self.default
        form = self.structured.get(name)
        if form is not None and form != request.settings.structured_output:
            request = replace(request, settings=replace(request.settings, structured_output=form))
        return await self.routes[name].execute(request)

    async def aclose(self) -> None:
        """Close every endpoint's HTTP client."""
        for adapter in self.routes.values():
            await close_stack(adapter)


def endpoint_stack(
    config: Config,
    spec: EndpointSpec,
    seed: int,
    budget: Budget,
    provider: Adapter | None = None,
) -> Adapter:
    """One endpoint's adapter, backpressure, budget and rate limits."""
    from sim.config import BATCH_PROVIDERS, LOCAL_PROVIDERS

    llm = config.llm
    # Batch API calls are lines of one upload, not requests in flight: an endpoint's
    # concurrency limit and per-minute rates do not apply (and a concurrency limit would
    # hold back calls the batch waits for)
    batchable = spec.kind in BATCH_PROVIDERS
    batched = llm.batch and batchable
    urls = base_urls(spec.base_url)
    inner: Adapter
    local = spec.kind in LOCAL_PROVIDERS  # no server: nothing to pool or slow down for
    if len(urls) > 1 and provider is None and not local and not batched:
        inner = build_pool(
            config,
            urls,
            budget,
            kind=spec.kind,
            options=provider_options(config, seed, spec),
            max_concurrency=spec.max_concurrency,
            name=spec.name,
            batchable=batchable,
        )
    else:
        inner = provider or create_adapter(spec.kind, **provider_options(config, seed, spec))
        if not local and not batched:  # a network endpoint: slow down when told
            url = endpoint_url(spec.kind, urls[0] if urls else "")
            inner = BackpressureAdapter(inner, _endpoint(config, url, spec.max_concurrency))
        inner = BudgetAdapter(
            inner, budget, provider=spec.name, kind=spec.kind, batchable=batchable
        )
    if (spec.requests_per_minute or spec.tokens_per_minute) and not batched:
        inner = RateLimitedAdapter(
            inner,
            TokenBucket(spec.requests_per_minute) if spec.requests_per_minute else None,
            TokenBucket(spec.tokens_per_minute) if spec.tokens_per_minute else None,
        )
    return inner


def build_stack(
    config: Config,
    seed: int = 0,
    *,
    provider: Adapter | None = None,
    budget: Budget | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> RecoveryAdapter:
    """The full adapter stack for a run: every endpoint the phases' models use.

    Args:
        config: the effective configuration.
        seed: the world seed (offline provider).
        provider: use this provider adapter for ``[llm]``'s endpoint instead of building
            one (tests inject one around their own ``AsyncOpenAI`` client).
        budget: share this budget (default: a new one from ``[budget]`` and ``[prices]``).
        sleep: how recovery waits between attempts.

    Raises:
        LLMConfigurationError: unknown provider, missing API key (of any endpoint used).
    """
    from sim.config import routing

    table = routing(config)
    shared = budget or make_budget(config)
    routes: dict[str, Adapter] = {}
    for spec in table.used():  # all built now: a missing key stops the run before a call
        injected = provider if spec.name == table.default else None
        routes[spec.name] = endpoint_stack(config, spec, seed, shared, injected)
    structured = {
        s.name: s.structured_output for s in table.used() if s.structured_output is not None
    }
    return with_recovery(config, Router(routes, table.default, structured), sleep=sleep)


def with_recovery(
    config: Config,
    inner: Adapter,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> RecoveryAdapter:
    """``inner`` wrapped in recovery as ``[llm]`` sets it (retries, backoff, schema
    feedback, fallback models, breakers): the outermost layer of every stack, and what
    ``Runner(adapter=...)`` puts around an adapter it is handed."""
    llm = config.llm
    policy = RetryPolicy(
        schema_retries=llm.json_max_retries,
        transient_retries=llm.transient_retries,
        backoff_base_seconds=llm.backoff_base_seconds,
        backoff_cap_seconds=llm.backoff_cap_seconds,
    )
    return RecoveryAdapter(
        inner,
        policy,
        breaker_threshold=llm.breaker_threshold,
        breaker_cooldown=llm.breaker_cooldown_seconds,
        sleep=sleep,
    )


async def close_stack(adapter: object) -> None:
    """Close the HTTP client at the bottom of a stack, on the loop that used it."""
    while adapter is not None:
        close = getattr(adapter, "aclose", None)
        if close is not None:
            await close()
            return
        adapter = getattr(adapter, "inner", None)


def find_budget(adapter: object) -> Budget | None:
    """The budget inside a stack, if any (for reports)."""
    while adapter is not None:
        if isinstance(adapter, BudgetAdapter):
            return adapter.budget
        adapter = getattr(adapter, "inner", None)
    return None
