"""The plain-TCP backend that adapters built for an ``http://`` base URL use."""

from __future__ import annotations

import asyncio

import httpcore2
import openai
import pytest
from pydantic import BaseModel, ConfigDict

from sim.llm.adapters._fast_http import SocketBackend, SocketStream
from sim.llm.adapters._openai_common import plain_http_url
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
from sim.testing.stub_server import StubServer

KEY_ENV = "SIM_FAST_HTTP_TEST_KEY"
SETTINGS = CallSettings(model="stub-model", timeout_seconds=5)


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid", title="Note")

    text: str
    count: int


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test")


def backend_of(adapter: OpenAIAdapter | ChatAdapter) -> object:
    transport = adapter.client._client._transport  # type: ignore[attr-defined]
    return transport._pool._network_backend


def test_http_base_urls_get_the_plain_tcp_backend_https_keeps_the_default() -> None:
    local = OpenAIAdapter(base_url="http://127.0.0.1:9/v1", api_key_env=KEY_ENV)
    remote = OpenAIAdapter(base_url="https://api.example.invalid/v1", api_key_env=KEY_ENV)
    assert isinstance(backend_of(local), SocketBackend)
    assert not isinstance(backend_of(remote), SocketBackend)
    assert local.pool.direct[0] is not None  # posts straight to the pool
    assert remote.pool.direct[0] is None  # posts through the SDK


def test_a_proxy_from_the_environment_keeps_the_sdk_path(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert plain_http_url("http://10.1.2.3:8000/v1")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    assert not plain_http_url("http://10.1.2.3:8000/v1")
    monkeypatch.setenv("NO_PROXY", "10.1.2.3")
    assert plain_http_url("http://10.1.2.3:8000/v1")
    assert not plain_http_url("https://api.example.invalid/v1")


def test_the_host_header_brackets_ipv6() -> None:
    adapter = OpenAIAdapter(base_url="http://[::1]:8000/v1", api_key_env=KEY_ENV)
    direct = adapter.pool.direct[0]
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
    stub_server.enqueue(fault)
    try:
        with pytest.raises(error) as info:
            await adapter.execute(ModelRequest("Write.", "x", Note, settings=SETTINGS))
        assert isinstance(info.value.cause, openai.APIStatusError)  # made by the SDK
        if fault == "rate_limit":
            assert isinstance(info.value, LLMRateLimitError)
            assert info.value.retry_after == pytest.approx(stub_server.options.retry_after)
        answer = await adapter.execute(ModelRequest("Write.", "x", Note, settings=SETTINGS))
        assert isinstance(answer.parsed, Note)  # the connection is still usable
    finally:
        await adapter.aclose()


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
        await stream.write(b"x" * 200_000, timeout=5)  # more than one send() takes
        assert await stream.read(10, timeout=5) == b"ok"
        assert await stream.read(10, timeout=5) == b""  # the peer closed
        await stream.aclose()
        with pytest.raises(httpcore2.ConnectError):
            await SocketBackend().connect_tcp("127.0.0.1", 9, timeout=5)
    finally:
        server.close()
        await server.wait_closed()
    assert received == [b"x" * 200_000]


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
