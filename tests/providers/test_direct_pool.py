"""The direct path's own connection pool (``_direct_pool``), against real servers on
127.0.0.1: the stub server (plain and over TLS) and small asyncio servers that misbehave
on purpose. The adapters' error mapping through this pool is tested in
``test_fast_http.py`` (statuses, Retry-After, timeouts, refused connections)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import h11
import httpcore2
import httpx2
import orjson
import pytest

from bench.tls import SelfSigned, self_signed
from sim.providers._direct_pool import DirectConnection, DirectPool, RequestHead
from sim.providers._fast_http import SocketBackend, shared_ssl_context
from sim.testing.stub_server import ServerThread, StubOptions, StubServer

TIMEOUT = httpx2.Timeout(5.0)
BODY = orjson.dumps(
    {
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
)


def pool_for(url: str, max_connections: int = 4, keepalive: float | None = 5.0) -> DirectPool:
    parsed = httpx2.URL(url)
    tls = parsed.scheme == "https"
    return DirectPool(
        parsed.scheme,
        parsed.host,
        parsed.port or 80,
        backend=SocketBackend(),
        max_connections=max_connections,
        keepalive_expiry=keepalive,
        ssl_context=shared_ssl_context() if tls else None,
    )


async def post(
    pool: DirectPool, body: bytes = BODY, timeout: httpx2.Timeout = TIMEOUT
) -> tuple[int, bytes]:
    headers = [
        (b"Host", f"{pool.host}:{pool.port}".encode()),
        (b"Content-Type", b"application/json"),
    ]
    answer = await pool.request(b"POST", b"/v1/responses", headers, body, timeout)
    return answer.status, answer.body


async def until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


def closed_by_peer(connection: DirectConnection) -> Callable[[], bool]:
    return lambda: bool(connection.stream.get_extra_info("is_readable"))


# ----------------------------------------------------------------- servers that misbehave


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A loopback server running ``handler`` per connection; yields its URL and a list
    that gets one entry per accepted connection."""
    accepted: list[int] = []

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1", accepted
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return await reader.readexactly(length)


def answer(body: bytes = b"{}", extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        + extra
        + b"content-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


# ------------------------------------------------------------------------- reuse


async def test_keep_alive_connections_are_reused(stub_server: StubServer) -> None:
    pool = pool_for(stub_server.base_url)
    try:
        for _ in range(10):
            status, body = await post(pool)
            assert status == 200 and b'"output"' in body
        assert pool.connections == 1 and pool.idle == 1 and pool.in_use == 0
    finally:
        await pool.aclose()
    assert stub_server.stats.connections == 1
    assert stub_server.stats.generations == 10


async def test_concurrent_requests_never_open_more_than_max_connections() -> None:
    with ServerThread(StubServer(StubOptions(latency=0.05))) as server:
        pool = pool_for(server.base_url, max_connections=3)
        peak = 0

        async def one() -> int:
            nonlocal peak
            task = asyncio.ensure_future(post(pool))
            await asyncio.sleep(0)
            peak = max(peak, pool.connections)
            status, _ = await task
            return status

        try:
            statuses = await asyncio.gather(*(one() for _ in range(20)))
            assert statuses == [200] * 20
            assert pool.connections == 3 and pool.in_use == 0 and pool.waiting == 0
        finally:
            await pool.aclose()
        assert peak <= 3
        assert server.stats.connections == 3  # each opened once, then reused
        assert server.stats.generations == 20


async def test_a_connection_the_server_closed_is_not_reused() -> None:
    """The server answers and then hangs up without saying so: the pool sees the idle
    connection readable (the peer's FIN) and opens a new one instead of failing."""

    async def answer_then_hang_up(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(answer())
        await writer.drain()

    async with serving(answer_then_hang_up) as (url, accepted):
        pool = pool_for(url)
        try:
            for _ in range(4):
                assert (await post(pool))[0] == 200
                assert pool.idle == 1
                await until(closed_by_peer(pool._idle[0]))  # the server's FIN arrived
        finally:
            await pool.aclose()
        assert len(accepted) == 4


async def test_connection_close_from_the_server_closes_the_connection() -> None:
    async def answer_with_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(answer(extra=b"connection: close\r\n"))
            await writer.drain()

    async with serving(answer_with_close) as (url, accepted):
        pool = pool_for(url)
        try:
            for _ in range(3):
                assert (await post(pool))[0] == 200
                assert pool.connections == 0  # not kept: the server said close
        finally:
            await pool.aclose()
        assert len(accepted) == 3


async def test_an_expired_connection_is_not_reused(stub_server: StubServer) -> None:
    pool = pool_for(stub_server.base_url, keepalive=0.05)
    try:
        await post(pool)
        await asyncio.sleep(0.1)
        await post(pool)
        await post(pool)  # at once: still fresh
        assert pool.connections == 1
    finally:
        await pool.aclose()
    assert stub_server.stats.connections == 2


async def test_a_chunked_answer_is_read_whole() -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for part in (b'{"a":', b' "long', b' answer"}'):
                writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                await writer.drain()
                await asyncio.sleep(0.01)
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async with serving(chunked) as (url, accepted):
        pool = pool_for(url)
        try:
            assert await post(pool) == (200, b'{"a": "long answer"}')
            assert await post(pool) == (200, b'{"a": "long answer"}')
        finally:
            await pool.aclose()
        assert len(accepted) == 1


async def test_https_connections_are_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    certificate: SelfSigned = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate.cert))
    with ServerThread(StubServer(), ssl=certificate.server_context()) as server:
        pool = pool_for(server.base_url, max_connections=2)
        assert pool.port == httpx2.URL(server.base_url).port
        try:
            for _ in range(2):
                statuses = await asyncio.gather(*(post(pool) for _ in range(4)))
                assert [status for status, _ in statuses] == [200] * 4
        finally:
            await pool.aclose()
        assert server.stats.connections == 2
        assert server.stats.generations == 8


# ------------------------------------------------------------ waiting and timeouts


@pytest.fixture
def held() -> Iterator[StubServer]:
    """A stub server holding every generation request until ``release()``."""
    with ServerThread(StubServer()) as server:
        server.hold(lambda _request: True)
        try:
            yield server
        finally:
            server.release()


async def test_a_request_waits_past_the_pool_timeout_with_pool_timeout(held: StubServer) -> None:
    pool = pool_for(held.base_url, max_connections=1)
    try:
        first = asyncio.ensure_future(post(pool))
        await until(lambda: held.stats.held == 1)
        with pytest.raises(httpcore2.PoolTimeout):
            await post(pool, timeout=httpx2.Timeout(5.0, pool=0.1))
        assert pool.waiting == 0
        held.release()
        assert (await first)[0] == 200
        assert pool.in_use == 0 and pool.idle == 1
    finally:
        await pool.aclose()
    assert held.stats.connections == 1


async def test_a_waiting_request_gets_the_connection_a_request_finishes_with(
    held: StubServer,
) -> None:
    pool = pool_for(held.base_url, max_connections=1)
    try:
        first = asyncio.ensure_future(post(pool))
        await until(lambda: held.stats.held == 1)
        rest = [asyncio.ensure_future(post(pool)) for _ in range(3)]
        await until(lambda: pool.waiting == 3)
        held.release()
        assert [status for status, _ in await asyncio.gather(first, *rest)] == [200] * 4
        assert pool.in_use == 0 and pool.waiting == 0
    finally:
        await pool.aclose()
    assert held.stats.connections == 1


async def test_a_cancelled_request_does_not_leak_its_connection(held: StubServer) -> None:
    pool = pool_for(held.base_url, max_connections=1)
    try:
        task = asyncio.ensure_future(post(pool))
        await until(lambda: held.stats.held == 1)
        assert pool.in_use == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the connection was mid-exchange: closed, and its place is free again
        assert pool.connections == 0 and pool.in_use == 0
        held.release()
        assert (await post(pool))[0] == 200
        assert pool.connections == 1 and pool.in_use == 0
    finally:
        await pool.aclose()
    assert held.stats.connections == 2


async def test_a_cancelled_waiter_leaves_the_queue(held: StubServer) -> None:
    pool = pool_for(held.base_url, max_connections=1)
    try:
        first = asyncio.ensure_future(post(pool))
        await until(lambda: held.stats.held == 1)
        waiter = asyncio.ensure_future(post(pool))
        await until(lambda: pool.waiting == 1)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert pool.waiting == 0
        held.release()
        assert (await first)[0] == 200
        assert pool.in_use == 0 and pool.idle == 1
        assert (await post(pool))[0] == 200
    finally:
        await pool.aclose()
    assert held.stats.connections == 1


async def test_a_waiter_cancelled_just_as_it_is_handed_a_connection_passes_it_on(
    held: StubServer,
) -> None:
    """The connection was handed over (the waiter's future has it) but the waiting task is
    cancelled before it runs: the connection goes back to the pool, not lost."""
    pool = pool_for(held.base_url, max_connections=1)
    waiter: asyncio.Future[tuple[int, bytes]] | None = None

    async def first() -> int:
        status, _ = await post(pool)
        assert waiter is not None
        waiter.cancel()  # the handed-over connection is in its future; it has not run yet
        return status

    try:
        task = asyncio.ensure_future(first())
        await until(lambda: held.stats.held == 1)
        waiter = asyncio.ensure_future(post(pool))
        await until(lambda: pool.waiting == 1)
        held.release()
        assert await task == 200
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert pool.in_use == 0 and pool.idle == 1 and pool.connections == 1
        assert (await post(pool))[0] == 200
    finally:
        await pool.aclose()
    assert held.stats.connections == 1


async def test_a_read_past_its_timeout_closes_the_connection(stub_server: StubServer) -> None:
    pool = pool_for(stub_server.base_url, max_connections=1)
    stub_server.enqueue("hang")
    try:
        with pytest.raises(httpcore2.ReadTimeout):
            await post(pool, timeout=httpx2.Timeout(5.0, read=0.2))
        assert pool.connections == 0 and pool.in_use == 0
        assert (await post(pool))[0] == 200
    finally:
        await pool.aclose()


# --------------------------------------------------------------------- failures


async def test_a_refused_connection_frees_its_place() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # nothing listens on it
    pool = pool_for(f"http://127.0.0.1:{port}/v1", max_connections=1)
    try:
        for _ in range(2):  # the second does not wait for the first's place
            with pytest.raises(httpcore2.ConnectError):
                await post(pool, timeout=httpx2.Timeout(5.0, pool=0.1))
        assert pool.connections == 0 and pool.in_use == 0
    finally:
        await pool.aclose()


async def test_a_server_hanging_up_without_an_answer_is_a_protocol_error() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with serving(hang_up) as (url, _):
        pool = pool_for(url)
        try:
            with pytest.raises(httpcore2.RemoteProtocolError, match="disconnected"):
                await post(pool)
            assert pool.connections == 0 and pool.in_use == 0
        finally:
            await pool.aclose()


async def test_a_garbled_answer_is_a_protocol_error_and_closes_the_connection() -> None:
    async def garble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with serving(garble) as (url, _):
        pool = pool_for(url)
        try:
            with pytest.raises(httpcore2.RemoteProtocolError):
                await post(pool)
            assert pool.connections == 0 and pool.in_use == 0
        finally:
            await pool.aclose()


async def test_closing_the_pool_closes_its_connections_and_refuses_requests(
    stub_server: StubServer,
) -> None:
    pool = pool_for(stub_server.base_url, max_connections=1)
    await post(pool)
    assert pool.idle == 1
    stub_server.hold(lambda _request: True)
    busy = asyncio.ensure_future(post(pool))
    await until(lambda: stub_server.stats.held == 1)
    waiting = asyncio.ensure_future(post(pool))
    await until(lambda: pool.waiting == 1)
    await pool.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await waiting
    with pytest.raises(RuntimeError, match="closed"):
        await post(pool)
    assert pool.connections == 1  # the busy one finishes its request first
    stub_server.release()
    assert (await busy)[0] == 200
    assert pool.connections == 0 and pool.in_use == 0  # then it is closed, not kept


def test_the_pool_refuses_what_it_does_not_speak() -> None:
    backend = SocketBackend()
    with pytest.raises(ValueError, match="ftp"):
        DirectPool("ftp", "h", 21, backend=backend, max_connections=1)
    with pytest.raises(ValueError, match="ssl_context"):
        DirectPool("https", "h", 443, backend=backend, max_connections=1)
    with pytest.raises(ValueError, match="max_connections"):
        DirectPool("http", "h", 80, backend=backend, max_connections=0)


# ------------------------------------------------------------------ request heads

SHARED = [
    (b"Host", b"127.0.0.1:8000"),
    (b"Authorization", b"Bearer sk-test"),
    (b"Content-Type", b"application/json"),
    (b"X-Stainless-Lang", b"python"),
]


def test_a_request_head_is_what_h11_writes_for_the_whole_request() -> None:
    head = RequestHead(b"POST", b"/v1/responses?api-version=1", SHARED)
    extra = [(b"Idempotency-Key", b"abc")]
    event, written = head.request(1234, extra)
    whole = h11.Request(
        method=b"POST",
        target=b"/v1/responses?api-version=1",
        headers=[*SHARED, *extra, (b"Content-Length", b"1234")],
    )
    assert written == h11.Connection(h11.CLIENT).send(whole)
    # h11 is told the host, the request's own headers and its length
    assert list(event.headers.raw_items()) == [
        (b"Host", b"127.0.0.1:8000"),
        (b"Idempotency-Key", b"abc"),
        (b"Content-Length", b"1234"),
    ]


def test_a_request_head_tells_h11_the_headers_that_decide_keep_alive() -> None:
    head = RequestHead(b"POST", b"/v1/responses", [*SHARED, (b"Connection", b"close")])
    event, written = head.request(0, [])
    assert (b"connection", b"close") in list(event.headers)
    assert b"Connection: close\r\n" in written


async def test_connection_close_in_the_shared_headers_is_honoured(stub_server: StubServer) -> None:
    pool = pool_for(stub_server.base_url)
    host = f"{pool.host}:{pool.port}".encode()
    headers = [(b"Host", host), (b"Connection", b"close"), (b"Content-Type", b"application/json")]
    try:
        for _ in range(2):
            answer = await pool.request(b"POST", b"/v1/responses", headers, BODY, TIMEOUT)
            assert answer.status == 200
            assert pool.connections == 0  # h11 knew the request said close
    finally:
        await pool.aclose()
    assert stub_server.stats.connections == 2


@pytest.mark.parametrize(
    ("headers", "extra"),
    [
        (SHARED, [(b"Bad Name", b"x")]),
        (SHARED, [(b"X-Ok", b"line\nbreak")]),
        ([*SHARED, (b"Content-Length", b"5")], []),
        (SHARED[1:], []),  # no Host
    ],
)
async def test_an_invalid_request_head_is_refused_before_connecting(
    stub_server: StubServer,
    headers: list[tuple[bytes, bytes]],
    extra: list[tuple[bytes, bytes]],
) -> None:
    pool = pool_for(stub_server.base_url)
    try:
        with pytest.raises(httpcore2.LocalProtocolError):
            await pool.request(b"POST", b"/v1/responses", headers, b"{}", TIMEOUT, extra)
        assert pool.connections == 0
    finally:
        await pool.aclose()
    assert stub_server.stats.connections == 0
