"""Build the adapter stack from config.

Per endpoint (``sim.config.routing``: ``[llm]``'s, each ``[providers.NAME]`` and phase
endpoint a phase's models use), innermost first: the provider's adapter -> backpressure (an
adaptive concurrency limit and a shared Retry-After pause per endpoint; not for offline) ->
budget (one budget for the run; each attempt reserves its worst case, priced for the
provider and model actually used) -> rate limiter (requests and tokens per minute, per
endpoint). Then a router sends each attempt to its endpoint's stack (``CallSettings.provider``),
and recovery (retries, fallback models across endpoints, breakers per provider and model)
wraps the router. Phases see only the outermost.
With ``[llm] batch`` (``sim.providers.batch``) an endpoint whose kind has the Batch API
(its profile's ``batch_api``) has no backpressure and no rate limiter: calls are lines
of a batch upload, not requests in flight.
With a list of ``base_url`` servers, an endpoint's adapter, backpressure and budget are
built once per server under a ``sim.llm.pool.PoolAdapter``, which spreads attempts over
them and moves those a failing server drops.

``build_stack`` returns a ``Stack``: the outermost adapter and what the builder made that
the runner reports from (the budget, each endpoint's pool or backpressure state, the batch
transport), so nothing has to look inside the adapters for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sim.config import Config, EndpointSpec, base_urls, llm_endpoint, routing
from sim.llm.backpressure import BackpressureAdapter, Endpoint
from sim.llm.batching import BatchOptions, BatchTransport
from sim.llm.budget import Budget, BudgetAdapter, Price
from sim.llm.embedding import Embedder
from sim.llm.pool import PoolAdapter, Server
from sim.llm.ratelimit import RateLimitedAdapter, TokenBucket
from sim.llm.recovery import RecoveryAdapter, RetryPolicy
from sim.llm.redact import redact_url
from sim.llm.router import Router
from sim.llm.types import Adapter, Closeable
from sim.providers import create_adapter, profile

#: opens the Batch API session of one ``create_batch`` (``BatchOptions.transport``)
BatchTransportFactory = Callable[[str, BatchOptions], BatchTransport]


@dataclass(frozen=True, slots=True)
class EndpointStack:
    """One endpoint's stack as ``endpoint_stack`` built it.

    Attributes:
        adapter: the endpoint's outermost layer (rate limits, budget...).
        pool: its pool of servers (``base_url`` a list), if it has one.
        endpoint: its backpressure state (one network server), if it has one.
        embedder: its provider adapter if that fetches embeddings (a pool's: its first
            server's; every server speaks the same provider with the same key).
        clients: what holds its connections open (its provider adapter, or its pool).
    """

    adapter: Adapter
    pool: PoolAdapter | None = None
    endpoint: Endpoint | None = None
    embedder: Embedder | None = None
    clients: tuple[Closeable, ...] = ()


@dataclass(frozen=True, slots=True)
class Stack:
    """A built adapter stack and what the runner reads from it, as the builder made them.

    Attributes:
        adapter: the outermost adapter, the one phases call (recovery, for a built stack).
        budget: the run's budget (``None``: a stack handed in without one).
        pools: the pool of each endpoint that has one, by endpoint name.
        endpoints: the backpressure state of each single-server network endpoint, by name.
        default: the name of ``[llm]``'s endpoint (the one the tick summary reports on).
        batch: the Batch API transport the batching endpoints use (``[llm] batch``), else
            ``None``: calls are sent live.
        embedders: the provider adapter of each endpoint that fetches embeddings, by name
            (``[memory] embeddings = "provider"``: ``sim.llm.embedding``); see
            ``embedder``.
        clients: what holds connections open, as the builder made it (each endpoint's
            provider adapter or pool of servers): ``aclose`` closes these.
        local: built from the config alone, and every endpoint it uses is a local model
            that costs nothing (its profile: no network, no command; the offline
            provider): another process can build the same stack (a sharded tick's
            workers run their own calls then: ``sim.engine.split.local_calls``).
    """

    adapter: Adapter
    budget: Budget | None = None
    pools: Mapping[str, PoolAdapter] = field(default_factory=dict)
    endpoints: Mapping[str, Endpoint] = field(default_factory=dict)
    default: str = ""
    batch: BatchTransportFactory | None = None
    embedders: Mapping[str, Embedder] = field(default_factory=dict)
    clients: tuple[Closeable, ...] = ()
    local: bool = False

    def embedder(self, name: str) -> Embedder | None:
        """The embedder of endpoint ``name`` ("": the default endpoint's). Under the name
        "" alone (endpoint names are never empty), ``embedders`` holds the adapter a
        stack of one adapter sends every call to: it answers for every name."""
        found = self.embedders.get(name or self.default)
        return found if found is not None else self.embedders.get("")

    @property
    def pool(self) -> PoolAdapter | None:
        """The default endpoint's pool of servers, if it has one."""
        return self.pools.get(self.default)

    @property
    def endpoint(self) -> Endpoint | None:
        """The default endpoint's backpressure state, if it is one network server."""
        return self.endpoints.get(self.default)

    async def aclose(self) -> None:
        """Close every HTTP client of the stack, on the loop that used them."""
        for client in self.clients:
            await client.aclose()


def provider_options(
    config: Config, seed: int, endpoint: EndpointSpec | None = None
) -> dict[str, Any]:
    """Constructor options for an endpoint's adapter (default: ``[llm]``'s)."""
    llm = config.llm
    spec = endpoint or llm_endpoint(config)
    kind = profile(spec.kind)
    if kind.runs_command:
        return {"command": spec.command, "timeout_seconds": llm.timeout_seconds}
    if not kind.network:
        return {"seed": seed} if kind.takes_seed else {}
    urls = base_urls(spec.base_url)
    options: dict[str, Any] = {
        "base_url": urls[0] if urls else None,  # a pool of servers: each server's own below
        # the [llm] default names OpenAI's variable, read as the kind's own where it has
        # another (``own_key_env``)
        "api_key_env": spec.api_key_env,
        "timeout_seconds": llm.timeout_seconds,
        "connect_timeout_seconds": llm.connect_timeout_seconds,
        "max_concurrency": spec.max_concurrency,
    }
    if kind.takes_seed:
        options["seed"] = seed
    if kind.server_chains:  # it keeps responses: stored only for [llm]'s server chains
        options["store"] = llm.chain_mode == "server" and spec.name == llm.provider
    return options


def batch_transport(config: Config) -> BatchTransportFactory | None:
    """The transport the stack's batching endpoints (``openai``, ``chat``) send through with
    ``[llm] batch``: the OpenAI Batch API's session, opened by each ``create_batch``
    (``BatchOptions.transport``); ``None``: calls are sent live."""
    if not config.llm.batch:
        return None
    from sim.providers.batch import BatchSession  # the SDK only when a batch runs

    return BatchSession


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


def _metered(
    adapter: Adapter,
    endpoint: Endpoint | None,
    budget: Budget,
    name: str,
    answers_as: str,
    batchable: bool,
) -> BudgetAdapter:
    """``adapter`` slowed down when its server pushes back (``endpoint``: its adaptive
    limit; ``None`` for no server, or calls that go as a batch), then held to the run's
    ``budget``, which prices each attempt for the endpoint ``name``: the order every
    endpoint's calls go through, alone or as one server of a pool."""
    inner = adapter if endpoint is None else BackpressureAdapter(adapter, endpoint)
    return BudgetAdapter(inner, budget, name, answers_as=answers_as, batchable=batchable)


def server_pool(
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
                _metered(adapter, endpoint, budget, name, profile(kind).answers_as, batchable),
                endpoint,
                provider=adapter,
            )
        )
    return PoolAdapter(
        servers,
        breaker_threshold=llm.breaker_threshold,
        breaker_cooldown=llm.breaker_cooldown_seconds,
    )


def endpoint_stack(
    config: Config,
    spec: EndpointSpec,
    seed: int,
    budget: Budget,
    provider: Adapter | None = None,
) -> EndpointStack:
    """One endpoint's adapter, backpressure, budget and rate limits."""
    llm = config.llm
    # Batch API calls are lines of one upload, not requests in flight: an endpoint's
    # concurrency limit and per-minute rates do not apply (and a concurrency limit would
    # hold back calls the batch waits for)
    kind = profile(spec.kind)
    batchable = bool(kind.batch_api)
    batched = llm.batch and batchable
    urls = base_urls(spec.base_url)
    inner: Adapter
    provider_adapter: Adapter | None = None
    pool: PoolAdapter | None = None
    endpoint: Endpoint | None = None
    local = not kind.network  # no server: nothing to pool or slow down for
    if len(urls) > 1 and provider is None and not local and not batched:
        inner = pool = server_pool(
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
        provider_adapter = inner
        if not local and not batched:  # a network endpoint: slow down when told
            url = kind.url(urls[0] if urls else "")
            endpoint = _endpoint(config, url, spec.max_concurrency)
        inner = _metered(inner, endpoint, budget, spec.name, kind.answers_as, batchable)
    if (spec.requests_per_minute or spec.tokens_per_minute) and not batched:
        inner = RateLimitedAdapter(
            inner,
            TokenBucket(spec.requests_per_minute) if spec.requests_per_minute else None,
            TokenBucket(spec.tokens_per_minute) if spec.tokens_per_minute else None,
        )
    bottom = pool.servers[0].provider if pool is not None else provider_adapter
    held = pool if pool is not None else provider_adapter
    return EndpointStack(
        inner,
        pool,
        endpoint,
        bottom if isinstance(bottom, Embedder) else None,
        (held,) if isinstance(held, Closeable) else (),
    )


def build_stack(
    config: Config,
    seed: int = 0,
    *,
    provider: Adapter | None = None,
    budget: Budget | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Stack:
    """The full adapter stack for a run: every endpoint the phases' models use, and what
    the runner reads from it (``Stack``).

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
    table = routing(config)
    shared = budget or make_budget(config)
    routes: dict[str, EndpointStack] = {}
    for spec in table.used():  # all built now: a missing key stops the run before a call
        injected = provider if spec.name == table.default else None
        routes[spec.name] = endpoint_stack(config, spec, seed, shared, injected)
    structured = {
        s.name: s.structured_output for s in table.used() if s.structured_output is not None
    }
    router = Router({n: r.adapter for n, r in routes.items()}, table.default, structured)
    return Stack(
        with_recovery(config, router, sleep=sleep),
        shared,
        pools={n: r.pool for n, r in routes.items() if r.pool is not None},
        endpoints={n: r.endpoint for n, r in routes.items() if r.endpoint is not None},
        default=table.default,
        batch=batch_transport(config),
        embedders={n: r.embedder for n, r in routes.items() if r.embedder is not None},
        clients=tuple(client for r in routes.values() for client in r.clients),
        local=provider is None
        and budget is None
        and all(
            not profile(s.kind).network and not profile(s.kind).runs_command for s in table.used()
        ),
    )


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
