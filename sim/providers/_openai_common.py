"""What the ``openai`` and ``chat`` adapters share: where and how a call is sent (the
``Target`` and the aiohttp routes of ``sim.providers.http``, the SDK's clients where they are still
needed), strict schemas, checking an answer's text against its schema.

The OpenAI SDK is imported only where it is used: a client handed in, the Batch API and
deleting a stored response. Calls, streamed or not, go through ``http.Route`` (aiohttp,
proxies from the environment included) and never load it (``import openai`` costs ~0.4 s
of CPU).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, Unpack

import orjson
from pydantic import BaseModel, ValidationError

import sim
from sim.llm.calls import CallIdentity, idempotency_key
from sim.llm.enums import SchemaEnums, constrain
from sim.llm.errors import LLMConfigurationError, LLMSchemaError
from sim.llm.types import Usage
from sim.providers._strict_schema import to_strict_json_schema, without_lengths
from sim.providers.http import (
    IDEMPOTENCY_HEADER,
    Route,
    Target,
    merge_headers,
    shared_ssl_context,
)

if TYPE_CHECKING:
    import openai

#: by class and the caps kept (-1: all)
_STRICT: dict[tuple[type[BaseModel], int], dict[str, Any]] = {}

#: the longest string cap sent to a local server: its grammar stops a model at the cap
#: (Gemma 3 270M otherwise rambles past it, to a schema error or to the token cap), and
#: llama-cpp-python took 60 and 300 while llama.cpp's grammar builder aborted its server on
#: a narrative's 1,200 (measured); a longer cap is checked on the answer only
LOCAL_MAX_LENGTH = 300


def strict_schema(
    schema: type[BaseModel],
    enums: SchemaEnums | None = None,
    *,
    lengths: bool | int = True,
    grammar: bool = False,
) -> dict[str, Any]:
    """The schema in OpenAI's strict structured-output form, computed once per class, with
    this request's ``enums`` written in (``sim.llm.enums``; a copy when there are any).

    Args:
        lengths: which string length limits (``maxLength``) to keep: all (``True``),
            none (``False``: OpenAI's API does not document them in strict mode), or
            those up to so many characters (``LOCAL_MAX_LENGTH`` for a local server: its
            grammar then stops a rambling answer at the cap, and llama.cpp's grammar
            builder aborts its server on a long one). Answers are checked against all.
        grammar: write the enums' forms a server that builds a grammar compiles (cases
            as per-value branches, a root ``anyOf``; an array of one item per id as a
            tuple): not for OpenAI's strict mode.
    """
    kept = -1 if lengths is True else int(lengths)  # True == 1 as a key: not the same here
    cached = _STRICT.get((schema, kept))
    if cached is None:
        strict = to_strict_json_schema(schema)
        if kept >= 0:
            strict = without_lengths(strict, kept)
        cached = _STRICT[(schema, kept)] = strict
    return constrain(cached, enums, grammar=grammar)


#: concurrent connections per connection pool (and SDK client): a run at high
#: concurrency spreads over several small pools, each call on the least busy (measured
#: with httpx's pool at 200 in flight, client CPU per call: pools of 200 ~2.9 ms, 64
#: ~2.2 ms, 32 ~2.0 ms, 16 ~2.0 ms; bench/RESULTS.md)
POOL_SIZE = 16

#: send calls through ``http.Route`` (aiohttp); ``False``: through the SDK's own stack on
#: its default client instead (the bench's comparison row, nothing else)
AIOHTTP_ROUTES = True

#: the endpoint the OpenAI SDK uses when neither ``base_url`` nor ``OPENAI_BASE_URL`` is set
DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: the User-Agent of the routes (the SDK's own stack sends the SDK's)
USER_AGENT = f"sim/{sim.__version__}"


class Connections:
    """The routes of one adapter to its server, one per connection pool.

    Each route has an aiohttp ``Route`` or not (a client handed in: the SDK's own stack),
    and an SDK client, built the first time something needs one (``client``: the Batch
    API, deletions) on the SDK's own stack. ``acquire`` hands out the route with the
    fewest calls in flight, so no pool queues a call while another has a free connection.

    Args:
        routes: per route, its ``Route`` or ``None``.
        connect: builds the SDK client of route ``i``.
        clients: SDK clients already built (a client handed in), by route.
    """

    def __init__(
        self,
        routes: list[Route | None],
        connect: Callable[[int], openai.AsyncOpenAI] | None = None,
        clients: Mapping[int, openai.AsyncOpenAI] | None = None,
    ) -> None:
        self.routes = routes
        self._connect = connect
        self._clients: dict[int, openai.AsyncOpenAI] = dict(clients or {})
        self._in_flight = [0] * len(routes)

    @classmethod
    def of(cls, client: openai.AsyncOpenAI) -> Connections:
        """One route: the SDK's own stack on a client handed in."""
        return cls([None], clients={0: client})

    def __len__(self) -> int:
        return len(self.routes)

    def client(self, index: int = 0) -> openai.AsyncOpenAI:
        """The SDK client of route ``index`` (built now if not yet: imports the SDK)."""
        client = self._clients.get(index)
        if client is None:
            if self._connect is None:  # pragma: no cover - every pool gets one of the two
                raise LookupError(f"route {index} has no SDK client")
            client = self._clients[index] = self._connect(index)
        return client

    @property
    def first(self) -> openai.AsyncOpenAI:
        return self.client(0)

    def sdk_clients(self) -> list[openai.AsyncOpenAI]:
        """Every route's SDK client (built now where missing)."""
        return [self.client(index) for index in range(len(self))]

    def acquire(self) -> int:
        """The index of the least busy route, counted busy until ``release``."""
        counts = self._in_flight
        index = counts.index(min(counts)) if len(counts) > 1 else 0
        counts[index] += 1
        return index

    def release(self, index: int) -> None:
        self._in_flight[index] -= 1

    async def aclose(self) -> None:
        """Close the SDK clients built and the routes' connections."""
        for client in self._clients.values():
            await client.close()
        for route in self.routes:
            if route is not None:
                await route.aclose()


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
    """What ``build_connections`` builds an adapter's routes from."""

    base_url: str | None
    api_key_env: str
    timeout_seconds: float
    connect_timeout_seconds: float
    require_key: NotRequired[bool]
    default_headers: NotRequired[Mapping[str, str] | None]
    default_query: NotRequired[Mapping[str, str] | None]


def resolved_url(base_url: str | None) -> str:
    """The URL the SDK would use: ``base_url``, else ``OPENAI_BASE_URL``, else OpenAI's."""
    return base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL


def read_key(api_key_env: str, *, require_key: bool = True) -> str:
    """The key in ``$api_key_env``; a placeholder for a local server that takes none.

    Raises:
        LLMConfigurationError: the variable is unset and a key is required (named, never
            printed).
    """
    key = os.environ.get(api_key_env, "")
    if not key:
        if require_key:
            raise LLMConfigurationError(
                f"no API key: set the environment variable {api_key_env} "
                "(or change [llm] api_key_env in config.toml)"
            )
        key = "unused"  # local servers (Ollama, llama.cpp) accept any key
    return key


def environment_headers() -> dict[str, str]:
    """The headers the OpenAI SDK takes from the environment: ``OpenAI-Organization``
    (``OPENAI_ORG_ID``), ``OpenAI-Project`` (``OPENAI_PROJECT_ID``) and the lines
    ``Name: value`` of ``OPENAI_CUSTOM_HEADERS``, so both paths send them alike."""
    headers: dict[str, str] = {}
    for name, variable in (
        ("OpenAI-Organization", "OPENAI_ORG_ID"),
        ("OpenAI-Project", "OPENAI_PROJECT_ID"),
    ):
        value = os.environ.get(variable)
        if value is not None:
            headers[name] = value
    for line in os.environ.get("OPENAI_CUSTOM_HEADERS", "").split("\n"):
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip()] = value.strip()
    return headers


def openai_target(
    base_url: str,
    key: str,
    *,
    default_headers: Mapping[str, str] | None = None,
    default_query: Mapping[str, str] | None = None,
) -> Target:
    """Where a route sends an OpenAI-format call, with the headers the SDK would
    send, in its order: ``Authorization: Bearer <key>``, JSON in and out, the environment's
    (``environment_headers``), then ``default_headers`` (each replacing an earlier header
    of the same name in any case). The SDK's self-description (``X-Stainless-*``) is left
    out and the User-Agent is sim's."""
    headers = merge_headers(
        {"Authorization": f"Bearer {key}"},
        {"Accept": "application/json", "Content-Type": "application/json"},
        {"User-Agent": USER_AGENT},
        environment_headers(),
        dict(default_headers or {}),
    )
    query = tuple((name, str(value)) for name, value in (default_query or {}).items())
    return Target(base_url=base_url, query=query, headers=headers)


def build_connections(
    *, max_concurrency: int = POOL_SIZE, **options: Unpack[ClientOptions]
) -> Connections:
    """Enough routes for ``max_concurrency`` calls in flight (``POOL_SIZE`` each), each an
    aiohttp ``Route`` of its own (no SDK imported; a proxy from the environment applies).

    Raises:
        LLMConfigurationError: the key variable is unset (named, never printed), or
            ``SSL_CERT_FILE``/``SSL_CERT_DIR`` names nothing usable (an https URL).
    """
    count = max(1, -(-max_concurrency // POOL_SIZE))
    size = -(-max_concurrency // count)
    key = read_key(options["api_key_env"], require_key=options.get("require_key", True))
    url = resolved_url(options["base_url"])

    def connect(index: int) -> openai.AsyncOpenAI:
        return sdk_client(key, options, size)

    if not AIOHTTP_ROUTES:  # the bench's comparison: the SDK's own stack for every call
        clients = {i: sdk_client(key, options, size) for i in range(count)}
        return Connections([None] * count, clients=clients)
    target = openai_target(
        url,
        key,
        default_headers=options.get("default_headers"),
        default_query=options.get("default_query"),
    )
    routes: list[Route | None] = [
        Route(target, size, options["connect_timeout_seconds"]) for _ in range(count)
    ]
    return Connections(routes, connect)


def sdk_client(key: str, options: ClientOptions, size: int = POOL_SIZE) -> openai.AsyncOpenAI:
    """An ``AsyncOpenAI`` (this imports the SDK) with its retries off and an explicit
    timeout, on the SDK's own stack with ``size`` connections, verifying with the one
    shared TLS context."""
    # here, not at the top: the SDK and httpx2 cost ~0.6 s of CPU to import, and a call
    # on a route needs neither
    import httpx2
    import openai

    http_client = openai.DefaultAsyncHttpxClient(
        limits=httpx2.Limits(max_connections=size, max_keepalive_connections=size),
        verify=shared_ssl_context(),
    )
    return openai.AsyncOpenAI(
        api_key=key,
        base_url=options["base_url"] or None,
        max_retries=0,
        timeout=httpx2.Timeout(
            options["timeout_seconds"], connect=options["connect_timeout_seconds"]
        ),
        default_headers=options.get("default_headers"),
        default_query=options.get("default_query"),
        http_client=http_client,
    )


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
        repaired = escape_raw_controls(text) if _raw_control(exc) else None
        if repaired is not None:
            try:
                return schema.model_validate_json(repaired), text
            except ValidationError:
                pass  # the answer's own error is the one to report
        raise schema_mismatch(schema, exc, text, usage, model) from exc


#: what changes the meaning of what follows in JSON text: an escape, a quote; and the raw
#: control characters (one step each: the scan is linear whatever the text)
_JSON_TOKEN = re.compile(r'\\.|"|[\x00-\x1f]', re.DOTALL)
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _raw_control(exc: ValidationError) -> bool:
    return any(
        e["type"] == "json_invalid" and "control character" in e["msg"] for e in exc.errors()
    )


def escape_raw_controls(text: str) -> str | None:
    """``text`` with the raw control characters inside its JSON strings escaped, or
    ``None`` when it has none there.

    Small models (Gemma 3 270M on llama.cpp, for one) write a line break inside a string
    as the character itself, which JSON does not allow; the escaped text is what they
    meant. Nothing outside the strings changes: a control character there is still an
    error, and so is anything else wrong with the answer.
    """
    pieces: list[str] = []
    done = 0  # text[:done] is in pieces
    inside = False
    for token in _JSON_TOKEN.finditer(text):
        char = token.group()
        if char == '"':
            inside = not inside
        elif inside and len(char) == 1:  # a raw control character in a string
            pieces += (text[done : token.start()], _ESCAPES.get(char, f"\\u{ord(char):04x}"))
            done = token.end()
    if not pieces:
        return None
    pieces.append(text[done:])
    return "".join(pieces)


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
    connections: Connections,
    path: str,
    payload: dict[str, Any],
    timeout_seconds: float,
    connect_timeout_seconds: float,
    *,
    call: CallIdentity | None = None,
) -> bytes:
    """POST ``payload`` (serialized once, with orjson) on the least busy route; raw body.

    ``timeout_seconds`` is a total deadline: connecting, the headers and the body all
    count against it. A route sends through aiohttp (its errors are ``sim.providers.http``'s
    ``HttpPostError``s); a client handed in through the SDK's ``post`` (its errors are
    the SDK's, and ``TimeoutError`` at the deadline); ``_openai_errors.map_openai_error``
    maps them all. The call's idempotency key (from its identity and exact body) goes
    along, so a request re-sent after a crash or a timeout can be answered from the
    provider's cache instead of being paid for twice (``call``: ``None`` sends none).
    """
    content = orjson.dumps(payload)
    key = idempotency_key(call, content)
    index = connections.acquire()
    try:
        route = connections.routes[index]
        if route is not None:
            return await route.post(path, content, timeout_seconds, key)
        import httpx2  # loaded already: a client was handed in

        options: openai.RequestOptions = {
            "timeout": httpx2.Timeout(timeout_seconds, connect=connect_timeout_seconds)
        }
        if key is not None:
            options["headers"] = {IDEMPOTENCY_HEADER: key}
        async with asyncio.timeout(timeout_seconds):  # httpx's timeouts are per read
            return await connections.client(index).post(
                path, cast_to=bytes, content=content, options=options
            )
    finally:
        connections.release(index)
