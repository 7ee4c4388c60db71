"""A route's connections (``http.Route`` on aiohttp's pool), against real servers on
127.0.0.1: reuse, the size bound, connections the server ends, waiting within the
deadline, cancellation. Seen from the servers' side (connections accepted, requests
served), not from the client's internals."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.tls import SelfSigned, self_signed
from sim.providers.http import (
    HttpConnectionError,
    HttpProtocolError,
    HttpTimeoutError,
    Route,
    Target,
)
from sim.testing.raw_http import RawRequest, RawServer, head
from sim.testing.stub_server import ServerThread, StubOptions, StubServer

BODY = b'{"model": "stub-model", "input": "x", "instructions": "Write."}'


def route_to(url: str, size: int = 4) -> Route:
    return Route(Target(url, headers=(("Authorization", "Bearer sk-test"),)), size, 5)


async def until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("ALL_PROXY", raising=False)


async def test_keep_alive_connections_are_reused(stub_server: StubServer) -> None:
    route = route_to(stub_server.base_url)
    try:
        for _ in range(10):
            assert b'"output"' in await route.post("/responses", BODY, 5)
    finally:
        await route.aclose()
    assert stub_server.stats.connections == 1
    assert stub_server.stats.generations == 10


async def test_concurrent_requests_never_open_more_than_the_route_size() -> None:
    with ServerThread(StubServer(StubOptions(latency=0.05))) as server:
        route = route_to(server.base_url, size=3)
        try:
            answers = await asyncio.gather(*(route.post("/responses", BODY, 10) for _ in range(20)))
        finally:
            await route.aclose()
        assert all(b'"output"' in a for a in answers)
        assert server.peak_active <= 3
        assert server.stats.connections == 3  # each opened once, then reused
        assert server.stats.generations == 20


async def answer(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
    writer.write(head(200, 2) + b"{}")
    return True


async def test_a_connection_the_server_closed_is_not_reused() -> None:
    """The server answers and hangs up without saying so: the next request opens a new
    connection rather than failing (or needing the stale-connection retry)."""

    async def answer_then_hang_up(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(head(200, 2) + b"{}")
        return False

    server = RawServer(answer_then_hang_up)
    await server.start()
    route = route_to(server.base_url)
    try:
        for _ in range(4):
            assert await route.post("/responses", BODY, 5) == b"{}"
            await asyncio.sleep(0.05)  # the server's FIN arrives
    finally:
        await route.aclose()
        await server.close()
    assert server.connections == 4 and route.stale_retries == 0


async def test_connection_close_from_the_server_closes_the_connection() -> None:
    async def answer_with_close(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(head(200, 2, b"connection: close\r\n") + b"{}")
        return True  # the server would go on; the client must not

    server = RawServer(answer_with_close)
    await server.start()
    route = route_to(server.base_url)
    try:
        for _ in range(3):
            assert await route.post("/responses", BODY, 5) == b"{}"
    finally:
        await route.aclose()
        await server.close()
    assert server.connections == 3
    assert [r.on_connection for r in server.requests] == [1, 1, 1]


async def test_a_chunked_answer_is_read_whole() -> None:
    async def chunked(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for part in (b'{"a":', b' "long', b' answer"}'):
            writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        return True

    server = RawServer(chunked)
    await server.start()
    route = route_to(server.base_url)
    try:
        for _ in range(2):
            assert await route.post("/responses", BODY, 5) == b'{"a": "long answer"}'
    finally:
        await route.aclose()
        await server.close()
    assert server.connections == 1


async def test_https_connections_are_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    certificate: SelfSigned = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate.cert))
    with ServerThread(StubServer(), ssl=certificate.server_context()) as server:
        route = route_to(server.base_url, size=2)
        try:
            for _ in range(2):
                answers = await asyncio.gather(
                    *(route.post("/responses", BODY, 10) for _ in range(4))
                )
                assert all(b'"output"' in a for a in answers)
        finally:
            await route.aclose()
        assert server.stats.connections == 2
        assert server.stats.generations == 8


@pytest.fixture
def held() -> Iterator[StubServer]:
    """A stub server holding every generation request until ``release()``."""
    with ServerThread(StubServer()) as server:
        server.hold(lambda _request: True)
        try:
            yield server
        finally:
            server.release()


async def test_waiting_for_a_connection_counts_against_the_deadline(held: StubServer) -> None:
    route = route_to(held.base_url, size=1)
    try:
        first = asyncio.ensure_future(route.post("/responses", BODY, 10))
        await until(lambda: held.stats.held == 1)
        started = time.perf_counter()
        with pytest.raises(HttpTimeoutError):
            await route.post("/responses", BODY, 0.3)
        assert time.perf_counter() - started < 2.0
        held.release()
        assert b'"output"' in await first
    finally:
        await route.aclose()
    assert held.stats.connections == 1


async def test_a_cancelled_request_does_not_keep_its_place(held: StubServer) -> None:
    route = route_to(held.base_url, size=1)
    try:
        task = asyncio.ensure_future(route.post("/responses", BODY, 10))
        await until(lambda: held.stats.held == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        held.release()
        assert b'"output"' in await route.post("/responses", BODY, 5)  # the place is free
    finally:
        await route.aclose()
    assert held.stats.connections == 2  # the cancelled one was mid-exchange: not reused


async def test_a_server_hanging_up_without_an_answer_is_a_connection_error() -> None:
    async def hang_up(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
        return False

    server = RawServer(hang_up)
    await server.start()
    route = route_to(server.base_url)
    try:
        with pytest.raises(HttpConnectionError, match="Server disconnected"):
            await route.post("/responses", BODY, 5)
    finally:
        await route.aclose()
        await server.close()


async def test_a_garbled_answer_is_a_protocol_error() -> None:
    async def garbled(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 two hundred\r\n\r\n")
        return True

    server = RawServer(garbled)
    await server.start()
    route = route_to(server.base_url)
    try:
        with pytest.raises(HttpProtocolError):
            await route.post("/responses", BODY, 5)
    finally:
        await route.aclose()
        await server.close()


async def test_a_refused_connection_is_a_connection_error_and_names_the_host() -> None:
    route = route_to("http://127.0.0.1:9/v1")
    try:
        with pytest.raises(HttpConnectionError) as info:
            await route.post("/responses", BODY, 5)
    finally:
        await route.aclose()
    assert "127.0.0.1:9" in str(info.value)


def test_a_route_refuses_what_it_does_not_speak() -> None:
    with pytest.raises(ValueError):
        route_to("http://127.0.0.1:9/v1", size=0)
    with pytest.raises(Exception, match="only http:// and https://"):
        route_to("ftp://127.0.0.1/v1")
