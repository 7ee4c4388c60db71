"""A loopback HTTP/1.1 server whose answers are written byte by byte by the test: for
testing an HTTP client against a misbehaving server.

Each request is read (head and ``Content-Length`` body) and handed to ``reply``, which
writes whatever it likes on the connection, well-formed or not, and says whether the
connection stays open for another request. ``StubServer.generate`` gives the answer to a
generation request, and ``sse`` frames it as a stream, so a faulty reply can still carry a
valid answer for the engine::

    async def gzipped(request: RawRequest, writer: asyncio.StreamWriter) -> bool:
        body = gzip.compress(await request.answer())
        writer.write(head(200, len(body), b"content-encoding: gzip\\r\\n") + body)
        return True

    with RawServerThread(RawServer(gzipped)) as server:
        ...  # server.base_url

Test helper only: nothing in ``sim`` uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as ssl_module
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import orjson

from sim.testing.stub_model import chat_chunks, responses_events
from sim.testing.stub_server import (
    StubServer,
    client_connection,
    close_server,
    read_request,
    sse_frames,
)

__all__ = ["RawRequest", "RawServer", "RawServerThread", "Reply", "head", "sse"]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}


@dataclass
class RawRequest:
    """One request as received.

    Attributes:
        connection: the number of its connection (1 for the first the server accepted).
        on_connection: its number on that connection (1: the connection's first).
        target: the request target as sent (a path, or a whole URL through a proxy).
    """

    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    connection: int
    on_connection: int
    model: StubServer = field(repr=False)

    @property
    def path(self) -> str:
        """The path without query (also for a proxy's absolute-form target)."""
        target = self.target
        if "://" in target:
            target = "/" + target.split("://", 1)[1].partition("/")[2]
        return target.split("?", 1)[0]

    def json(self) -> Any:
        return orjson.loads(self.body) if self.body else {}

    async def answer(self) -> bytes:
        """The stub model's answer to this generation request, as a JSON body."""
        status, body = await self.model.generate(self.path, self.json())
        if status != 200:
            raise RuntimeError(f"the stub model answered {status}: {body}")
        return orjson.dumps(body)

    async def stream(self) -> bytes:
        """The stub model's answer as the whole server-sent event stream (``sse``)."""
        request = self.json()
        status, body = await self.model.generate(self.path, request)
        if status != 200:
            raise RuntimeError(f"the stub model answered {status}: {body}")
        return sse(self.path, request, body)


#: writes the answer to one request; returns whether the connection stays open
Reply = Callable[[RawRequest, asyncio.StreamWriter], Awaitable[bool]]


def head(status: int, length: int | None, extra: bytes = b"") -> bytes:
    """A response head: status line, JSON content type, ``Content-Length`` (unless
    ``None``), ``extra`` header lines (each ending in CRLF)."""
    lines = f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
    lines += "content-type: application/json\r\n"
    if length is not None:
        lines += f"content-length: {length}\r\n"
    return lines.encode() + extra + b"\r\n"


def sse(path: str, request: dict[str, Any], body: dict[str, Any]) -> bytes:
    """An answer ``body`` as the server-sent events the stub server streams for it."""
    if path.endswith("/responses"):
        events, done = responses_events(body), False
    else:
        usage = bool((request.get("stream_options") or {}).get("include_usage"))
        events, done = chat_chunks(body, usage), True
    return "".join(sse_frames(events, done)).encode()


class RawServer:
    """Reads requests, hands each to ``reply``; counts connections and keeps requests.

    Args:
        reply: writes each answer.
        model: answers generation requests for ``RawRequest.answer`` (a fresh
            ``StubServer`` by default; it is never started, only asked).
    """

    def __init__(self, reply: Reply, model: StubServer | None = None) -> None:
        self.reply = reply
        self.model = model or StubServer()
        self.requests: list[RawRequest] = []
        self.connections = 0
        self.port = 0
        self.scheme = "http"
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/v1"

    async def start(self, ssl: ssl_module.SSLContext | None = None) -> None:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0, ssl=ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        self.scheme = "https" if ssl is not None else "http"

    async def close(self) -> None:
        await close_server(self._server, self._tasks)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        served = 0
        with client_connection(self._tasks, writer):
            while True:
                method, target, headers, body = await read_request(reader)
                served += 1
                request = RawRequest(method, target, headers, body, number, served, self.model)
                self.requests.append(request)
                keep = await self.reply(request, writer)
                await writer.drain()
                if not keep:
                    break


class RawServerThread:
    """Run a ``RawServer`` on its own event loop in a daemon thread (for code that runs
    its own loop, such as ``Runner``); a context manager giving the server."""

    def __init__(self, server: RawServer, ssl: ssl_module.SSLContext | None = None) -> None:
        self.server = server
        self._ssl = ssl
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> RawServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(self._ssl), self._loop).result(10)
        return self.server

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.server.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> RawServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
