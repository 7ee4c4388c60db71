"""Build the adapter stack from config.

The stack, innermost first: the provider's adapter -> backpressure (an adaptive
concurrency limit and a shared Retry-After pause per endpoint; not for offline) -> budget
(each attempt reserves its worst case, priced for the model actually used) -> rate limiter
(requests and tokens per minute) -> recovery (retries, fallback models, breakers). Phases
see only the outermost. With a list of ``base_url`` servers the first three are built once per
server, under a ``sim.llm.pool.PoolAdapter`` that spreads attempts over them and moves
those a failing server drops; the budget object is shared. With ``[llm] batch``
(``sim.llm.batch``) there is no backpressure and no rate limiter: calls are lines of a
batch upload, not requests in flight.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from sim.config import base_urls
from sim.llm.adapters import create_adapter
from sim.llm.backpressure import BackpressureAdapter, Endpoint
from sim.llm.budget import Budget, BudgetAdapter, Price
from sim.llm.pool import PoolAdapter, Server
from sim.llm.ratelimit import RateLimitedAdapter, TokenBucket
from sim.llm.recovery import RecoveryAdapter, RetryPolicy
from sim.llm.types import Adapter

if TYPE_CHECKING:
    from sim.config import Config


#: the built-in ``[llm] api_key_env``
OPENAI_KEY_ENV = "OPENAI_API_KEY"


def provider_options(config: Config, seed: int) -> dict[str, Any]:
    """Constructor options for the configured provider's adapter."""
    llm = config.llm
    if llm.provider == "offline":
        return {"seed": seed}
    urls = base_urls(llm.base_url)
    options: dict[str, Any] = {
        "base_url": urls[0] if urls else None,  # a pool: build_stack sets each server's
        "api_key_env": llm.api_key_env,
        "timeout_seconds": llm.timeout_seconds,
        "connect_timeout_seconds": llm.connect_timeout_seconds,
        "max_concurrency": llm.max_concurrency,
    }
    if llm.provider == "chat":  # the Responses, Gemini and Anthropic APIs take no seed
        options["seed"] = seed
    if llm.provider == "openai":  # the one provider that keeps responses (server chains)
        options["store"] = llm.chain_mode == "server"
    if llm.provider == "gemini" and llm.api_key_env == OPENAI_KEY_ENV:
        # the [llm] default names OpenAI's variable; gemini's own default is GEMINI_API_KEY
        options["api_key_env"] = "GEMINI_API_KEY"
    if llm.provider == "anthropic" and llm.api_key_env == OPENAI_KEY_ENV:
        # likewise: anthropic's own default is ANTHROPIC_API_KEY
        options["api_key_env"] = "ANTHROPIC_API_KEY"
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
        url,
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
) -> PoolAdapter:
    """A pool over ``urls``: per server, its own provider adapter (its own SDK clients) ->
    backpressure (its own adaptive limit) -> budget (the run's shared ``Budget``).

    Args:
        kind: the provider (``chat``, ``openai``...) every server speaks.
        options: its adapter's constructor options (``provider_options``); each server's
            ``base_url`` replaces the one in them.
        max_concurrency: each server's ceiling (default ``[llm] max_concurrency``).

    Raises:
        LLMConfigurationError: unknown provider, missing API key.
    """
    llm = config.llm
    servers = []
    for url in urls:
        adapter = create_adapter(kind, **{**options, "base_url": url})
        endpoint = _endpoint(config, url, max_concurrency)
        servers.append(
            Server(url, BudgetAdapter(BackpressureAdapter(adapter, endpoint), budget), endpoint)
        )
    return PoolAdapter(
        servers,
        breaker_threshold=llm.breaker_threshold,
        breaker_cooldown=llm.breaker_cooldown_seconds,
    )


def build_stack(
    config: Config,
    seed: int = 0,
    *,
    provider: Adapter | None = None,
    budget: Budget | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> RecoveryAdapter:
    """The full adapter stack for a run.

    Args:
        config: the effective configuration.
        seed: the world seed (offline provider).
        provider: use this provider adapter instead of building one (tests inject one
            around their own ``AsyncOpenAI`` client).
        budget: share this budget (default: a new one from ``[budget]`` and ``[prices]``).
        sleep: how recovery waits between attempts.

    Raises:
        LLMConfigurationError: unknown provider, missing API key.
    """
    llm = config.llm
    budget = budget or make_budget(config)
    urls = base_urls(llm.base_url)
    # Batch API calls are lines of one upload, not requests in flight: an endpoint's
    # concurrency limit and per-minute rates do not apply (and a concurrency limit would
    # hold back calls the batch waits for)
    batched = llm.batch and llm.provider in ("openai", "chat")
    inner: Adapter
    if len(urls) > 1 and provider is None and llm.provider != "offline" and not batched:
        inner = build_pool(
            config, urls, budget, kind=llm.provider, options=provider_options(config, seed)
        )
    else:
        inner = provider or create_adapter(llm.provider, **provider_options(config, seed))
        if llm.provider != "offline" and not batched:  # a network endpoint: slow down when told
            url = endpoint_url(llm.provider, urls[0] if urls else "")
            inner = BackpressureAdapter(inner, _endpoint(config, url))
        inner = BudgetAdapter(inner, budget)
    if (llm.requests_per_minute or llm.tokens_per_minute) and not batched:
        inner = RateLimitedAdapter(
            inner,
            TokenBucket(llm.requests_per_minute) if llm.requests_per_minute else None,
            TokenBucket(llm.tokens_per_minute) if llm.tokens_per_minute else None,
        )
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
