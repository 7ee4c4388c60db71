"""What the ``openai`` and ``chat`` adapters share: building the SDK client, strict schemas,
checking an answer's text against its schema."""

from __future__ import annotations

import os
import weakref
from typing import Any, NotRequired, TypedDict, Unpack

import httpx2
import openai
import orjson
from openai import RequestOptions
from pydantic import BaseModel, ValidationError

from sim.llm.adapters._direct_pool import DirectPool
from sim.llm.adapters._fast_http import (
    IDEMPOTENCY_HEADER,
    DirectPost,
    direct_url,
    plain_tcp_transport,
    shared_ssl_context,
)
from sim.llm.adapters._strict_schema import to_strict_json_schema
from sim.llm.calls import idempotency_key
from sim.llm.errors import LLMConfigurationError, LLMSchemaError
from sim.llm.types import CallSettings, Usage

_STRICT: dict[type[BaseModel], dict[str, Any]] = {}


def strict_schema(schema: type[BaseModel]) -> dict[str, Any]:
    """The schema in OpenAI's strict structured-output form, computed once per class."""
    cached = _STRICT.get(schema)
    if cached is None:
        cached = _STRICT[schema] = to_strict_json_schema(schema)
    return cached


#: concurrent connections per SDK client: the HTTP pool's bookkeeping costs CPU linear in
#: its size for every request, so a run at high concurrency spreads over several small pools
#: (measured at 200 in flight, client CPU per call: pools of 200 ~2.9 ms, 64 ~2.2 ms,
#: 32 ~2.0 ms, 16 ~2.0 ms; bench/RESULTS.md)
POOL_SIZE = 16

#: serve base URLs reached without a proxy through ``_fast_http``'s pool and direct path
PLAIN_TCP_BACKEND = True
#: the connection pool of each client ``build_client`` made for the direct path
_PLAIN_POOLS: weakref.WeakKeyDictionary[openai.AsyncOpenAI, DirectPool] = (
    weakref.WeakKeyDictionary()
)


class ClientPool:
    """One or more ``AsyncOpenAI`` clients (one when a client is injected).

    ``acquire`` hands out the client with the fewest calls in flight, so no client's
    connection pool queues a call while another has a free connection.
    """

    def __init__(self, clients: list[openai.AsyncOpenAI]) -> None:
        self.clients = clients
        self._in_flight = [0] * len(clients)
        #: per client, the direct path to its own pool (clients we built, no proxy)
        self.direct: list[DirectPost | None] = [
            DirectPost(client, pool) if (pool := _PLAIN_POOLS.get(client)) else None
            for client in clients
        ]

    @property
    def first(self) -> openai.AsyncOpenAI:
        return self.clients[0]

    def acquire(self) -> int:
        """The index of the least busy client, counted busy until ``release``."""
        counts = self._in_flight
        index = counts.index(min(counts)) if len(counts) > 1 else 0
        counts[index] += 1
        return index

    def release(self, index: int) -> None:
        self._in_flight[index] -= 1

    async def aclose(self) -> None:
        for client in self.clients:
            await client.close()


def usage_from(data: dict[str, Any], input_key: str, output_key: str) -> Usage:
    """The ``usage`` of an OpenAI-format answer; the two APIs name the counts differently.

    ``input_key``/``output_key``: ``input_tokens``/``output_tokens`` (Responses) or
    ``prompt_tokens``/``completion_tokens`` (chat); cached tokens sit in
    ``<input_key>_details.cached_tokens`` in both.
    """
    usage = data.get("usage") or {}
    details = usage.get(f"{input_key}_details") or {}
    return Usage(
        input_tokens=int(usage.get(input_key) or 0),
        output_tokens=int(usage.get(output_key) or 0),
        cached_input_tokens=int(details.get("cached_tokens") or 0),
    )


class ClientOptions(TypedDict):
    """What ``build_client`` builds an SDK client from (``build_pool`` passes it on)."""

    base_url: str | None
    api_key_env: str
    timeout_seconds: float
    connect_timeout_seconds: float
    require_key: NotRequired[bool]


def build_pool(*, max_concurrency: int = POOL_SIZE, **options: Unpack[ClientOptions]) -> ClientPool:
    """Enough ``AsyncOpenAI`` clients for ``max_concurrency`` calls in flight."""
    count = max(1, -(-max_concurrency // POOL_SIZE))
    size = -(-max_concurrency // count)
    return ClientPool([build_client(**options, connections=size) for _ in range(count)])


def build_client(
    *,
    base_url: str | None,
    api_key_env: str,
    timeout_seconds: float,
    connect_timeout_seconds: float,
    require_key: bool = True,
    connections: int = POOL_SIZE,
) -> openai.AsyncOpenAI:
    """An ``AsyncOpenAI`` with the SDK's retries off and an explicit timeout.

    Raises:
        LLMConfigurationError: the key variable is unset (named, never printed).
    """
    key = os.environ.get(api_key_env, "")
    if not key:
        if require_key:
            raise LLMConfigurationError(
                f"no API key: set the environment variable {api_key_env} "
                "(or change [llm] api_key_env in config.toml)"
            )
        key = "unused"  # local servers (Ollama, llama.cpp) accept any key
    limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=connections)
    # the URL the SDK will use (its default when none is configured)
    url = base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
    plain = PLAIN_TCP_BACKEND and direct_url(url)
    if plain:
        transport, pool = plain_tcp_transport(limits, url)
        http_client = openai.DefaultAsyncHttpxClient(transport=transport)
    else:
        # the SDK's own stack (URLs behind a proxy), verifying with the one shared context
        http_client = openai.DefaultAsyncHttpxClient(limits=limits, verify=shared_ssl_context())
    client = openai.AsyncOpenAI(
        api_key=key,
        base_url=base_url or None,
        max_retries=0,
        timeout=openai.Timeout(timeout_seconds, connect=connect_timeout_seconds),
        http_client=http_client,
    )
    if plain:
        _PLAIN_POOLS[client] = pool
    return client


def request_timeout(settings: CallSettings, connect_timeout_seconds: float) -> openai.Timeout:
    return openai.Timeout(settings.timeout_seconds, connect=connect_timeout_seconds)


def validate_text(
    schema: type[BaseModel], text: str, usage: Usage, model: str
) -> tuple[BaseModel, str]:
    """Parse ``text`` into ``schema``: the model and ``text`` (what ``respond`` takes).

    Raises:
        LLMSchemaError: not valid JSON for the schema; it carries the usage, so the
            attempt is still paid for.
    """
    try:
        return schema.model_validate_json(text), text
    except ValidationError as exc:
        raise schema_mismatch(schema, exc, text, usage, model) from exc


def schema_mismatch(
    schema: type[BaseModel], exc: ValidationError, raw: str, usage: Usage, model: str
) -> LLMSchemaError:
    """The error for an answer that does not validate against ``schema`` (paid: with usage)."""
    return LLMSchemaError(
        f"output does not validate against {schema.__name__}: {exc.errors(include_url=False)[:3]}",
        cause=exc,
        model=model,
        usage=usage,
        raw=raw[:2000],
    )


async def post_json(
    pool: ClientPool, path: str, payload: dict[str, Any], timeout: httpx2.Timeout
) -> bytes:
    """POST ``payload`` (serialized once, with orjson) on the least busy client; raw body.

    URLs reached without a proxy get the direct path to the connection pool, others the
    SDK's ``post``; either way errors are the SDK's. The call's idempotency key (from its
    identity and exact body) goes along, so a request re-sent after a crash or a timeout
    can be answered from the provider's cache instead of being paid for twice.
    """
    content = orjson.dumps(payload)
    key = idempotency_key(content)
    index = pool.acquire()
    try:
        direct = pool.direct[index]
        if direct is not None:  # no proxy in the way: straight to the connection pool
            return await direct.post(path, content, timeout, key)
        options: RequestOptions = {"timeout": timeout}
        if key is not None:
            options["headers"] = {IDEMPOTENCY_HEADER: key}
        return await pool.clients[index].post(path, cast_to=bytes, content=content, options=options)
    finally:
        pool.release(index)
