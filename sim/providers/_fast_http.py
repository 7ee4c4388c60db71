"""The adapters' fast HTTP path, built on public interfaces of httpcore2 and httpx2.

Three pieces:

- ``SocketBackend``: an ``httpcore2.AsyncNetworkBackend`` on bare asyncio sockets (TLS
  through ``ssl.SSLObject`` on memory buffers). httpcore's default backend goes through
  anyio, which costs CPU on every read and write (cancel scopes, typed attribute lookups, a
  checkpoint that yields to the event loop before each write) and on every keep-alive
  check of an idle connection. This backend tries each ``send``/``recv`` at once and waits
  on the loop only when the socket is not ready, with the same timeouts and httpcore's
  own exceptions.
- ``PoolTransport``: an ``httpx2.AsyncBaseTransport`` over an ``httpcore2.AsyncConnectionPool``
  that this module builds and owns (on ``SocketBackend``); handed to an SDK client as its
  ``http_client``'s transport when one is needed (streaming, the Batch API).
- ``DirectPost``: POSTs a serialized body straight to a ``DirectPool`` (``_direct_pool``:
  sim's own pool of h11 connections on the same backend), to a ``Target`` (base URL,
  default query, headers with the key) the adapters build without any SDK: no SDK or
  httpx per-request layers (option models, header merging, URL parsing, auth and redirect
  hooks, cookie extraction: about 60% of the client's CPU per call, measured), no
  httpcore pool bookkeeping (a quarter of what was left), and no import of the OpenAI SDK
  (~0.4 s of CPU at start-up). A failure is a ``DirectPostError`` (a non-2xx answer keeps
  its status, headers and body), which ``_openai_errors`` maps through the same table as
  the SDK's exceptions.

The adapters use it for ``http://`` and ``https://`` base URLs reached without a proxy
from the environment (``direct_url``); proxied URLs keep the SDK's own stack.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import ssl
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpcore2
import httpx2

from sim.providers._direct_pool import DirectPool

__all__ = [
    "IDEMPOTENCY_HEADER",
    "DirectConnectionError",
    "DirectPost",
    "DirectPostError",
    "DirectStatusError",
    "DirectTimeoutError",
    "PoolTransport",
    "SocketBackend",
    "SocketStream",
    "TLSStream",
    "Target",
    "direct_url",
    "merge_headers",
    "plain_tcp_transport",
    "shared_ssl_context",
]

SocketOption = httpcore2.SOCKET_OPTION
IDEMPOTENCY_HEADER = "Idempotency-Key"
#: bytes asked of the socket per read while TLS records are being assembled
_TLS_READ = 65536
#: bytes a stream holds back before sending without waiting for the next read
_COALESCE = 65536

T = TypeVar("T")


class ReadableCheck:
    """Whether ``recv`` on a socket would return at once (data, or the ``b""`` of a closed
    peer).

    httpcore asks this (``get_extra_info("is_readable")``) of every idle keep-alive
    connection each time it assigns a request to one: readable there means the server
    closed it, so it is not reused. The poll object is made once per socket, so each
    check is one ``poll`` system call.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._poller = select.poll()
        self._poller.register(sock.fileno(), select.POLLIN)

    def __call__(self) -> bool:
        if self._sock.fileno() < 0:
            return True
        return bool(self._poller.poll(0))


class SocketStream(httpcore2.AsyncNetworkStream):
    """One non-blocking TCP socket.

    Writes are held back until the next read (or until ``_COALESCE`` bytes wait): httpcore
    writes a request's head and its body separately and then reads the answer, so both
    leave in one ``send``, one system call and one wake-up of the server instead of two.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._readable = ReadableCheck(sock)
        self._pending: list[bytes] = []
        self._pending_size = 0
        #: a send went out since the last read
        self._just_sent = False

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._pending:
            await self._send_pending(timeout)
        if self._just_sent:
            # what was just sent cannot have been answered yet: no point trying ``recv``
            # (a failed try costs a system call and an exception); wait on the loop
            self._just_sent = False
        else:
            try:
                return self._sock.recv(max_bytes)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as exc:
                raise httpcore2.ReadError(exc) from exc
        try:
            async with asyncio.timeout(timeout):
                return await self._loop.sock_recv(self._sock, max_bytes)
        except TimeoutError as exc:
            raise httpcore2.ReadTimeout(exc) from exc
        except OSError as exc:
            raise httpcore2.ReadError(exc) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        self._pending.append(buffer)
        self._pending_size += len(buffer)
        if self._pending_size >= _COALESCE:
            await self._send_pending(timeout)

    async def flush(self, timeout: float | None = None) -> None:
        """Send what writes hold back now."""
        if self._pending:
            await self._send_pending(timeout)

    async def _send_pending(self, timeout: float | None) -> None:
        pending = self._pending
        buffer = pending[0] if len(pending) == 1 else b"".join(pending)
        self._pending = []
        self._pending_size = 0
        view = memoryview(buffer)
        self._just_sent = True
        try:
            sent = self._sock.send(view)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            raise httpcore2.WriteError(exc) from exc
        if sent == len(view):
            return
        try:
            async with asyncio.timeout(timeout):
                await self._loop.sock_sendall(self._sock, view[sent:])
        except TimeoutError as exc:
            raise httpcore2.WriteTimeout(exc) from exc
        except OSError as exc:
            raise httpcore2.WriteError(exc) from exc

    async def aclose(self) -> None:
        self._pending = []
        self._sock.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        """TLS over this socket (an ``ssl.SSLObject`` on memory buffers); handshake done."""
        tls = TLSStream(self, ssl_context, server_hostname)
        try:
            await tls._call(tls._ssl.do_handshake, timeout, httpcore2.ConnectError)
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError) as exc:
            self._sock.close()
            raise httpcore2.ConnectError(exc) from exc  # the peer hung up mid-handshake
        except BaseException:
            self._sock.close()
            raise
        return tls

    def get_extra_info(self, info: str) -> Any:
        if info == "socket":
            return self._sock
        if info == "is_readable":
            return self._readable()
        if info == "client_addr":
            return self._sock.getsockname()
        if info == "server_addr":
            return self._sock.getpeername()
        return None  # "ssl_object" included: plain TCP


class TLSStream(httpcore2.AsyncNetworkStream):
    """TLS on a ``SocketStream``: records go through memory buffers, bytes through the
    socket only when the ``SSLObject`` needs them (as anyio does, minus its layers)."""

    def __init__(
        self, raw: SocketStream, ssl_context: ssl.SSLContext, server_hostname: str | None
    ) -> None:
        self._raw = raw
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = ssl_context.wrap_bio(
            self._incoming, self._outgoing, server_hostname=server_hostname
        )

    async def _flush(self, timeout: float | None) -> None:
        pending = self._outgoing.read()
        if pending:
            await self._raw.write(pending, timeout)

    async def _call(
        self, operation: Callable[[], T], timeout: float | None, error: type[Exception]
    ) -> T:
        """Run one ``SSLObject`` operation, feeding it socket bytes until it completes;
        what it produced goes to the raw stream (which holds it until the next read)."""
        while True:
            try:
                result = operation()
            except ssl.SSLWantReadError:
                await self._flush(timeout)
                data = await self._raw.read(_TLS_READ, timeout)
                if data:
                    self._incoming.write(data)
                else:
                    self._incoming.write_eof()
                continue
            except ssl.SSLWantWriteError:  # pragma: no cover - memory BIOs do not fill
                await self._flush(timeout)
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                raise
            except ssl.SSLError as exc:
                raise error(exc) from exc
            await self._flush(timeout)
            return result

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        await self._raw.flush(timeout)  # what was written goes out before any answer
        tls, incoming = self._ssl, self._incoming
        while True:
            if not (tls.pending() or incoming.pending or incoming.eof):
                # nothing to decrypt yet: read the socket first rather than have the
                # ``SSLObject`` raise ``SSLWantReadError`` to say so
                data = await self._raw.read(_TLS_READ, timeout)
                if data:
                    incoming.write(data)
                else:
                    incoming.write_eof()
            try:
                result = tls.read(max_bytes)
            except ssl.SSLWantReadError:
                if incoming.eof and not incoming.pending:
                    return b""  # wants more than the peer will ever send: end of stream
                if self._outgoing.pending:  # e.g. a key update to answer
                    await self._flush(timeout)
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""  # the peer closed (with or without close_notify): end of stream
            except ssl.SSLError as exc:
                raise httpcore2.ReadError(exc) from exc
            if self._outgoing.pending:
                await self._flush(timeout)
            return result

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            await self._call(lambda: self._ssl.write(buffer), timeout, httpcore2.WriteError)
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError) as exc:
            raise httpcore2.WriteError(exc) from exc

    async def aclose(self) -> None:
        # no close_notify exchange: the connection is dropped either way, and waiting
        # for the peer's answer could hang on a server that never sends one
        await self._raw.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.UnsupportedProtocol("TLS inside TLS (an https proxy) is not supported")

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object":
            return self._ssl
        if info == "is_readable":
            return self._ssl.pending() > 0 or self._raw.get_extra_info("is_readable")
        return self._raw.get_extra_info(info)


async def _resolve(
    loop: asyncio.AbstractEventLoop, host: str, port: int
) -> Sequence[tuple[socket.AddressFamily, socket.SocketKind, int, str, Any]]:
    """``getaddrinfo`` for a TCP connection. An IP address is converted on the spot
    (``AI_NUMERICHOST`` never blocks); only names go to the loop's thread pool, whose
    hand-off cost ~0.3 ms of CPU per connection (anyio skips it for addresses too)."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        return await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)


class SocketBackend(httpcore2.AsyncNetworkBackend):
    """Opens ``SocketStream`` connections (TCP_NODELAY, like asyncio's own)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                infos = await _resolve(loop, host, port)
                error: OSError | None = None
                for family, kind, proto, _, address in infos:
                    sock = socket.socket(family, kind, proto)
                    try:
                        sock.setblocking(False)
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        for option in socket_options or ():
                            sock.setsockopt(*option)
                        if local_address:
                            sock.bind((local_address, 0))
                        await loop.sock_connect(sock, address)
                    except OSError as exc:
                        sock.close()
                        error = exc
                        continue
                    except BaseException:
                        sock.close()
                        raise
                    return SocketStream(sock)
                raise error or OSError(f"no address for {host}:{port}")
        except TimeoutError as exc:
            raise httpcore2.ConnectTimeout(exc) from exc
        except OSError as exc:
            raise httpcore2.ConnectError(exc) from exc

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.UnsupportedProtocol("the socket backend does not do unix sockets")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


# httpcore's exceptions as httpx's, most specific first (what httpx's own transport does)
_HTTPX_ERRORS: tuple[tuple[type[Exception], type[httpx2.TransportError]], ...] = (
    (httpcore2.ConnectTimeout, httpx2.ConnectTimeout),
    (httpcore2.ReadTimeout, httpx2.ReadTimeout),
    (httpcore2.WriteTimeout, httpx2.WriteTimeout),
    (httpcore2.PoolTimeout, httpx2.PoolTimeout),
    (httpcore2.TimeoutException, httpx2.TimeoutException),
    (httpcore2.ConnectError, httpx2.ConnectError),
    (httpcore2.ReadError, httpx2.ReadError),
    (httpcore2.WriteError, httpx2.WriteError),
    (httpcore2.NetworkError, httpx2.NetworkError),
    (httpcore2.ProxyError, httpx2.ProxyError),
    (httpcore2.UnsupportedProtocol, httpx2.UnsupportedProtocol),
    (httpcore2.LocalProtocolError, httpx2.LocalProtocolError),
    (httpcore2.RemoteProtocolError, httpx2.RemoteProtocolError),
    (httpcore2.ProtocolError, httpx2.ProtocolError),
)


def _as_httpx_error(exc: Exception) -> Exception:
    for core, mapped in _HTTPX_ERRORS:
        if isinstance(exc, core):
            return mapped(str(exc))
    return exc


class _ResponseStream(httpx2.AsyncByteStream):
    def __init__(self, stream: AsyncIterator[bytes] | Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self._stream:
                yield part
        except Exception as exc:
            mapped = _as_httpx_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    async def aclose(self) -> None:
        close = getattr(self._stream, "aclose", None)
        if close is not None:
            await close()


class PoolTransport(httpx2.AsyncBaseTransport):
    """An httpx transport over a connection pool it is given (and closes, with the direct
    path's pool of the same client when given one)."""

    def __init__(
        self, pool: httpcore2.AsyncConnectionPool, direct: DirectPool | None = None
    ) -> None:
        self.pool = pool
        self.direct = direct

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        core_request = httpcore2.Request(
            method=request.method,
            url=httpcore2.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            response = await self.pool.handle_async_request(core_request)
        except Exception as exc:
            mapped = _as_httpx_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc
        return httpx2.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        try:
            await self.pool.aclose()
        finally:
            if self.direct is not None:
                await self.direct.aclose()


def direct_url(url: str) -> bool:
    """Whether ``url`` is ``http://`` or ``https://`` and reached without a proxy from the
    environment (the direct path does not speak to proxies: those URLs keep the SDK's
    stack, which does)."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        return False
    proxies = urllib.request.getproxies()
    if not (proxies.get(scheme) or proxies.get("all")):
        return True
    host = urllib.parse.urlsplit(url).hostname or ""
    return bool(urllib.request.proxy_bypass(host))


_SSL_CONTEXTS: dict[tuple[str | None, str | None], ssl.SSLContext] = {}


def shared_ssl_context() -> ssl.SSLContext:
    """httpx's default verifying context (honours ``SSL_CERT_FILE``/``SSL_CERT_DIR``), made
    once per process and setting and shared by every client the adapters build (on both
    paths): loading the certificate store costs ~30 ms, and a run makes a client per 16
    connections (0.27 s of start-up at concurrency 200 when each built its own)."""
    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    context = _SSL_CONTEXTS.get(key)
    if context is None:
        context = _SSL_CONTEXTS[key] = httpx2.create_ssl_context()
    return context


def plain_tcp_transport(limits: httpx2.Limits, url: str) -> tuple[PoolTransport, DirectPool]:
    """For a client of ``url`` (``http://`` or ``https://``, no proxy): a ``PoolTransport``
    on an httpcore pool on ``SocketBackend`` (what the SDK itself sends: streams, batch
    files, deletes) and the direct path's own pool (``DirectPool``), which the transport
    closes with it.

    Args:
        limits: connections each pool may open and keep alive.
        url: the client's base URL; https ones are verified with httpx's default context
            (for http ones no certificate store is loaded).
    """
    parsed = httpx2.URL(url)
    tls = parsed.scheme == "https"
    context = shared_ssl_context() if tls else None
    backend = SocketBackend()
    pool = httpcore2.AsyncConnectionPool(
        ssl_context=context,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=backend,
    )
    direct = DirectPool(
        parsed.scheme,
        parsed.host,
        parsed.port or (443 if tls else 80),
        backend=backend,
        max_connections=limits.max_connections or 100,
        keepalive_expiry=limits.keepalive_expiry,
        ssl_context=context,
    )
    return PoolTransport(pool, direct), direct


def _target(url: str) -> bytes:
    """A URL's request target: its path and query, as sent on the request line."""
    return httpx2.URL(url).raw_path


def _header_bytes(value: str) -> bytes:
    try:
        return value.encode("ascii")
    except UnicodeEncodeError:
        return value.encode("utf-8")


@dataclass(frozen=True, slots=True)
class Target:
    """Where the direct path POSTs, and what every request carries, built by the adapters
    without an SDK client.

    Attributes:
        base_url: the API root (``https://api.openai.com/v1``); its own query, if any, is
            not sent (as the SDK joins paths), ``query`` is.
        query: the default query of every request (``api-version`` and the like).
        headers: sent with every request in this order (auth first, then the defaults,
            a later name replacing an earlier one of any case). They hold the key, so
            they are left out of the repr.
    """

    base_url: str
    query: tuple[tuple[str, str], ...] = ()
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)


def merge_headers(*layers: Mapping[str, str | None]) -> tuple[tuple[str, str], ...]:
    """Headers merged case-insensitively, a later layer's name replacing an earlier one's
    and ``None`` removing it (what the SDK does with its ``Omit``)."""
    merged: dict[str, tuple[str, str]] = {}
    for layer in layers:
        for name, value in layer.items():
            if value is None:
                merged.pop(name.lower(), None)
            else:
                merged[name.lower()] = (name, value)
    return tuple(merged.values())


class DirectPostError(Exception):
    """A POST on the direct path failed; ``message`` says how (worded as the SDK words
    it), ``url`` where it went (no query: never a secret, never the headers)."""

    message = "Connection error."

    def __init__(self, url: str) -> None:
        super().__init__(f"{self.message} (POST {url})")
        self.url = url


class DirectConnectionError(DirectPostError):
    """No answer: the connection could not be opened, or broke (chained from the
    transport's error, which says why)."""


class DirectTimeoutError(DirectConnectionError):
    """No answer within the timeout."""

    message = "Request timed out."


class DirectStatusError(DirectPostError):
    """A non-2xx answer: its status, headers (names lower-cased) and body, read in full,
    for the error table (``_openai_errors``)."""

    def __init__(self, url: str, status: int, headers: Mapping[str, str], content: bytes) -> None:
        self.message = f"HTTP {status}"
        super().__init__(url)
        self.status = status
        self.headers = headers
        self.content = content


class DirectPost:
    """POST a JSON body straight to a connection pool, to a ``Target``.

    No SDK is involved: the target gives the URL, the default query and the headers (key
    included), and failures are raised as ``DirectPostError``s: a non-2xx answer
    ``DirectStatusError`` (status, headers, body), a timeout ``DirectTimeoutError``, any
    other transport failure ``DirectConnectionError``. ``_openai_errors`` maps them
    through the same table as the SDK's exceptions.
    """

    def __init__(self, target: Target, pool: DirectPool) -> None:
        self._pool = pool
        parts = urllib.parse.urlsplit(target.base_url)
        self._base = urllib.parse.urlunsplit((*parts[:3], "", "")).rstrip("/")
        query = urllib.parse.urlencode(target.query)
        self._query = f"?{query}" if query else ""
        self._urls: dict[str, bytes] = {}
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host  # IPv6 in brackets
        default_port = 443 if parts.scheme.lower() == "https" else 80
        if parts.port is not None and parts.port != default_port:
            host += f":{parts.port}"
        #: the base URL as errors name it: no user info, no query
        self._shown = f"{parts.scheme}://{host}{parts.path}".rstrip("/")
        self._headers = [(b"Host", host.encode("ascii" if host.isascii() else "idna"))] + [
            (name.encode("ascii"), _header_bytes(value))
            for name, value in target.headers
            if name.lower() not in ("host", "content-length")
        ]

    async def post(
        self,
        path: str,
        content: bytes,
        timeout: httpx2.Timeout,
        idempotency_key: str | None = None,
    ) -> bytes:
        """The answer's body; raises ``DirectPostError``s."""
        target = self._urls.get(path)
        if target is None:  # made once per path, not on every call
            target = self._urls[path] = _target(self._base + path + self._query)
        extra = []  # Content-Length: the pool sets it from the body
        if idempotency_key is not None:
            extra.append((IDEMPOTENCY_HEADER.encode("ascii"), idempotency_key.encode("ascii")))
        try:
            response = await self._pool.request(
                b"POST", target, self._headers, content, timeout, extra
            )
        except httpcore2.TimeoutException as exc:
            raise DirectTimeoutError(self._shown + path) from exc
        except Exception as exc:  # any other transport failure: no answer
            raise DirectConnectionError(self._shown + path) from exc
        if not 200 <= response.status < 300:
            raise DirectStatusError(
                self._shown + path,
                response.status,
                {
                    name.decode("latin-1").lower(): value.decode("latin-1")
                    for name, value in response.headers
                },
                response.body,
            )
        return response.body

    async def aclose(self) -> None:
        """Close the connection pool (an SDK client built on it closes it too: twice is
        harmless)."""
        await self._pool.aclose()
