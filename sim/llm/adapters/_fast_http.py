"""A plain-TCP network backend for httpcore on bare asyncio sockets, for ``http://`` servers.

httpcore's default backend goes through anyio, which costs CPU on every read and write
(cancel scopes, typed attribute lookups, a checkpoint that yields to the event loop before
each write) and on every keep-alive check of an idle connection. At hundreds of calls in
flight that overhead, and the extra trips round the event loop, are a large part of the
client's time per call. This backend tries each ``send``/``recv`` at once and waits on the
loop only when the socket is not ready, with the same timeouts and httpcore's own
exceptions.

It speaks plain TCP only: the adapters use it for ``http://`` base URLs (local servers:
vLLM, Ollama, llama.cpp, ``sim stub-server``); ``https://`` keeps httpcore's default
backend and its TLS.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable
from typing import Any

import httpcore2
import httpx2
import openai

try:  # private helpers: without them the adapters keep the SDK's own path
    from httpcore2._utils import is_socket_readable
except ImportError:  # pragma: no cover - depends on the installed httpcore2
    is_socket_readable = None  # type: ignore[assignment]

SocketOption = httpcore2.SOCKET_OPTION
IDEMPOTENCY_HEADER = "Idempotency-Key"


class SocketStream(httpcore2.AsyncNetworkStream):
    """One non-blocking TCP socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
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
        view = memoryview(buffer)
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
        self._sock.close()

    async def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.UnsupportedProtocol("the plain-TCP backend does not speak TLS")

    def get_extra_info(self, info: str) -> Any:
        if info == "socket":
            return self._sock
        if info == "is_readable":
            return is_socket_readable(self._sock)
        if info == "client_addr":
            return self._sock.getsockname()
        if info == "server_addr":
            return self._sock.getpeername()
        return None  # "ssl_object" included: never TLS


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
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
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
        raise httpcore2.UnsupportedProtocol("the plain-TCP backend does not do unix sockets")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def supported() -> bool:
    """Whether the installed SDK still has the private pieces the direct path relies on
    (the SDK's status-error factory, httpx's transport pool attribute, httpcore's socket
    probe); if a future release drops one, the adapters fall back to the SDK's path."""
    if is_socket_readable is None:
        return False
    if not callable(getattr(openai.AsyncOpenAI, "_make_status_error_from_response", None)):
        return False
    return "_pool" in vars(httpx2.AsyncHTTPTransport(verify=False))


def plain_tcp_transport(
    limits: httpx2.Limits,
) -> tuple[httpx2.AsyncHTTPTransport, httpcore2.AsyncConnectionPool]:
    """httpx's transport with its connection pool on ``SocketBackend``, and that pool."""
    # no TLS ever happens on this transport (plain TCP only), so skip building a
    # certificate store per client (~30 ms each; a run at concurrency 200 makes 13)
    transport = httpx2.AsyncHTTPTransport(limits=limits, verify=False)
    pool = httpcore2.AsyncConnectionPool(
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=SocketBackend(),
    )
    transport._pool = pool
    return transport, pool


class DirectPost:
    """POST a JSON body straight to an SDK client's plain-TCP connection pool.

    For ``http://`` servers the adapters skip the SDK's and httpx's per-request machinery
    (option models, header merging, URL parsing, auth and redirect hooks, cookie
    extraction: measured at about 60% of the client's CPU per call) and send through
    httpcore directly. The SDK still builds the client (key, base URL, user agent) and
    still makes the errors: a non-2xx answer becomes the exact ``APIStatusError`` the SDK
    would raise, a timeout ``APITimeoutError``, anything else ``APIConnectionError``.
    """

    def __init__(self, client: openai.AsyncOpenAI, pool: httpcore2.AsyncConnectionPool) -> None:
        self._client = client
        self._pool = pool
        base = httpx2.URL(str(client.base_url))
        self._base = str(base).rstrip("/")
        host = f"[{base.host}]" if ":" in base.host else base.host  # IPv6 in brackets
        host += f":{base.port}" if base.port else ""
        self._headers = [
            (b"Host", host.encode("ascii")),
            (b"Accept", b"application/json"),
            (b"Content-Type", b"application/json"),
            (b"User-Agent", client.user_agent.encode("ascii", "replace")),
            (b"Authorization", f"Bearer {client.api_key}".encode("latin-1")),
        ]

    async def post(
        self,
        path: str,
        content: bytes,
        timeout: httpx2.Timeout,
        idempotency_key: str | None = None,
    ) -> bytes:
        """The answer's body; raises the SDK's errors."""
        url = self._base + path
        headers = [*self._headers, (b"Content-Length", str(len(content)).encode("ascii"))]
        if idempotency_key is not None:
            headers.append((IDEMPOTENCY_HEADER.encode("ascii"), idempotency_key.encode("ascii")))
        extensions = {
            "timeout": {
                "connect": timeout.connect,
                "read": timeout.read,
                "write": timeout.write,
                "pool": timeout.pool,
            }
        }
        try:
            response = await self._pool.request(
                "POST", url, headers=headers, content=content, extensions=extensions
            )
        except httpcore2.TimeoutException as exc:
            raise openai.APITimeoutError(request=httpx2.Request("POST", url)) from exc
        except Exception as exc:  # what the SDK does with any transport failure
            raise openai.APIConnectionError(request=httpx2.Request("POST", url)) from exc
        if not 200 <= response.status < 300:  # httpx's raise_for_status, as the SDK uses
            raise self._client._make_status_error_from_response(
                httpx2.Response(
                    response.status,
                    headers=response.headers,
                    content=response.content,
                    request=httpx2.Request("POST", url),
                )
            )
        return response.content
