"""What the ``openai`` and ``chat`` adapters share: where and how a request is sent (the
``Target`` and the aiohttp routes of ``sim.providers.http``; the SDK's client only where a
user hands one in), strict schemas, checking an answer's text against its schema.

Every request goes through ``http.Route`` (aiohttp, proxies from the environment
included): calls, streamed or not (``post_json``), and the rest of the API
(``ServerAPI``: the Batch API's files and batches, a stored response read or deleted).
The OpenAI SDK is used only for a client handed in (``OpenAIAdapter(client)``), whose
every request then goes through the SDK's own stack; nothing else imports it
(``import openai`` costs ~0.4 s of CPU).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, Unpack

import orjson
from pydantic import BaseModel, ValidationError

from sim.llm.calls import CallIdentity, idempotency_key
from sim.llm.enums import SchemaEnums, constrain
from sim.llm.errors import LLMConfigurationError, LLMSchemaError
from sim.llm.types import Usage
from sim.providers._strict_schema import to_strict_json_schema, without_lengths
from sim.providers.http import (
    IDEMPOTENCY_HEADER,
    POOL_SIZE,
    Route,
    Target,
    Upload,
    merge_headers,
    pool_sizes,
)
from sim.version import __version__

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


#: the endpoint the OpenAI SDK uses when neither ``base_url`` nor ``OPENAI_BASE_URL`` is set
DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: the User-Agent of the routes (the SDK's own stack sends the SDK's)
USER_AGENT = f"sim/{__version__}"


class Connections:
    """The routes of one adapter to its server, one per connection pool.

    Each route is an aiohttp ``Route``, or ``None`` where a user handed in an SDK client
    (its requests then go through the SDK's own stack). ``acquire`` hands out the route
    with the fewest calls in flight, so no pool queues a call while another has a free
    connection.

    Args:
        routes: per route, its ``Route`` or ``None``.
        clients: the SDK clients handed in, by route (for each ``None`` route).
    """

    def __init__(
        self,
        routes: list[Route | None],
        clients: Mapping[int, openai.AsyncOpenAI] | None = None,
    ) -> None:
        self.routes = routes
        self._clients: dict[int, openai.AsyncOpenAI] = dict(clients or {})
        self._in_flight = [0] * len(routes)

    @classmethod
    def of(cls, client: openai.AsyncOpenAI) -> Connections:
        """One route: the SDK's own stack on a client handed in."""
        return cls([None], clients={0: client})

    def __len__(self) -> int:
        return len(self.routes)

    def client(self, index: int = 0) -> openai.AsyncOpenAI:
        """The SDK client handed in for route ``index`` (a route of aiohttp has none)."""
        client = self._clients.get(index)
        if client is None:  # pragma: no cover - callers look at the route first
            raise LookupError(f"route {index} sends through aiohttp: no SDK client")
        return client

    def acquire(self) -> int:
        """The index of the least busy route, counted busy until ``release``."""
        counts = self._in_flight
        index = counts.index(min(counts)) if len(counts) > 1 else 0
        counts[index] += 1
        return index

    def release(self, index: int) -> None:
        self._in_flight[index] -= 1

    async def aclose(self) -> None:
        """Close the SDK clients handed in and the routes' connections."""
        for client in self._clients.values():
            await client.close()
        for route in self.routes:
            if route is not None:
                await route.aclose()


def _usage_from(data: dict[str, Any], input_key: str, output_key: str) -> Usage:
    """The ``usage`` of an OpenAI-format answer, its counts named ``input_key`` and
    ``output_key``; cached tokens sit in ``<input_key>_details.cached_tokens`` in both APIs."""
    usage = data.get("usage") or {}
    details = usage.get(f"{input_key}_details") or {}
    return Usage(
        input_tokens=int(usage.get(input_key) or 0),
        output_tokens=int(usage.get(output_key) or 0),
        cached_input_tokens=int(details.get("cached_tokens") or 0),
    )


def responses_usage(data: dict[str, Any]) -> Usage:
    """The ``usage`` of a Responses API answer (``input_tokens``, ``output_tokens``)."""
    return _usage_from(data, "input_tokens", "output_tokens")


def chat_usage(data: dict[str, Any]) -> Usage:
    """The ``usage`` of a chat completion (``prompt_tokens``, ``completion_tokens``)."""
    return _usage_from(data, "prompt_tokens", "completion_tokens")


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
    count, size = pool_sizes(max_concurrency)
    key = read_key(options["api_key_env"], require_key=options.get("require_key", True))
    url = resolved_url(options["base_url"])
    target = openai_target(
        url,
        key,
        default_headers=options.get("default_headers"),
        default_query=options.get("default_query"),
    )
    routes: list[Route | None] = [
        Route(target, size, options["connect_timeout_seconds"]) for _ in range(count)
    ]
    return Connections(routes)


class ServerAPI:
    """The requests of the OpenAI API besides calls: the Batch API's files and batches, a
    stored response read or deleted. They go on the first route's connections (aiohttp,
    the calls' headers, proxy and TLS context), or, where a user handed in an SDK client,
    through it. Failures are a route's ``HttpPostError`` kinds or the SDK's exceptions:
    ``_openai_errors.post_failures`` catches both, ``map_openai_error`` maps both.

    Args:
        connections: the adapter's routes (its first is used: a Batch API batch and a
            stored response live on one server).
        base_url: where they go, as messages name it.
        timeout_seconds: the total deadline of each request.
    """

    def __init__(self, connections: Connections, base_url: str, timeout_seconds: float) -> None:
        self.connections = connections
        self.base_url = base_url
        self.timeout_seconds = timeout_seconds

    @property
    def _route(self) -> Route | None:
        return self.connections.routes[0]

    async def json(
        self,
        method: str,
        path: str,
        payload: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        """``method`` ``path`` (under the base URL) with ``payload`` as its JSON body; the
        answer's JSON (``None`` for an empty body)."""
        timeout = self.timeout_seconds if timeout is None else timeout
        route = self._route
        if route is not None:
            content = None if payload is None else orjson.dumps(payload)
            body = await route.request(method, path, timeout, content=content)
            return orjson.loads(body) if body.strip() else None
        client = self.connections.client(0)
        options: openai.RequestOptions = {"timeout": timeout, "max_retries": 0}
        if method == "GET":
            return await client.get(path, cast_to=object, options=options)
        if method == "DELETE":
            return await client.delete(path, cast_to=object, options=options)
        return await client.post(path, cast_to=object, body=payload, options=options)

    async def content(self, path: str) -> bytes:
        """GET ``path``: the answer's raw body (a file's content)."""
        route = self._route
        if route is not None:
            return await route.request("GET", path, self.timeout_seconds)
        client = self.connections.client(0)
        options: openai.RequestOptions = {"timeout": self.timeout_seconds, "max_retries": 0}
        return await client.get(path, cast_to=bytes, options=options)

    async def upload(self, purpose: str, filename: str, data: bytes, content_type: str) -> Any:
        """POST ``data`` as a file for ``purpose`` (``/files``); the file object's JSON."""
        route = self._route
        if route is not None:
            upload = Upload(filename, data, content_type, fields=(("purpose", purpose),))
            body = await route.request("POST", "/files", self.timeout_seconds, upload=upload)
            return orjson.loads(body)
        client = self.connections.client(0)
        made = await client.files.create(
            file=(filename, data, content_type),
            purpose=purpose,  # type: ignore[arg-type]
            timeout=self.timeout_seconds,
        )
        return made.model_dump()


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
