"""The adapters' HTTP routes (``http.Route``, aiohttp): what they send, how answers and
failures map, TLS, proxies.

Everything runs against real servers on 127.0.0.1 (the stub server, plain and with a
self-signed certificate) with the real openai SDK where the SDK's path is compared.
Misbehaving servers are in ``test_http_faults.py``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from pydantic import BaseModel, ConfigDict

import sim.providers.http as http
import sim.providers.http.tls as tls
from bench.tls import SelfSigned, self_signed
from sim.llm.errors import (
    LLMAPIError,
    LLMBudgetExceededError,
    LLMChainNotFoundError,
    LLMConfigurationError,
    LLMContextLengthError,
    LLMError,
    LLMRateLimitError,
    LLMTimeoutError,
)
from sim.llm.types import CallSettings, ModelRequest
from sim.providers._openai_common import (
    Connections,
    ServerAPI,
    build_connections,
    openai_target,
    post_json,
)
from sim.providers._openai_errors import map_openai_error, read_answer, sdk_answer
from sim.providers.chat import ChatAdapter
from sim.providers.http import (
    HttpPostError,
    HttpStatusError,
    HttpTLSError,
    Route,
    environment_proxy,
)
from sim.providers.openai import OpenAIAdapter
from sim.testing.raw_http import RawRequest, RawServer, head
from sim.testing.stub_server import ServerThread, StubOptions, StubServer

KEY_ENV = "SIM_FAST_HTTP_TEST_KEY"
SETTINGS = CallSettings(model="stub-model", timeout_seconds=5)
BODY = {
    "model": "stub-model",
    "instructions": "Write a note.",
    "input": "x",
    "text": {
        "format": {
            "type": "json_schema",
            "name": "Note",
            "schema": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
                "additionalProperties": False,
            },
            "strict": True,
        }
    },
}


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid", title="Note")

    text: str
    count: int


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test")
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("ALL_PROXY", raising=False)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> SelfSigned:
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def tls_stub(certificate: SelfSigned, monkeypatch: pytest.MonkeyPatch) -> Iterator[StubServer]:
    """The stub server over https, its certificate trusted through ``SSL_CERT_FILE`` (the
    public setting httpx and so the SDK read)."""
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate.cert))
    thread = ServerThread(
        StubServer(StubOptions(retry_after=2.5)), ssl=certificate.server_context()
    )
    server = thread.start()
    try:
        yield server
    finally:
        thread.stop()


def pool_for(url: str, direct: bool = True) -> Connections:
    """The adapters' routes to ``url`` (aiohttp); ``direct=False``: the SDK's own stack on
    a client handed in (``sdk``), the one place sim sends through the SDK."""
    if not direct:
        return Connections.of(sdk(url))
    return build_connections(
        base_url=url, api_key_env=KEY_ENV, timeout_seconds=5, connect_timeout_seconds=5
    )


def sdk(url: str, **options: Any) -> openai.AsyncOpenAI:
    """An SDK client as a user would hand one in: retries off, verifying as sim does."""
    return openai.AsyncOpenAI(
        api_key="sk-test",
        base_url=url,
        max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(verify=http.shared_ssl_context()),
        **options,
    )


def test_http_and_https_base_urls_get_aiohttp_routes() -> None:
    for url in ("http://127.0.0.1:9/v1", "https://api.example.invalid/v1"):
        pool = pool_for(url)
        assert len(pool) == 1
        route = pool.routes[0]
        assert isinstance(route, Route), url
        assert route.scheme == url.split(":")[0]
        assert route.proxy is None
        assert route.size == http.POOL_SIZE


def test_a_proxy_comes_from_the_environment_unless_no_proxy_covers_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert environment_proxy("http://10.1.2.3:8000/v1") is None
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    assert environment_proxy("http://10.1.2.3:8000/v1") == "http://proxy.invalid:3128"
    assert environment_proxy("https://api.example.invalid/v1") is None  # not an https one
    route = pool_for("http://10.1.2.3:8000/v1").routes[0]
    assert route is not None and route.proxy == "http://proxy.invalid:3128"
    monkeypatch.setenv("NO_PROXY", "10.1.2.3")
    assert environment_proxy("http://10.1.2.3:8000/v1") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3129")
    assert environment_proxy("https://api.example.invalid/v1") == "http://proxy.invalid:3129"
    monkeypatch.setenv("NO_PROXY", ".example.invalid")
    assert environment_proxy("https://api.example.invalid/v1") is None


async def test_calls_go_through_the_proxy_the_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``HTTP_PROXY`` set the request goes to the proxy, in absolute form, with the
    proxy's credentials in ``Proxy-Authorization``; ``NO_PROXY`` sends it straight."""

    async def answer(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(head(200, 2) + b"{}")
        return True

    proxy, origin = RawServer(answer), RawServer(answer)
    await proxy.start()
    await origin.start()
    try:
        monkeypatch.setenv("HTTP_PROXY", f"http://user:pw@127.0.0.1:{proxy.port}")
        pool = pool_for(origin.base_url)
        try:
            assert await post_json(pool, "/responses", {}, 5, 5) == b"{}"
        finally:
            await pool.aclose()
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        pool = pool_for(origin.base_url)
        try:
            assert await post_json(pool, "/responses", {}, 5, 5) == b"{}"
        finally:
            await pool.aclose()
    finally:
        await proxy.close()
        await origin.close()
    (through,) = proxy.requests
    assert through.target == f"{origin.base_url}/responses"
    assert through.headers["proxy-authorization"] == "Basic dXNlcjpwdw=="  # user:pw
    assert through.headers["authorization"] == "Bearer sk-test"
    (straight,) = origin.requests
    assert straight.target == "/v1/responses" and "proxy-authorization" not in straight.headers


async def test_an_https_proxy_tunnel_never_carries_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """For an https URL the proxy is asked for a tunnel (CONNECT) with its own
    credentials only: the API key travels inside the TLS tunnel, never to the proxy."""

    async def refuse(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
        return False

    proxy = RawServer(refuse)
    await proxy.start()
    monkeypatch.setenv("HTTPS_PROXY", f"http://user:pw@127.0.0.1:{proxy.port}")
    pool = pool_for("https://api.example.invalid/v1")
    try:
        with pytest.raises(HttpPostError):
            await post_json(pool, "/responses", {}, 5, 5)
    finally:
        await pool.aclose()
        await proxy.close()
    (tunnel,) = proxy.requests
    assert tunnel.method == "CONNECT" and tunnel.target == "api.example.invalid:443"
    assert tunnel.headers["proxy-authorization"] == "Basic dXNlcjpwdw=="
    assert "authorization" not in tunnel.headers
    assert "sk-test" not in str(tunnel.headers)


def test_every_route_shares_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """Routes verify with one context per process: loading the
    certificate store for each route (one per 16 connections) cost ~0.27 s of start-up at
    concurrency 200."""
    built: list[ssl.SSLContext] = []
    default = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        built.append(default(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(ssl, "create_default_context", counting)
    monkeypatch.setattr(tls, "_SSL_CONTEXTS", {})
    monkeypatch.setenv(KEY_ENV, "sk-test")
    url = "https://api.example.invalid/v1"
    options: Any = {"base_url": url, "api_key_env": KEY_ENV}
    direct = build_connections(
        **options, timeout_seconds=5, connect_timeout_seconds=5, max_concurrency=64
    )
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    proxied = build_connections(
        **options, timeout_seconds=5, connect_timeout_seconds=5, max_concurrency=64
    )
    assert len(direct) == len(proxied) == 4
    assert all(isinstance(r, Route) and r.proxy is None for r in direct.routes)
    assert all(isinstance(r, Route) and r.proxy for r in proxied.routes)
    assert len(built) == 1
    assert http.shared_ssl_context() is built[0]


def test_a_missing_certificate_file_or_folder_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tls, "_SSL_CONTEXTS", {})
    missing = tmp_path / "nowhere" / "ca.pem"
    monkeypatch.setenv("SSL_CERT_FILE", str(missing))
    with pytest.raises(LLMConfigurationError) as info:
        pool_for("https://api.example.invalid/v1")
    assert "SSL_CERT_FILE" in str(info.value) and str(missing) in str(info.value)
    assert isinstance(pool_for("http://127.0.0.1:9/v1").routes[0], Route)  # no TLS: no need
    monkeypatch.delenv("SSL_CERT_FILE")
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path / "no-dir"))
    with pytest.raises(LLMConfigurationError) as info:
        pool_for("https://api.example.invalid/v1")
    assert "SSL_CERT_DIR" in str(info.value) and "no-dir" in str(info.value)
    empty = tmp_path / "empty.pem"
    empty.write_text("not a certificate\n")
    monkeypatch.delenv("SSL_CERT_DIR")
    monkeypatch.setenv("SSL_CERT_FILE", str(empty))
    with pytest.raises(LLMConfigurationError, match="SSL_CERT_FILE"):
        pool_for("https://api.example.invalid/v1")


def test_errors_name_an_ipv6_host_in_brackets_without_user_or_query() -> None:
    route = pool_for("http://user:pw@[::1]:8000/v1?secret=1").routes[0]
    assert route is not None
    assert route.shown == "http://[::1]:8000/v1"


@pytest.mark.parametrize("kind", [OpenAIAdapter, ChatAdapter])
async def test_many_calls_in_flight_reuse_connections(
    stub_server: StubServer, kind: type[OpenAIAdapter | ChatAdapter]
) -> None:
    adapter = kind(base_url=stub_server.base_url, api_key_env=KEY_ENV, max_concurrency=40)
    try:
        for _ in range(3):
            answers = await asyncio.gather(
                *(
                    adapter.execute(
                        ModelRequest("Write a note.", f"about {i}", Note, settings=SETTINGS)
                    )
                    for i in range(40)
                )
            )
            assert all(isinstance(a.parsed, Note) for a in answers)
    finally:
        await adapter.aclose()
    assert stub_server.stats.generations == 120
    assert stub_server.stats.connections <= 40  # kept alive across the rounds


async def test_https_calls_reuse_tls_connections(tls_stub: StubServer) -> None:
    pool = pool_for(tls_stub.base_url)
    assert pool.routes[0] is not None
    try:
        for _ in range(3):
            answers = await asyncio.gather(
                *(post_json(pool, "/responses", BODY, 5, 5) for _ in range(16))
            )
            assert all(b'"output"' in a for a in answers)
        assert tls_stub.stats.connections <= 16  # the route's pool, kept alive
        # the rest of the API (the Batch API, stored responses) goes on the same route's
        # connections: no SDK client, no pool of its own
        answer = await ServerAPI(pool, tls_stub.base_url, 5).json("POST", "/responses", BODY)
        assert answer["output"]
    finally:
        await pool.aclose()
    assert tls_stub.stats.generations == 49
    assert tls_stub.stats.connections <= 16


@pytest.mark.parametrize("kind", [OpenAIAdapter, ChatAdapter])
async def test_an_untrusted_certificate_is_named_with_its_host(
    certificate: SelfSigned,
    monkeypatch: pytest.MonkeyPatch,
    kind: type[OpenAIAdapter | ChatAdapter],
) -> None:
    """Not "cannot connect": a configuration error (it stops the tick; retrying cannot
    help) naming the host, what failed and the setting that fixes it."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with ServerThread(StubServer(), ssl=certificate.server_context()) as server:
        adapter = kind(base_url=server.base_url, api_key_env=KEY_ENV)
        try:
            with pytest.raises(LLMConfigurationError) as info:
                await adapter.execute(ModelRequest("Write.", "x", Note, settings=SETTINGS))
        finally:
            await adapter.aclose()
    assert isinstance(info.value.cause, HttpTLSError)
    assert info.value.cause.host == "127.0.0.1"
    message = info.value.message
    assert "certificate of 127.0.0.1 did not verify" in message
    assert "self-signed certificate" in message and "SSL_CERT_FILE" in message
    assert info.value.code == "tls_error"


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("rate_limit", LLMRateLimitError),
        ("server_error", LLMAPIError),
        ("auth", LLMConfigurationError),
    ],
)
async def test_http_errors_still_map(
    stub_server: StubServer, fault: str, error: type[LLMError]
) -> None:
    adapter = OpenAIAdapter(base_url=stub_server.base_url, api_key_env=KEY_ENV)
    assert adapter.connections.routes[0] is not None
    stub_server.enqueue(fault)
    try:
        with pytest.raises(error) as info:
            await adapter.execute(ModelRequest("Write.", "x", Note, settings=SETTINGS))
        assert isinstance(info.value.cause, HttpStatusError)  # no SDK exception on the way
        if fault == "rate_limit":
            assert isinstance(info.value, LLMRateLimitError)
            assert info.value.cause.status == 429
            assert info.value.retry_after == pytest.approx(stub_server.options.retry_after)
        answer = await adapter.execute(ModelRequest("Write.", "x", Note, settings=SETTINGS))
        assert isinstance(answer.parsed, Note)  # the connection is still usable
    finally:
        await adapter.aclose()


def error_facts(error: LLMError) -> tuple[Any, ...]:
    """What a user and recovery see of an error (its cause is each path's own)."""
    return (
        type(error),
        error.message,
        error.code,
        error.retry_after,
        getattr(error, "status_code", None),
        getattr(error, "response_body", None),
    )


#: every row of the error table the stub can answer (``previous_response_not_found`` is
#: a request for an unknown previous response)
TABLE = [
    "rate_limit",
    "insufficient_quota",
    "auth",
    "forbidden",
    "context_length",
    "model_not_found",
    "server_error",
    "bad_gateway",
    "previous_response_not_found",
]


@pytest.mark.parametrize("fault", TABLE)
async def test_a_status_maps_the_same_on_a_route_and_on_the_sdk_path(
    tls_stub: StubServer, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """Each status (a 429 with Retry-After, 401, 403, ...) on a route, over http
    and https, becomes the same sim error as through the SDK's own stack: same type,
    message, code, retry_after, status and body, and the answer read the same way."""
    facts: dict[str, tuple[Any, ...]] = {}
    answers = {}
    body = dict(BODY)
    if fault == "previous_response_not_found":
        body["previous_response_id"] = "resp_unknown"
    with ServerThread(StubServer(StubOptions(retry_after=2.5))) as plain:
        for label, url, direct in (
            ("http direct", plain.base_url, True),
            ("https direct", tls_stub.base_url, True),
            ("http sdk", plain.base_url, False),
            ("https sdk", tls_stub.base_url, False),
        ):
            pool = pool_for(url, direct)
            assert (pool.routes[0] is not None) == direct, label
            server = tls_stub if url.startswith("https") else plain
            if fault != "previous_response_not_found":
                server.enqueue(fault)
            try:
                with pytest.raises(Exception) as info:
                    await post_json(pool, "/responses", body, 5, 5)
            finally:
                await pool.aclose()
            raised = info.value
            if direct:
                assert isinstance(raised, HttpStatusError), label
                answers[label] = read_answer(raised.status, raised.headers, raised.content)
            else:
                assert isinstance(raised, openai.APIStatusError), label
                answers[label] = sdk_answer(raised)
            mapped = map_openai_error(raised, api_key_env=KEY_ENV, model="stub-model")
            facts[label] = error_facts(mapped)
            assert "sk-test" not in str(mapped) and "sk-test" not in str(raised)
    first = facts["http sdk"]
    assert all(value == first for value in facts.values()), facts
    assert all(answer == answers["http sdk"] for answer in answers.values()), answers
    expected = {
        "rate_limit": (LLMRateLimitError, "rate_limit"),
        "insufficient_quota": (LLMBudgetExceededError, "insufficient_quota"),
        "auth": (LLMConfigurationError, "configuration_error"),
        "forbidden": (LLMConfigurationError, "configuration_error"),
        "context_length": (LLMContextLengthError, "context_length"),
        "model_not_found": (LLMConfigurationError, "configuration_error"),
        "server_error": (LLMAPIError, "server_error"),
        "bad_gateway": (LLMAPIError, "server_error"),
        "previous_response_not_found": (LLMChainNotFoundError, "previous_response_not_found"),
    }[fault]
    assert (first[0], first[2]) == expected, first
    if fault == "rate_limit":
        assert first[3] == pytest.approx(2.5)
    if fault in ("auth", "forbidden"):
        assert KEY_ENV in first[1]  # names the variable, never the key
    if fault == "bad_gateway":
        assert first[5] == "<html><body><h1>502 Bad Gateway</h1></body></html>"


@pytest.mark.parametrize("direct", [True, False])
async def test_a_timeout_and_a_refused_connection_map_the_same_on_both_paths(
    stub_server: StubServer, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    """Same type and code on a route and on the SDK's stack; a route's message also says
    what the connection attempt met."""
    facts = []
    for url, fault in ((stub_server.base_url, "hang"), ("http://127.0.0.1:9/v1", None)):
        pool = pool_for(url, direct)
        assert (pool.routes[0] is not None) == direct
        if fault:
            stub_server.enqueue(fault)
        try:
            with pytest.raises(Exception) as info:
                await post_json(pool, "/responses", BODY, 0.3, 5)
        finally:
            await pool.aclose()
        facts.append(error_facts(map_openai_error(info.value, api_key_env=KEY_ENV, model="m")))
    assert facts[0] == (LLMTimeoutError, "request to m timed out", "timeout", None, None, None)
    kind, message, code = facts[1][:3]
    assert (kind, code) == (LLMAPIError, "connection_error")
    assert message.startswith("connection to the provider failed: Connection error")
    if direct:
        assert "Cannot connect to host 127.0.0.1:9" in message


async def test_a_hang_past_the_timeout_is_a_timeout(stub_server: StubServer) -> None:
    adapter = OpenAIAdapter(base_url=stub_server.base_url, api_key_env=KEY_ENV)
    stub_server.enqueue("hang")
    try:
        with pytest.raises(LLMTimeoutError):
            await adapter.execute(
                ModelRequest(
                    "Write.", "x", Note, settings=CallSettings(model="m", timeout_seconds=0.3)
                )
            )
    finally:
        await adapter.aclose()


async def test_connection_refused_is_a_connection_error() -> None:
    adapter = OpenAIAdapter(base_url="http://127.0.0.1:9/v1", api_key_env=KEY_ENV)
    try:
        with pytest.raises(LLMAPIError) as info:
            await adapter.execute(ModelRequest("Write.", "x", Note, settings=SETTINGS))
        assert info.value.code == "connection_error"
    finally:
        await adapter.aclose()


class Capture:
    """A loopback HTTP server that records each request's target and headers and answers
    ``{}`` (what the SDK and a route send, compared byte for byte)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, list[tuple[str, str]]]] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Capture:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                lines = head.split("\r\n")
                headers = [
                    (name.strip().lower(), value.strip())
                    for name, _, value in (line.partition(":") for line in lines[1:] if line)
                ]
                length = int(dict(headers).get("content-length", "0"))
                await reader.readexactly(length)
                self.requests.append((lines[0].split(" ")[1], headers))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
                writer.write(b"content-length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()


#: what the SDK sends that a route does not: its self-description and per-try
#: bookkeeping, and the clients' transport defaults (HTTP/1.1 keeps alive without
#: saying; aiohttp's ``Accept-Encoding: gzip, deflate``)
SDK_ONLY = {
    "user-agent",
    "x-stainless-lang",
    "x-stainless-package-version",
    "x-stainless-os",
    "x-stainless-arch",
    "x-stainless-runtime",
    "x-stainless-runtime-version",
    "x-stainless-async",
    "x-stainless-retry-count",
    "x-stainless-read-timeout",
    "accept-encoding",
    "connection",
}


async def test_a_route_sends_what_the_sdk_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The target the adapters build without the SDK carries what an SDK client with the
    same settings sends: the bearer key, JSON headers, the environment's organization,
    project and custom headers, the user's default headers (replacing any of the same
    name) and default query, the idempotency key; nothing else but sim's User-Agent."""
    monkeypatch.setenv("OPENAI_ORG_ID", "org-1")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-1")
    monkeypatch.setenv("OPENAI_CUSTOM_HEADERS", "X-Env: one\nX-Team: env")
    defaults = {"X-Team": "red", "api-key": "azure-style"}
    query = {"api-version": "2024-10-21"}
    async with Capture() as server:
        url = f"http://127.0.0.1:{server.port}/v1"
        pool = build_connections(
            base_url=url,
            api_key_env=KEY_ENV,
            timeout_seconds=5,
            connect_timeout_seconds=5,
            default_headers=defaults,
            default_query=query,
        )
        assert pool.routes[0] is not None
        client = openai.AsyncOpenAI(
            api_key="sk-test",
            base_url=url,
            max_retries=0,
            default_headers=defaults,
            default_query=query,
        )
        try:
            await post_json(pool, "/responses", {}, 5, 5)
            await client.post(
                "/responses",
                cast_to=bytes,
                content=b"{}",
                options={"headers": {"Idempotency-Key": "key-1"}},
            )
        finally:
            await client.close()
            await pool.aclose()
    (direct_target, direct_headers), (sdk_target, sdk_headers) = server.requests
    assert dict(direct_headers)["accept-encoding"].startswith("gzip, deflate")
    assert direct_target == sdk_target == "/v1/responses?api-version=2024-10-21"
    direct = dict(direct_headers)
    assert len(direct) == len(direct_headers)  # no header twice
    assert direct["authorization"] == "Bearer sk-test"
    assert direct["x-team"] == "red" and direct["api-key"] == "azure-style"
    assert direct["x-env"] == "one"
    assert direct["openai-organization"] == "org-1" and direct["openai-project"] == "proj-1"
    assert direct["user-agent"].startswith("sim/")
    sdk = {name: value for name, value in sdk_headers if name not in SDK_ONLY}
    # the SDK's idempotency key is the one given here; a route's the call's own
    sdk.pop("idempotency-key")
    assert {name: value for name, value in direct.items() if name not in SDK_ONLY} == sdk


async def test_a_route_sends_the_calls_idempotency_key() -> None:
    async with Capture() as server:
        url = f"http://127.0.0.1:{server.port}/v1"
        route = Route(openai_target(url, "sk-test"), 1, 5)
        try:
            await route.post("/responses", b"{}", 5, "key-1")
            await route.post("/responses", b"{}", 5)
        finally:
            await route.aclose()
    assert dict(server.requests[0][1])["idempotency-key"] == "key-1"
    assert "idempotency-key" not in dict(server.requests[1][1])


async def test_a_default_header_replaces_the_built_in_one_of_any_case() -> None:
    async with Capture() as server:
        pool = build_connections(
            base_url=f"http://127.0.0.1:{server.port}/v1",
            api_key_env=KEY_ENV,
            timeout_seconds=5,
            connect_timeout_seconds=5,
            default_headers={"user-agent": "sim-test/1", "AUTHORIZATION": "Token other"},
        )
        try:
            await post_json(pool, "/responses", {}, 5, 5)
        finally:
            await pool.aclose()
    headers = server.requests[0][1]
    assert ("user-agent", "sim-test/1") in headers
    assert [name for name, _ in headers].count("user-agent") == 1
    assert [value for name, value in headers if name == "authorization"] == ["Token other"]
    assert "openai-organization" not in dict(headers)  # OPENAI_ORG_ID unset: not sent


def test_the_target_never_shows_the_key() -> None:
    target = openai_target("https://api.example.invalid/v1", "sk-secret-123")
    assert ("Authorization", "Bearer sk-secret-123") in target.headers
    assert "sk-secret-123" not in repr(target) and "sk-secret-123" not in str(target)
    pool = build_connections(
        base_url="https://api.example.invalid/v1",
        api_key_env=KEY_ENV,
        timeout_seconds=5,
        connect_timeout_seconds=5,
    )
    assert "sk-test" not in repr(pool.routes[0]) and "sk-test" not in repr(vars(pool))


def test_the_certificate_helper_writes_pem_files(certificate: SelfSigned) -> None:
    assert Path(certificate.cert).read_text().startswith("-----BEGIN CERTIFICATE-----")


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 418, 422, 429, 500, 503])
def test_an_answer_is_read_as_the_sdk_reads_it(status: int) -> None:
    """The SDK's reading (``Error code: N - message``; the body's ``error`` object, or
    the text when the body is not JSON), without the SDK."""
    body = b'{"error": {"message": "nope", "code": "c1", "type": "t"}}'
    answer = read_answer(status, {"retry-after-ms": "1500", "retry-after": "9"}, body)
    assert answer.status == status
    assert answer.body == {"message": "nope", "code": "c1", "type": "t"}
    assert answer.message == f"Error code: {status} - nope"
    assert answer.retry_after == 1.5  # milliseconds preferred
    plain = read_answer(status, {"retry-after": "2"}, b" gateway down ")
    assert plain.body == "gateway down" and plain.message == f"Error code: {status}"
    assert plain.retry_after == 2.0
    flat = read_answer(status, {}, b'{"message": "flat", "code": "c2"}')
    assert flat.body == {"message": "flat", "code": "c2"} and flat.retry_after is None
    assert flat.message == f"Error code: {status} - flat"


@pytest.mark.parametrize("direct", [True, False])
async def test_the_adapters_default_headers_and_query_go_on_either_path(
    monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    """``default_headers``/``default_query`` given to an adapter reach the server on a
    route and on the SDK's stack alike, with the key."""
    async with Capture() as server:
        url = f"http://127.0.0.1:{server.port}/v1"
        defaults: Any = {
            "default_headers": {"X-Team": "red"},
            "default_query": {"api-version": "2024-10-21"},
        }
        adapter = (
            ChatAdapter(base_url=url, api_key_env=KEY_ENV, **defaults)
            if direct
            else ChatAdapter(sdk(url, **defaults))
        )
        assert (adapter.connections.routes[0] is not None) == direct
        try:
            with pytest.raises(LLMError):  # the capture answers {}: no choices
                await adapter.execute(ModelRequest("Write.", "x", Note, settings=SETTINGS))
        finally:
            await adapter.aclose()
    target, headers = server.requests[0]
    assert target == "/v1/chat/completions?api-version=2024-10-21"
    sent = dict(headers)
    assert sent["x-team"] == "red" and sent["authorization"] == "Bearer sk-test"


@pytest.mark.parametrize("fault", ["rate_limit", "auth", "bad_gateway"])
async def test_an_adapter_raises_the_same_error_on_either_path(
    stub_server: StubServer, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """Through a whole adapter call: the SDK's exceptions (its own stack, as for a client
    handed in) are caught and mapped like a route's, never passed on raw."""
    facts = []
    for direct in (True, False):
        adapter = (
            OpenAIAdapter(base_url=stub_server.base_url, api_key_env=KEY_ENV)
            if direct
            else OpenAIAdapter(sdk(stub_server.base_url), api_key_env=KEY_ENV)
        )
        assert (adapter.connections.routes[0] is not None) == direct
        stub_server.enqueue(fault)
        try:
            with pytest.raises(LLMError) as info:
                await adapter.execute(ModelRequest("Write.", "x", Note, settings=SETTINGS))
        finally:
            await adapter.aclose()
        assert isinstance(info.value.cause, HttpStatusError if direct else openai.APIError)
        facts.append(error_facts(info.value))
    assert facts[0] == facts[1]


async def test_a_redirect_is_an_error_never_followed() -> None:
    """A 307 to another server is not followed: the key is sent only where the user
    chose (a redirect-following client would re-send the POST, key and all)."""

    async def elsewhere(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(head(200, 2) + b"{}")
        return True

    other = RawServer(elsewhere)
    await other.start()

    async def redirect(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
        location = f"location: {other.base_url}/responses\r\n".encode()
        writer.write(head(307, 0, location))
        return True

    first = RawServer(redirect)
    await first.start()
    pool = pool_for(first.base_url)
    try:
        with pytest.raises(HttpStatusError) as info:
            await post_json(pool, "/responses", {}, 5, 5)
    finally:
        await pool.aclose()
        await first.close()
        await other.close()
    assert info.value.status == 307
    assert other.requests == []
    mapped = map_openai_error(info.value, api_key_env=KEY_ENV, model="m")
    assert isinstance(mapped, LLMAPIError) and "307" in mapped.message


def test_a_route_works_on_a_new_event_loop(stub_server: StubServer) -> None:
    """An adapter used by one ``asyncio.run`` and then another (its first loop gone)
    makes new connections on the new loop rather than failing on the old ones."""
    pool = pool_for(stub_server.base_url)
    assert b'"output"' in asyncio.run(post_json(pool, "/responses", BODY, 5, 5))

    async def again() -> bytes:
        try:
            return await post_json(pool, "/responses", BODY, 5, 5)
        finally:
            await pool.aclose()

    assert b'"output"' in asyncio.run(again())
    assert stub_server.stats.generations == 2
