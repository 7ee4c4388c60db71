"""The direct path's own HTTP/1.1 connection pool: h11 on ``_fast_http``'s socket streams.

httpcore's ``AsyncConnectionPool`` spent about a fifth of the client's CPU per call on
bookkeeping (it walks every connection and every queued request twice per request, and
asks each idle connection whether the server closed it), and its connection wraps each
request in trace hooks, anyio locks and byte-stream objects. The direct path sends one
POST with a body in memory and reads one whole answer, so this pool does just that:

- an idle list (most recently used first) and a queue of waiters; a connection a request
  finishes with goes straight to the first waiter, else back to the list;
- at most ``max_connections`` open at once (connecting ones included); a waiter gives up
  after the pool timeout with ``httpcore2.PoolTimeout``;
- a connection is reused only when its exchange ended cleanly (h11: both sides ``DONE``),
  its keep-alive time has not run out and the server has not closed it (readable while
  idle);
- any failure or cancellation mid-exchange closes that connection and frees its place.

Errors are httpcore's (``ConnectError``, ``ReadTimeout``, ``RemoteProtocolError``, ...), so
the caller maps both this pool's and httpcore's failures with one table.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass

import h11
import httpcore2
import httpx2

__all__ = ["Answer", "DirectConnection", "DirectPool", "RequestHead"]

#: bytes asked of the stream per read
_READ = 65536
#: the largest response head h11 will buffer (httpcore's limit)
_MAX_HEAD = 100 * 1024
#: distinct request heads a pool keeps rendered
_HEADS = 64


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole HTTP answer: status, headers (as sent, names' case kept), body."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


class DirectConnection:
    """One HTTP/1.1 connection: an h11 state machine over a network stream."""

    __slots__ = ("_h11", "expire_at", "stream")

    def __init__(self, stream: httpcore2.AsyncNetworkStream) -> None:
        self.stream = stream
        #: ``time.monotonic()`` after which an idle connection is not reused
        self.expire_at = 0.0
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD)

    def usable(self, now: float) -> bool:
        """Whether this idle connection may take a request: not expired, and the server
        has not closed it (readable while idle means the ``b""`` of a closed peer, or
        bytes nobody asked for: either way it is not reused)."""
        return now < self.expire_at and not self.stream.get_extra_info("is_readable")

    async def exchange(
        self,
        request: h11.Request,
        head: bytes,
        body: bytes,
        read_timeout: float | None,
        write_timeout: float | None,
    ) -> tuple[Answer, bool]:
        """Send a request, read the whole answer.

        ``request`` is what h11 is told (method, target, the headers that decide framing
        and keep-alive); ``head`` is the request line and headers as written, which
        carries the same ones (``RequestHead.bytes``), and ``body`` follows it.

        Returns:
            The answer, and whether the connection may be reused (both sides done).

        Raises:
            httpcore2.LocalProtocolError: the request is not valid HTTP/1.1.
            httpcore2.RemoteProtocolError: the answer is not, or the server closed first.
            httpcore2.ReadTimeout, httpcore2.ReadError, httpcore2.WriteTimeout,
            httpcore2.WriteError: from the stream.
        """
        state = self._h11
        stream = self.stream
        try:
            state.send(request)  # h11's own rendering of the head is not needed: ``head``
            parts = [head]
            if body:
                parts += state.send_with_data_passthrough(h11.Data(data=body)) or ()
            parts.append(state.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError as exc:
            raise httpcore2.LocalProtocolError(exc) from exc
        # the whole request in one write: one send, and over TLS one encryption call. A
        # failed write is not the end: the server may have answered (an error) and closed
        # before reading the whole request, so what it said is read, as httpcore does
        with contextlib.suppress(httpcore2.WriteError):
            await stream.write(b"".join(parts), write_timeout)
        status = 0
        headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []
        while True:
            try:
                event = state.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpcore2.RemoteProtocolError(exc) from exc
            if event is h11.NEED_DATA:
                received = await stream.read(_READ, read_timeout)
                if not received and state.their_state is h11.SEND_RESPONSE:
                    raise httpcore2.RemoteProtocolError(
                        "Server disconnected without sending a response."
                    )
                try:
                    state.receive_data(received)
                except h11.RemoteProtocolError as exc:  # pragma: no cover - h11 raises later
                    raise httpcore2.RemoteProtocolError(exc) from exc
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.Response):
                status = event.status_code
                headers = event.headers.raw_items()
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):  # pragma: no cover - h11 ends first
                raise httpcore2.RemoteProtocolError("Server closed the connection mid-answer.")
            # informational (1xx) answers are skipped; the final one follows
        reusable = state.our_state is h11.DONE and state.their_state is h11.DONE
        if reusable:
            state.start_next_cycle()
        body_out = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return Answer(status, headers, body_out), reusable

    async def aclose(self) -> None:
        await self.stream.aclose()


#: headers h11 must see to frame the exchange and know whether the connection is kept
_FRAMING = frozenset({b"connection", b"content-length", b"expect", b"transfer-encoding", b"te"})


class RequestHead:
    """A request line and headers sent by many requests, checked and rendered by h11 once.

    h11 validates every header of every request it is given (a regular expression per
    name and value: about a tenth of the direct path's CPU per call with the SDK's dozen
    headers). Here it checks and renders the repeated ones once; each request then tells
    h11 only ``Host``, the headers that decide framing and keep-alive, its own extra
    headers and its ``Content-Length`` (so h11's state is that of the request written),
    and writes this prefix followed by those extra headers and the length.

    Raises:
        httpcore2.LocalProtocolError: a header is not valid, ``Host`` is missing, or
            ``Content-Length`` is given (the pool sets it from the body).
    """

    __slots__ = ("_told", "method", "prefix", "target")

    def __init__(self, method: bytes, target: bytes, headers: Sequence[tuple[bytes, bytes]]):
        self.method = method
        self.target = target
        if any(name.lower() == b"content-length" for name, _ in headers):
            raise httpcore2.LocalProtocolError("Content-Length is set from the body")
        try:
            rendered = h11.Connection(h11.CLIENT).send(
                h11.Request(
                    method=method, target=target, headers=[*headers, (b"Content-Length", b"0")]
                )
            )
        except h11.LocalProtocolError as exc:
            raise httpcore2.LocalProtocolError(exc) from exc
        end = b"Content-Length: 0\r\n\r\n"
        assert rendered is not None and rendered.endswith(end)  # h11 writes them in order
        #: the request line and the repeated headers, as h11 writes them
        self.prefix = rendered[: -len(end)]
        #: what each request tells h11 besides its own headers and length
        self._told = [
            (name, value)
            for name, value in headers
            if name.lower() == b"host" or name.lower() in _FRAMING
        ]

    def request(
        self, length: int, extra: Sequence[tuple[bytes, bytes]]
    ) -> tuple[h11.Request, bytes]:
        """The event for h11 and the head to write, for a body of ``length`` bytes."""
        size = b"%d" % length
        event = h11.Request(
            method=self.method,
            target=self.target,
            headers=[*self._told, *extra, (b"Content-Length", size)],
        )  # validates ``extra``
        lines = b"".join([b"%s: %s\r\n" % (name, value) for name, value in extra])
        return event, b"%s%sContent-Length: %s\r\n\r\n" % (self.prefix, lines, size)


class DirectPool:
    """HTTP/1.1 connections to one origin (``scheme://host:port``), reused across requests.

    Args:
        scheme: ``"http"`` or ``"https"``.
        host, port: where to connect (also the TLS server name).
        max_connections: connections open at once, at most; more requests wait.
        keepalive_expiry: seconds an idle connection stays reusable.
        ssl_context: verifies the server (``https`` only).
        backend: opens the streams (``_fast_http.SocketBackend`` on the direct path).
    """

    def __init__(
        self,
        scheme: str,
        host: str,
        port: int,
        *,
        backend: httpcore2.AsyncNetworkBackend,
        max_connections: int,
        keepalive_expiry: float | None = 5.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if scheme not in ("http", "https"):
            raise ValueError(f"the direct pool speaks http and https, not {scheme!r}")
        if scheme == "https" and ssl_context is None:
            raise ValueError("an https pool needs an ssl_context")
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.scheme = scheme
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self._keepalive = float("inf") if keepalive_expiry is None else keepalive_expiry
        self._ssl_context = ssl_context if scheme == "https" else None
        self.backend = backend
        #: idle connections, the most recently used last
        self._idle: list[DirectConnection] = []
        #: every open connection (idle, in use), so ``aclose`` leaves none behind
        self._open: set[DirectConnection] = set()
        #: places taken: open connections plus connections being opened
        self._taken = 0
        #: requests waiting for a place; each future gets a connection, or ``None``
        #: meaning "a place is yours, open a connection"
        self._waiters: collections.deque[asyncio.Future[DirectConnection | None]] = (
            collections.deque()
        )
        self._closed = False
        #: the rendered heads of the header lists seen (a client sends one or two)
        self._heads: dict[tuple[bytes, bytes, tuple[tuple[bytes, bytes], ...]], RequestHead] = {}

    # ----------------------------------------------------------------- state, for tests

    @property
    def connections(self) -> int:
        """Connections open now (idle and in use)."""
        return len(self._open)

    @property
    def idle(self) -> int:
        """Connections open and waiting for a request."""
        return len(self._idle)

    @property
    def waiting(self) -> int:
        """Requests queued for a connection."""
        return sum(1 for waiter in self._waiters if not waiter.done())

    @property
    def in_use(self) -> int:
        """Places taken by requests (connections in use and being opened)."""
        return self._taken - len(self._idle)

    # ------------------------------------------------------------------- requests

    async def request(
        self,
        method: bytes,
        target: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        timeout: httpx2.Timeout,
        extra: Sequence[tuple[bytes, bytes]] = (),
    ) -> Answer:
        """Send one request on a pooled connection and read the whole answer.

        Args:
            headers: the headers many requests share (``Host`` included, no
                ``Content-Length``: it is set from ``body``); checked once per distinct
                list (``RequestHead``).
            extra: headers of this request alone (an idempotency key), checked each time.

        Raises:
            httpcore2.PoolTimeout: no connection within ``timeout.pool``.
            httpcore2.ConnectError, httpcore2.ConnectTimeout: opening one failed.
            httpcore2.LocalProtocolError: the request is not valid HTTP/1.1.
            other ``httpcore2`` errors: the exchange failed (the connection is closed).
        """
        key = (method, target, tuple(headers))
        prepared = self._heads.get(key)
        if prepared is None:
            if len(self._heads) >= _HEADS:
                self._heads.clear()
            prepared = self._heads[key] = RequestHead(method, target, headers)
        try:
            request, head = prepared.request(len(body), extra)
        except h11.LocalProtocolError as exc:
            raise httpcore2.LocalProtocolError(exc) from exc
        connection = await self._acquire(timeout)
        try:
            answer, reusable = await connection.exchange(
                request, head, body, timeout.read, timeout.write
            )
        except BaseException:
            await self._discard(connection)
            raise
        if reusable and not self._closed:
            connection.expire_at = time.monotonic() + self._keepalive
            self._release(connection)
        else:
            await self._discard(connection)
        return answer

    async def _acquire(self, timeout: httpx2.Timeout) -> DirectConnection:
        if self._closed:
            raise RuntimeError("the connection pool is closed")
        idle = self._idle
        if idle:
            now = time.monotonic()
            while idle:
                connection = idle.pop()
                if connection.usable(now):
                    return connection
                await self._discard(connection)  # expired, or the server closed it
        if self._taken < self.max_connections and not self._waiters:
            self._taken += 1
            return await self._connect(timeout.connect)
        waiter: asyncio.Future[DirectConnection | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout.pool):
                handed = await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                # handed a connection (or a place) just as this request gave up: pass it on
                self._give_back(waiter.result())
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):  # gone if someone resolved it
                    self._waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise httpcore2.PoolTimeout(
                    f"no connection free within {timeout.pool}s ({self.max_connections} in use)"
                ) from exc
            raise
        if handed is not None:
            return handed
        return await self._connect(timeout.connect)  # a place was freed for this request

    async def _connect(self, timeout: float | None) -> DirectConnection:
        """Open a connection for a place already taken; frees the place if that fails."""
        try:
            stream = await self.backend.connect_tcp(self.host, self.port, timeout=timeout)
            if self._ssl_context is not None:
                stream = await stream.start_tls(
                    self._ssl_context, server_hostname=self.host, timeout=timeout
                )
        except BaseException:
            self._free_place()
            raise
        connection = DirectConnection(stream)
        if self._closed:  # the pool closed while this one was opening
            self._free_place()
            await connection.aclose()
            raise RuntimeError("the connection pool is closed")
        self._open.add(connection)
        return connection

    def _release(self, connection: DirectConnection) -> None:
        """A healthy connection is free: to the first waiter, else to the idle list."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        self._idle.append(connection)

    def _give_back(self, handed: DirectConnection | None) -> None:
        if handed is None:
            self._free_place()
        else:
            self._release(handed)

    def _free_place(self) -> None:
        """A place is free: to the first waiter (who opens a connection), else counted."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._taken -= 1

    async def _discard(self, connection: DirectConnection) -> None:
        """Close a connection that is not to be reused and free its place (the books are
        right before the close is awaited, so a cancellation cannot leave them wrong)."""
        if connection in self._open:
            self._open.discard(connection)
            self._free_place()
        await connection.aclose()

    async def aclose(self) -> None:
        """Refuse new requests, fail the waiting ones and close the idle connections; a
        request in flight finishes, and its connection is then closed rather than kept.

        (Closing a socket under a task waiting on it would leave that task waiting until
        its read timeout: the loop is not told.)
        """
        self._closed = True
        waiters, self._waiters = self._waiters, collections.deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(RuntimeError("the connection pool is closed"))
        idle, self._idle = self._idle, []
        for connection in idle:
            self._open.discard(connection)
            self._taken -= 1
        for connection in idle:
            await connection.aclose()
