"""The adapters' fast HTTP path (``_fast_http``): socket backend, own pool, direct POST.

Everything runs against real servers on 127.0.0.1 (the stub server, plain and with a
self-signed certificate) with the real openai SDK.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpcore2
import httpx2
import openai
import pytest
from pydantic import BaseModel, ConfigDict

import sim.llm.adapters._fast_http as fast_http
import sim.llm.adapters._openai_common as common
from bench.tls import SelfSigned, self_signed
from sim.llm.adapters._direct_pool import DirectPool
from sim.llm.adapters._fast_http import (
    DirectPost,
    PoolTransport,
    SocketBackend,
    SocketStream,
    TLSStream,
    direct_url,
    plain_tcp_transport,
)
from sim.llm.adapters._openai_common import ClientPool, build_pool, post_json
from sim.llm.adapters._openai_errors import map_openai_error, status_error
from sim.llm.adapters.chat import ChatAdapter
from sim.llm.adapters.openai import OpenAIAdapter
from sim.llm.errors import (
    LLMAPIError,
    LLMConfigurationError,
    LLMError,
    LLMRateLimitError,
    LLMTimeoutError,
)
from sim.llm.types import CallSettings, ModelRequest
from sim.testing.stub_server import ServerThread, StubOptions, StubServer

KEY_ENV = "SIM_FAST_HTTP_TEST_KEY"
SETTINGS = CallSettings(model="stub-model", timeout_seconds=5)
TIMEOUT = httpx2.Timeout(5.0)
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


def pool_for(url: str) -> ClientPool:
    return build_pool(
        base_url=url, api_key_env=KEY_ENV, timeout_seconds=5, connect_timeout_seconds=5
    )


def test_http_and_https_base_urls_get_the_direct_path() -> None:
    for url in ("http://127.0.0.1:9/v1", "https://api.example.invalid/v1"):
        pool = pool_for(url)
        direct = pool.direct[0]
        assert direct is not None, url
        assert isinstance(direct._pool, DirectPool)
        assert isinstance(direct._pool.backend, SocketBackend)
        assert direct._pool.scheme == url.split(":")[0]
        assert direct._pool.port == (9 if url.startswith("http:") else 443)


def test_a_proxy_from_the_environment_keeps_the_sdk_path(monkeypatch: pytest.MonkeyPatch) -> None:
    assert direct_url("http://10.1.2.3:8000/v1")
    assert direct_url("https://api.example.invalid/v1")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    assert not direct_url("http://10.1.2.3:8000/v1")
    assert direct_url("https://api.example.invalid/v1")  # an http proxy is not an https one
    assert pool_for("http://10.1.2.3:8000/v1").direct[0] is None
    monkeypatch.setenv("NO_PROXY", "10.1.2.3")
    assert direct_url("http://10.1.2.3:8000/v1")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert not direct_url("https://api.example.invalid/v1")
    assert not direct_url("ftp://example.invalid/v1")


def test_every_client_shares_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both paths verify with one context per process: loading the certificate store for
    each client (one per 16 connections) cost ~0.27 s of start-up at concurrency 200."""
    built: list[ssl.SSLContext] = []
    default = httpcore2.default_ssl_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        built.append(default(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(httpcore2, "default_ssl_context", counting)
    monkeypatch.setattr(fast_http, "_SSL_CONTEXTS", {})
    monkeypatch.setenv(KEY_ENV, "sk-test")
    url = "https://api.example.invalid/v1"
    direct = build_pool(
        base_url=url,
        api_key_env=KEY_ENV,
        timeout_seconds=5,
        connect_timeout_seconds=5,
        max_concurrency=64,
    )
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    proxied = build_pool(
        base_url=url,
        api_key_env=KEY_ENV,
        timeout_seconds=5,
        connect_timeout_seconds=5,
        max_concurrency=64,
    )
    assert len(direct.clients) == len(proxied.clients) == 4
    assert all(d is not None for d in direct.direct)
    assert all(d is None for d in proxied.direct)  # the SDK's stack, through the proxy
    assert len(built) == 1
    assert fast_http.shared_ssl_context() is built[0]


def test_the_host_header_brackets_ipv6() -> None:
    direct = pool_for("http://[::1]:8000/v1").direct[0]
    assert direct is not None
    assert (b"Host", b"[::1]:8000") in direct._headers


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


async def test_https_calls_go_direct_and_reuse_tls_connections(tls_stub: StubServer) -> None:
    pool = pool_for(tls_stub.base_url)
    assert pool.direct[0] is not None
    try:
        for _ in range(3):
            answers = await asyncio.gather(
                *(post_json(pool, "/responses", BODY, TIMEOUT) for _ in range(16))
            )
            assert all(b'"output"' in a for a in answers)
        assert tls_stub.stats.connections <= 16  # the direct path's pool, kept alive
        # what the SDK itself sends goes through its transport (on the same backend, TLS
        # included), which keeps an httpcore pool of its own
        response = await pool.first.responses.create(
            model="stub-model", input="x", instructions="Write.", text=BODY["text"]
        )
        assert response.output_text
    finally:
        await pool.aclose()
    assert tls_stub.stats.generations == 49
    assert tls_stub.stats.connections <= 17


async def test_an_untrusted_certificate_is_a_connection_error(
    certificate: SelfSigned, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with ServerThread(StubServer(), ssl=certificate.server_context()) as server:
        pool = pool_for(server.base_url)
        try:
            with pytest.raises(openai.APIConnectionError) as info:
                await post_json(pool, "/responses", BODY, TIMEOUT)
        finally:
            await pool.aclose()
    assert isinstance(info.value.__cause__, httpcore2.ConnectError)
    assert "CERTIFICATE_VERIFY_FAILED" in str(info.value.__cause__)


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
    assert adapter.pool.direct[0] is not None
    stub_server.enqueue(fault)
    try:
        with pytest.raises(error) as info:
            await adapter.execute(ModelRequest("Write.", "x", Note, settings=SETTINGS))
        assert isinstance(info.value.cause, openai.APIStatusError)
        if fault == "rate_limit":
            assert isinstance(info.value, LLMRateLimitError)
            assert isinstance(info.value.cause, openai.RateLimitError)
            assert info.value.retry_after == pytest.approx(stub_server.options.retry_after)
        answer = await adapter.execute(ModelRequest("Write.", "x", Note, settings=SETTINGS))
        assert isinstance(answer.parsed, Note)  # the connection is still usable
    finally:
        await adapter.aclose()


def error_facts(error: LLMError) -> tuple[Any, ...]:
    cause = error.cause
    assert isinstance(cause, openai.APIStatusError)
    return (
        type(error),
        error.message,
        error.code,
        error.retry_after,
        getattr(error, "status_code", None),
        getattr(error, "response_body", None),
        type(cause),
        str(cause),
        cause.body,
        cause.status_code,
        cause.response.headers.get("retry-after"),
    )


@pytest.mark.parametrize(
    "fault", ["rate_limit", "insufficient_quota", "auth", "context_length", "server_error"]
)
async def test_a_status_maps_the_same_on_the_direct_path_and_the_sdk_path(
    tls_stub: StubServer, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """A 429 with Retry-After (and the other statuses) on the direct path, over http and
    https, becomes the same error as through the SDK's own stack: same SDK exception,
    same sim error, same retry_after."""
    facts: dict[str, tuple[Any, ...]] = {}
    with ServerThread(StubServer(StubOptions(retry_after=2.5))) as plain:
        for label, url, direct in (
            ("http direct", plain.base_url, True),
            ("https direct", tls_stub.base_url, True),
            ("http sdk", plain.base_url, False),
            ("https sdk", tls_stub.base_url, False),
        ):
            monkeypatch.setattr(common, "PLAIN_TCP_BACKEND", direct)
            pool = pool_for(url)
            assert (pool.direct[0] is not None) == direct, label
            server = tls_stub if url.startswith("https") else plain
            server.enqueue(fault)
            try:
                with pytest.raises(openai.APIStatusError) as info:
                    await post_json(pool, "/responses", BODY, TIMEOUT)
            finally:
                await pool.aclose()
            mapped = map_openai_error(info.value, api_key_env=KEY_ENV, model="stub-model")
            facts[label] = error_facts(mapped)
    first = facts["http sdk"]
    assert all(value == first for value in facts.values()), facts
    if fault == "rate_limit":
        assert first[0] is LLMRateLimitError and first[3] == pytest.approx(2.5)


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
    ``{}`` (what the SDK and the direct path send, compared byte for byte)."""

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


async def test_the_direct_path_sends_the_clients_default_headers_and_query() -> None:
    async with Capture() as server:
        url = f"http://127.0.0.1:{server.port}/v1"
        transport, pool = plain_tcp_transport(httpx2.Limits(max_connections=2), url)
        client = openai.AsyncOpenAI(
            api_key="sk-test",
            base_url=url,
            max_retries=0,
            default_headers={"X-Team": "red", "api-key": "azure-style"},
            default_query={"api-version": "2024-10-21"},
            http_client=openai.DefaultAsyncHttpxClient(transport=transport),
        )
        try:
            await DirectPost(client, pool).post("/responses", b"{}", TIMEOUT, "key-1")
            await client.post(
                "/responses",
                cast_to=bytes,
                content=b"{}",
                options={"headers": {"Idempotency-Key": "key-1"}},
            )
        finally:
            await client.close()
    (direct_target, direct_headers), (sdk_target, sdk_headers) = server.requests
    assert direct_target == sdk_target == "/v1/responses?api-version=2024-10-21"
    direct = dict(direct_headers)
    assert direct["x-team"] == "red" and direct["api-key"] == "azure-style"
    assert direct["authorization"] == "Bearer sk-test"
    assert direct["idempotency-key"] == "key-1"
    # everything the SDK sends, the direct path sends too, but the SDK's per-try
    # bookkeeping and httpx's transport defaults (HTTP/1.1 keeps alive without saying)
    skipped = {
        "x-stainless-retry-count",
        "x-stainless-read-timeout",
        "accept-encoding",
        "connection",
    }
    sdk = {name: value for name, value in sdk_headers if name not in skipped}
    assert {name: direct.get(name) for name in sdk} == sdk


async def test_an_omitted_default_header_is_not_sent() -> None:
    async with Capture() as server:
        url = f"http://127.0.0.1:{server.port}/v1"
        transport, pool = plain_tcp_transport(httpx2.Limits(max_connections=1), url)
        client = openai.AsyncOpenAI(
            api_key="sk-test",
            base_url=url,
            default_headers={"User-Agent": "sim-test/1"},
            http_client=openai.DefaultAsyncHttpxClient(transport=transport),
        )
        try:
            await DirectPost(client, pool).post("/responses", b"{}", TIMEOUT)
        finally:
            await client.close()
    headers = server.requests[0][1]
    assert ("user-agent", "sim-test/1") in headers
    assert [name for name, _ in headers].count("user-agent") == 1
    assert "openai-organization" not in dict(headers)  # an Omit() in the SDK's defaults


async def test_the_pool_transport_maps_transport_errors_to_httpx_ones() -> None:
    transport, _ = plain_tcp_transport(httpx2.Limits(max_connections=1), "http://127.0.0.1:9")
    async with httpx2.AsyncClient(transport=transport) as client:
        with pytest.raises(httpx2.ConnectError):
            await client.get("http://127.0.0.1:9/")
    assert isinstance(transport, PoolTransport)


async def test_stream_reads_writes_and_reports_a_closed_peer() -> None:
    received: list[bytes] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.readexactly(200_000)
        received.append(data)
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        stream = await SocketBackend().connect_tcp("127.0.0.1", port, timeout=5)
        assert isinstance(stream, SocketStream)
        assert stream.get_extra_info("ssl_object") is None
        assert stream.get_extra_info("server_addr")[1] == port
        assert stream.get_extra_info("is_readable") is False
        await stream.write(b"x" * 200_000, timeout=5)  # more than one send() takes
        assert await stream.read(10, timeout=5) == b"ok"
        for _ in range(500):  # the peer's FIN may trail its last bytes
            if stream.get_extra_info("is_readable"):
                break
            await asyncio.sleep(0.01)
        assert stream.get_extra_info("is_readable") is True  # closed: not to be reused
        assert await stream.read(10, timeout=5) == b""  # the peer closed
        await stream.aclose()
        assert stream.get_extra_info("is_readable") is True
        with pytest.raises(httpcore2.ConnectError):
            await SocketBackend().connect_tcp("127.0.0.1", 9, timeout=5)
    finally:
        server.close()
        await server.wait_closed()
    assert received == [b"x" * 200_000]


async def test_small_writes_leave_together_with_the_next_read() -> None:
    """A request's head and body go out in one send, when the client starts reading."""
    chunks: list[bytes] = []
    early: list[bool] = []
    first_read_over = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.wait_for(reader.read(100), 0.2)
            early.append(True)
        except TimeoutError:
            early.append(False)
        first_read_over.set()
        chunks.append(await reader.read(100))
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        stream = await SocketBackend().connect_tcp("127.0.0.1", port, timeout=5)
        await stream.write(b"head;", timeout=5)
        await stream.write(b"body", timeout=5)
        # the client reads only once the server's first read is over (timed out: nothing
        # was sent), however late a loaded machine runs the server's side
        await asyncio.wait_for(first_read_over.wait(), 10)
        assert await stream.read(10, timeout=5) == b"ok"
        await stream.aclose()
    finally:
        server.close()
    assert early == [False]
    assert chunks == [b"head;body"]


async def test_tls_stream_reads_writes_and_reports_a_closed_peer(certificate: SelfSigned) -> None:
    received: list[bytes] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.readexactly(200_000))
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=certificate.server_context())
    port = server.sockets[0].getsockname()[1]
    try:
        raw = await SocketBackend().connect_tcp("127.0.0.1", port, timeout=5)
        stream = await raw.start_tls(certificate.client_context(), "127.0.0.1", timeout=5)
        assert isinstance(stream, TLSStream)
        assert isinstance(stream.get_extra_info("ssl_object"), ssl.SSLObject)
        assert stream.get_extra_info("server_addr")[1] == port
        await stream.write(b"y" * 200_000, timeout=5)  # many TLS records
        assert await stream.read(10, timeout=5) == b"ok"
        assert await stream.read(10, timeout=5) == b""
        await stream.aclose()
        # the wrong name for the certificate is refused during the handshake
        raw = await SocketBackend().connect_tcp("127.0.0.1", port, timeout=5)
        with pytest.raises(httpcore2.ConnectError):
            await raw.start_tls(certificate.client_context(), "wrong.invalid", timeout=5)
    finally:
        server.close()
    assert received == [b"y" * 200_000]


async def test_a_peer_hanging_up_mid_handshake_is_a_connect_error(
    certificate: SelfSigned,
) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # the ClientHello arrived
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        raw = await SocketBackend().connect_tcp("127.0.0.1", port, timeout=5)
        with pytest.raises(httpcore2.ConnectError):
            await raw.start_tls(certificate.client_context(), "127.0.0.1", timeout=5)
    finally:
        server.close()


async def test_a_read_that_waits_past_its_timeout_raises_read_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        stream = await SocketBackend().connect_tcp("127.0.0.1", port, timeout=5)
        with pytest.raises(httpcore2.ReadTimeout):
            await stream.read(10, timeout=0.05)
        await stream.aclose()
    finally:
        server.close()
        await server.wait_closed()


def test_the_certificate_helper_writes_pem_files(certificate: SelfSigned) -> None:
    assert Path(certificate.cert).read_text().startswith("-----BEGIN CERTIFICATE-----")


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, openai.BadRequestError),
        (401, openai.AuthenticationError),
        (403, openai.PermissionDeniedError),
        (404, openai.NotFoundError),
        (409, openai.ConflictError),
        (418, openai.APIStatusError),
        (422, openai.UnprocessableEntityError),
        (429, openai.RateLimitError),
        (500, openai.InternalServerError),
        (503, openai.InternalServerError),
    ],
)
def test_status_error_uses_the_sdks_documented_classes(
    status: int, kind: type[openai.APIStatusError]
) -> None:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/responses")
    body = b'{"error": {"message": "nope", "code": "c1", "type": "t"}}'
    error = status_error(httpx2.Response(status, content=body, request=request))
    assert type(error) is kind
    assert error.status_code == status and error.code == "c1"
    assert error.body == {"message": "nope", "code": "c1", "type": "t"}
    assert str(error) == f"Error code: {status} - nope"
    plain = status_error(httpx2.Response(status, content=b" gateway down ", request=request))
    assert plain.body == "gateway down" and str(plain) == f"Error code: {status}"
