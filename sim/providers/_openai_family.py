"""The base of the OpenAI wire family: ``openai`` (Responses API) and ``chat`` (chat
completions).

What they share lives here: construction (the routes to the server: aiohttp sessions
with no SDK, SDK clients with retries off and explicit timeouts where they are needed;
the key read from a named environment variable and never printed), the one POST of a
call (the body serialized once with orjson and sent by ``post_json`` with the call's
idempotency key; failures of either path mapped to the ``LLMError`` tree by one table; a
body that is not a JSON object is a ``bad_response``),
and the flow of ``execute``: build the wire body, post it, read the answer. Each adapter
keeps only its wire format: ``path``, ``body(request)`` and ``answer(request, data)``.
"""

from __future__ import annotations

import functools
import math
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict

import orjson

from sim.llm.capacity import ServerCapacity
from sim.llm.embedding import Embedded
from sim.llm.errors import LLMAPIError
from sim.llm.profile import ProviderProfile
from sim.llm.redact import redact_url
from sim.llm.types import AdapterResponse, ModelRequest, Usage
from sim.providers._adapter_common import Responder
from sim.providers._capacity import server_root
from sim.providers._openai_common import (
    LOCAL_MAX_LENGTH,
    Connections,
    ServerAPI,
    build_connections,
    post_json,
    resolved_url,
)
from sim.providers._openai_errors import map_openai_error, post_failures
from sim.providers._streaming import Assembler, StreamTimeouts, post_stream
from sim.providers._structured import FormSelector

if TYPE_CHECKING:
    import openai

Json = dict[str, Any]

_LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")
#: seconds a capacity question may take (the server answers it without the model)
_CAPACITY_TIMEOUT = 5.0
#: the largest answer to a capacity question read (llama-cpp-python's OpenAPI is ~60 kB)
_CAPACITY_MAX_BYTES = 4 * 1024 * 1024


class FamilyOptions(TypedDict, total=False):
    """The keyword options every adapter of the family takes (``OpenAIFamilyAdapter``);
    an adapter with options of its own passes these on unchanged."""

    base_url: str | None
    api_key_env: str
    timeout_seconds: float
    connect_timeout_seconds: float
    max_concurrency: int
    default_headers: Mapping[str, str] | None
    default_query: Mapping[str, str] | None


class OpenAIFamilyAdapter(Responder, ABC):
    """An adapter speaking one of OpenAI's wire formats.

    Args:
        client: an ``openai.AsyncOpenAI`` to use (every request then goes through the
            SDK's stack: calls, the Batch API, stored responses); when omitted, aiohttp
            routes are built from the other arguments (``http.Route``; a proxy from the
            environment applies) and the SDK is never imported.
        base_url: API base URL (``None``: ``OPENAI_BASE_URL``, else OpenAI's).
        api_key_env: the environment variable holding the key.
        timeout_seconds: default total timeout; each call uses its settings' timeout.
        connect_timeout_seconds: connect timeout.
        max_concurrency: calls in flight to size the HTTP connection pools for.
        default_headers: headers sent with every call (after the key and the
            environment's ``OPENAI_ORG_ID``/``OPENAI_PROJECT_ID``/``OPENAI_CUSTOM_HEADERS``,
            replacing any of the same name), as the SDK's ``default_headers``.
        default_query: query parameters sent with every call (``api-version``...).
    """

    #: what the rest of sim knows of the kind (``sim.providers.profiles``)
    profile: ClassVar[ProviderProfile]
    #: the endpoint every call posts to, under the base URL
    path: ClassVar[str]
    #: a base URL on this machine may go without a key (local model servers)
    local_without_key: ClassVar[bool] = False
    #: the request field a server names when it refuses a structured-output form
    schema_field: ClassVar[str] = "response_format"
    #: the most texts one ``embed`` sends (OpenAI takes 2,048 inputs a request)
    max_texts: int = 2048

    def __init__(
        self,
        client: openai.AsyncOpenAI | None = None,
        *,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_seconds: float = 60.0,
        connect_timeout_seconds: float = 10.0,
        max_concurrency: int = 64,
        default_headers: Mapping[str, str] | None = None,
        default_query: Mapping[str, str] | None = None,
    ) -> None:
        self.api_key_env = api_key_env
        self.timeout_seconds = timeout_seconds
        self.connect_timeout_seconds = connect_timeout_seconds
        local = bool(base_url) and any(host in str(base_url) for host in _LOCAL_HOSTS)
        #: where calls go (the SDK's default when none is configured)
        self.base_url = str(client.base_url) if client is not None else resolved_url(base_url)
        host = urllib.parse.urlsplit(self.base_url).hostname
        #: a schema sent may carry a grammar's forms (a root ``anyOf``, ``prefixItems``:
        #: ``sim.llm.enums``): the profile says which hosts' strict mode takes neither
        self.grammar = self.profile.grammar(host)
        #: OpenAI's own API (a host whose strict mode takes no grammar's forms): it serves
        #: far more than any client's concurrency and reports none, so its capacity is
        #: not asked
        self.hosted = host in self.profile.grammarless_hosts
        #: the string caps sent in answer schemas (``strict_schema``): none to OpenAI's
        #: strict mode, the short ones to a server whose grammar enforces them
        self.sent_lengths: bool | int = False if self.hosted else LOCAL_MAX_LENGTH
        self.connections = (
            Connections.of(client)
            if client is not None
            else build_connections(
                base_url=base_url,
                api_key_env=api_key_env,
                timeout_seconds=timeout_seconds,
                connect_timeout_seconds=connect_timeout_seconds,
                max_concurrency=max_concurrency,
                require_key=not (self.local_without_key and local),
                default_headers=default_headers,
                default_query=default_query,
            )
        )

    @functools.cached_property
    def forms(self) -> FormSelector:
        """``auto`` structured output: the form this endpoint takes, settled once per run."""
        order = tuple(f for f in self.profile.structured_output if f != "auto")
        return FormSelector(redact_url(self.base_url.rstrip("/")), self.schema_field, order)

    @functools.cached_property
    def api(self) -> ServerAPI:
        """The rest of the API (the Batch API, stored responses) on the same connections:
        the first route's, or the client handed in."""
        return ServerAPI(self.connections, redact_url(self.base_url), self.timeout_seconds)

    @abstractmethod
    def body(self, request: ModelRequest) -> Json:
        """The JSON body that asks for ``request`` in this wire format."""

    @abstractmethod
    async def answer(self, request: ModelRequest, data: Json) -> AdapterResponse:
        """The answer in ``data``, checked and parsed; raises ``LLMError`` carrying the
        attempt's usage when it is refused, cut short or invalid."""

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        data = await self.post(request, self.body(request))
        return await self.answer(request, data)

    def assembler(self) -> Assembler:
        """What rebuilds this wire format's answer from its stream."""
        raise NotImplementedError(f"{type(self).__name__} cannot stream")

    def stream_fields(self) -> Json:
        """Extra body fields of a streamed call."""
        return {}

    async def post(self, request: ModelRequest, payload: Json) -> Json:
        """One POST of ``payload`` (the body asking ``request``) to ``path``; returns the
        answer as plain JSON. The call's identity (``request.call``) keys its idempotency.

        The request goes through the route's aiohttp session (``http.Route``), or, on a
        client handed in, through the SDK's own ``post`` (auth, headers, timeouts); either
        way with the body already serialized by orjson and the answer
        read as raw bytes: the SDK's per-call transformation of the typed params, its
        stdlib-JSON encoding and its construction of typed models cost more CPU than the
        rest of a call (measured), and we need only a few fields. Both paths' failures
        go through ``map_openai_error``'s one table.

        With ``settings.stream`` the answer is streamed (``_streaming.post_stream``) under
        the first-token, idle and total clocks, and assembled into the same JSON.

        A request of a Batch API session (``request.batch``: ``[llm] batch``) becomes a
        line of the session's next batch instead (``sim.providers.batch``); streaming
        does not apply.
        """
        settings = request.settings
        session = request.batch
        if session is not None:
            return await session.post(
                self.api,
                self.path,
                payload,
                model=settings.model,
                api_key_env=self.api_key_env,
                call=request.call,
            )
        try:
            if settings.stream:
                return await post_stream(
                    self.connections,
                    self.path,
                    {**payload, **self.stream_fields()},
                    self.assembler(),
                    StreamTimeouts(
                        settings.timeout_seconds,
                        settings.first_token_timeout_seconds,
                        settings.idle_timeout_seconds,
                    ),
                    connect_timeout_seconds=self.connect_timeout_seconds,
                    model=settings.model,
                    call=request.call,
                    stream_to=request.stream_to,
                )
            raw = await post_json(
                self.connections,
                self.path,
                payload,
                settings.timeout_seconds,
                self.connect_timeout_seconds,
                call=request.call,
            )
            data = orjson.loads(raw)
        except post_failures() as exc:
            raise map_openai_error(exc, api_key_env=self.api_key_env, model=settings.model) from exc
        except orjson.JSONDecodeError as exc:
            raise LLMAPIError(
                f"the provider sent a body that is not JSON: {exc}", code="bad_response", cause=exc
            ) from exc
        if not isinstance(data, dict):
            raise LLMAPIError("the provider sent an unexpected body", code="bad_response")
        return data

    async def embed(self, model: str, texts: Sequence[str], timeout_seconds: float) -> Embedded:
        """The embeddings of ``texts`` by ``model``: one ``POST {base_url}/embeddings`` in
        OpenAI's format (``{"model", "input": [...]}`` -> ``data[i].embedding``), on the
        calls' own connections (base URL, key, headers, proxy, TLS). The answer is
        untrusted: one vector per text, each a list of the same number of finite numbers,
        matched to its text by ``index``, else a ``bad_response``.

        Raises:
            LLMError: as a call's failures are mapped (``map_openai_error``), or
                ``bad_response`` for an answer that is not the above.
        """
        payload = {"model": model, "input": list(texts), "encoding_format": "float"}
        try:
            raw = await post_json(
                self.connections,
                "/embeddings",
                payload,
                timeout_seconds,
                self.connect_timeout_seconds,
            )
            data = orjson.loads(raw)
        except post_failures() as exc:
            raise map_openai_error(exc, api_key_env=self.api_key_env, model=model) from exc
        except orjson.JSONDecodeError as exc:
            raise LLMAPIError(
                f"the embeddings answer is not JSON: {exc}", code="bad_response", cause=exc
            ) from exc
        vectors = _embeddings(data, len(texts))
        usage = data.get("usage")
        tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        counted = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0
        return Embedded(vectors, Usage(input_tokens=max(0, counted)))

    async def server_capacity(self) -> ServerCapacity | None:
        """How many requests the server serves at once, as it reports it
        (the profile's ``capacity``: ``sim.providers._capacity``); ``None`` for OpenAI's
        own API, which is not asked.

        Three small GETs at most, to the server's root on the configured host (no
        redirects followed, a short timeout, the key sent as the calls send it), on the
        first route's connections (its TLS context, proxy and headers): the SDK is not
        imported for them."""
        probe = self.profile.capacity
        if self.hosted or probe is None:
            return None
        route = self.connections.routes[0]
        if route is None:  # an SDK client handed in: its own stack, not asked
            return None
        root = urllib.parse.urlsplit(server_root(self.base_url)).path

        async def fetch(path: str) -> Any:
            body = await route.get(root + path, _CAPACITY_TIMEOUT, _CAPACITY_MAX_BYTES)
            try:
                return None if body is None else orjson.loads(body)
            except orjson.JSONDecodeError:
                return None

        return await probe(fetch)

    async def delete_response(self, response_id: str) -> None:
        """Nothing is stored at the provider unless an adapter says otherwise."""
        return None

    async def aclose(self) -> None:
        """Close the connections (call on the loop that used them)."""
        await self.connections.aclose()


def _embeddings(data: object, count: int) -> tuple[tuple[float, ...], ...]:
    """The ``count`` vectors of an embeddings answer, in input order.

    Raises:
        LLMAPIError: ``bad_response``, naming what is wrong.
    """

    def bad(problem: str) -> LLMAPIError:
        return LLMAPIError(f"the embeddings answer {problem}", code="bad_response")

    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list) or len(items) != count:
        raise bad(f"does not hold {count} embeddings under 'data'")
    found: dict[int, tuple[float, ...]] = {}
    size = -1
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad(f"has an entry that is not an object at data[{position}]")
        index = item.get("index", position)
        vector = item.get("embedding")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < count:
            raise bad(f"has a bad index at data[{position}]")
        if index in found:
            raise bad(f"holds index {index} twice")
        if (
            not isinstance(vector, list)
            or not vector
            or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for v in vector
            )
        ):
            raise bad(f"has an embedding that is not a list of numbers at data[{position}]")
        if size not in (-1, len(vector)):
            raise bad("has embeddings of different lengths")
        size = len(vector)
        found[index] = tuple(float(v) for v in vector)
    return tuple(found[i] for i in range(count))
