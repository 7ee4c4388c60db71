"""The HTTP routes (``http.Route``, aiohttp) against a misbehaving server on loopback
(``sim.testing.raw_http``): each case a red team found in the hand-written pool it
replaced.

- a stale keep-alive connection is retried once on a fresh one, without the breaker;
- ``timeout_seconds`` is a total deadline, for the headers and the body alike;
- gzip and deflate are decoded even when not asked for;
- oversize headers and bad framing are named, never "cannot connect";
- a stream cut short is a transient failure, retried with the same idempotency key.

(TLS verification, ``SSL_CERT_FILE`` and proxies are in ``test_http.py``.)
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import struct
import time
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, ConfigDict

from sim.cli import main
from sim.llm.calls import CallIdentity
from sim.llm.errors import LLMAPIError, LLMTimeoutError
from sim.llm.recovery import RecoveryAdapter, RetryPolicy
from sim.llm.types import CallSettings, ModelRequest
from sim.providers.chat import ChatAdapter
from sim.providers.http import Route
from sim.providers.openai import OpenAIAdapter
from sim.testing.raw_http import RawRequest, RawServer, RawServerThread, Reply, head
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

KEY_ENV = "SIM_TEST_HTTP_FAULTS_KEY"
KINDS = [OpenAIAdapter, ChatAdapter]
Adapter = OpenAIAdapter | ChatAdapter


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


def request(timeout: float = 5.0, **settings: Any) -> ModelRequest:
    return ModelRequest(
        "Write a note.",
        "about fog",
        Note,
        settings=CallSettings(model="stub-model", timeout_seconds=timeout, **settings),
    )


@asynccontextmanager
async def serving(reply: Reply, kind: type[Adapter]) -> AsyncIterator[tuple[RawServer, Adapter]]:
    server = RawServer(reply)
    await server.start()
    adapter = kind(base_url=server.base_url, api_key_env=KEY_ENV, max_concurrency=4)
    try:
        yield server, adapter
    finally:
        await adapter.aclose()
        await server.close()


async def answer(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
    """A well-formed answer (the stub model's)."""
    body = await request.answer()
    writer.write(head(200, len(body)) + body)
    return True


# -- stale keep-alive connections -----------------------------------------------------------


async def close_reused(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
    """Answers the first request of each connection; a later one on the same connection
    finds it closed as it arrives (the server's keep-alive ran out just then)."""
    if request.on_connection > 1:
        return False  # closed without an answer
    return await answer(request, writer)


async def reset_reused(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
    """As ``close_reused``, but the connection is reset (RST), not closed."""
    if request.on_connection > 1:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        return False
    return await answer(request, writer)


@pytest.mark.parametrize("reply", [close_reused, reset_reused], ids=["closed", "reset"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_stale_keep_alive_connection_is_retried_once_on_a_fresh_one(
    kind: type[Adapter], reply: Reply
) -> None:
    async with serving(reply, kind) as (server, adapter):
        for _ in range(4):  # one after another: each after the first reuses a connection
            response = await adapter.execute(request())
            assert isinstance(response.parsed, Note)
        route = adapter.connections.routes[0]
        assert isinstance(route, Route)
    # calls 2 and 4 met the connection the call before had used, closed as they arrived,
    # and went again on a connection of their own; call 3 found no idle one and opened one
    assert route.stale_retries == 2
    assert [(r.connection, r.on_connection) for r in server.requests] == [
        (1, 1),
        (1, 2),
        (2, 1),
        (3, 1),
        (3, 2),
        (4, 1),
    ]


async def test_a_failure_on_the_fresh_connection_is_the_calls() -> None:
    """Retried once, not forever: a server that drops every request fails the call."""

    async def drop(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
        return False

    async with serving(drop, ChatAdapter) as (server, adapter):
        with pytest.raises(LLMAPIError) as info:
            await adapter.execute(request())
    assert info.value.code == "connection_error"
    assert len(server.requests) == 2  # the request, and its one retry


def test_a_tick_with_stale_connections_commits_with_no_failed_attempt(demo_world: Path) -> None:
    """The red team's case: a server closing each reused connection as the next request
    arrives used to fail calls together, open the breaker and abort the tick. Now every
    call succeeds at its first attempt (the retry is the transport's, not recovery's)."""
    with RawServerThread(RawServer(close_reused)) as server:
        args = ["tick", "--world", str(demo_world), "--provider", "chat"]
        args += ["--base-url", server.base_url]
        done = CliRunner().invoke(main, args, env={"OPENAI_API_KEY": "sk-test"})
        assert done.exit_code == 0, done.output
        reused = [r for r in server.requests if r.on_connection > 1]
    log = read_log(log_path(demo_world, 1))
    assert log.committed
    assert reused, "no connection was reused: the case was not exercised"
    records = log.call_records
    assert records and all(len(c.attempts) == 1 for c in records)
    assert not any(a.error_code for c in records for a in c.attempts)


# -- the total deadline ---------------------------------------------------------------------


async def drip(data: bytes, writer: asyncio.StreamWriter, every: float = 0.25) -> None:
    for byte in data:
        writer.write(bytes([byte]))
        await writer.drain()
        await asyncio.sleep(every)


async def drip_head(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
    body = await request.answer()
    await drip(head(200, len(body)) + body, writer)
    return True


async def drip_body(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
    body = await request.answer()
    writer.write(head(200, len(body)))
    await drip(body, writer)
    return True


@pytest.mark.parametrize("reply", [drip_head, drip_body], ids=["headers", "body"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_server_dripping_bytes_fails_at_the_deadline(
    kind: type[Adapter], reply: Reply
) -> None:
    """One byte every 0.25 s never leaves a read idle for long, yet the call ends at its
    ``timeout_seconds`` (it used to run on for as long as the server kept dripping)."""
    async with serving(reply, kind) as (_, adapter):
        started = time.perf_counter()
        with pytest.raises(LLMTimeoutError):
            await adapter.execute(request(timeout=1.0))
        took = time.perf_counter() - started
    assert 0.9 <= took < 2.5, took


# -- content encodings ----------------------------------------------------------------------


def encoded(encoding: str, compress: Callable[[bytes], bytes]) -> Reply:
    async def reply(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
        body = compress(await request.answer())
        extra = f"content-encoding: {encoding}\r\n".encode()
        writer.write(head(200, len(body), extra) + body)
        return True

    return reply


@pytest.mark.parametrize(
    ("encoding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)]
)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_compressed_answer_is_decoded(
    kind: type[Adapter], encoding: str, compress: Callable[[bytes], bytes]
) -> None:
    async with serving(encoded(encoding, compress), kind) as (_, adapter):
        response = await adapter.execute(request())
    assert isinstance(response.parsed, Note)


# -- broken answers are named ---------------------------------------------------------------


async def huge_header(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
    body = await request.answer()
    writer.write(head(200, len(body), b"x-padding: " + b"a" * 200_000 + b"\r\n") + body)
    return True


async def length_too_long(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
    body = await request.answer()
    writer.write(head(200, len(body) + 100) + body)
    return False  # and the connection ends short of what was announced


async def length_too_short(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
    body = await request.answer()
    writer.write(head(200, len(body) - 5) + body)
    return True


@pytest.mark.parametrize(
    ("reply", "named"),
    [
        (huge_header, "a header is over the size limit"),
        (length_too_long, "the body ended before its Content-Length"),
        (length_too_short, "more than its Content-Length announced"),
    ],
    ids=["header-200KB", "content-length-too-long", "content-length-too-short"],
)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_broken_answer_is_named_not_a_connection_failure(
    kind: type[Adapter], reply: Reply, named: str
) -> None:
    """A ``bad_response`` (retried, and not a sign the endpoint is down), whose message
    says what was wrong with the answer."""
    async with serving(reply, kind) as (_, adapter):
        with pytest.raises(LLMAPIError) as info:
            await adapter.execute(request())
    error = info.value
    assert error.code == "bad_response"
    assert "not valid HTTP" in error.message and named in error.message, error.message
    assert "cannot connect" not in error.message


# -- streams cut short ----------------------------------------------------------------------


def streaming(cut: Callable[[bytes], bytes] | None, framing: str) -> Reply:
    """Streams the answer (``cut`` keeps part of it on the first request only), framed by
    the connection's end (``close``) or in chunks (``chunked``: a cut stops mid-chunk)."""
    calls = 0

    async def reply(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
        nonlocal calls
        calls += 1
        stream = await request.stream()
        cutting = cut is not None and calls == 1
        sent = cut(stream) if cut is not None and cutting else stream
        extra = b"content-type: text/event-stream\r\n"
        if framing == "close":
            writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n" + extra + b"\r\n" + sent)
            return False
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n" + extra + b"\r\n")
        if cutting:
            writer.write(b"%x\r\n" % len(stream) + sent)  # announced whole, sent in part
            return False
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(sent), sent))
        return True

    return reply


def half(stream: bytes) -> bytes:
    return stream[: len(stream) // 2]


def whole_events_but_the_last(stream: bytes) -> bytes:
    """The events before the one that ends the answer (a chat chunk with a
    ``finish_reason``, ``response.completed``): a clean end at an event boundary."""
    kept = []
    for event in stream.split(b"\n\n"):
        if b'"finish_reason":"' in event or b"response.completed" in event:
            break
        kept.append(event)
    assert len(kept) > 2
    return b"\n\n".join(kept) + b"\n\n"


async def no_sleep(_: float) -> None:
    return None


@pytest.mark.parametrize("cut", [half, whole_events_but_the_last], ids=["mid-event", "at-event"])
@pytest.mark.parametrize("framing", ["close", "chunked"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_stream_cut_short_is_transient_and_retried_with_its_key(
    kind: type[Adapter], framing: str, cut: Callable[[bytes], bytes]
) -> None:
    """Not ``incomplete (stream_ended)``, a content failure never retried: a
    ``stream_cut``, which recovery retries, asking with the same idempotency key (the
    client never saw the answer, which the provider may have finished)."""
    async with serving(streaming(cut, framing), kind) as (_, adapter):
        with pytest.raises(LLMAPIError) as info:
            await adapter.execute(request(stream=True))
    assert info.value.code == "stream_cut"
    assert "cut short" in info.value.message
    async with serving(streaming(cut, framing), kind) as (server, adapter):
        recovered = RecoveryAdapter(adapter, RetryPolicy(), sleep=no_sleep)
        call = CallIdentity("1:intentions:bo:0", "intentions", "bo", 0, "i", "x", "Note", "d")
        response = await recovered.execute(replace(request(stream=True), call=call))
    assert isinstance(response.parsed, Note)
    assert [a.error_code for a in response.attempts] == ["stream_cut", None]
    keys = [r.headers.get("idempotency-key") for r in server.requests]
    assert len(keys) == 2 and keys[0] is not None and keys[0] == keys[1]
