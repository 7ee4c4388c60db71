"""The adapters' HTTP client: POSTs and server-sent event streams on aiohttp.

``Route`` sends to one base URL (a ``Target``: URL, default query, headers with the key)
through an ``aiohttp.ClientSession`` it owns: a pool of keep-alive connections (at most
``size``), TLS verified with ``shared_ssl_context``, a proxy taken from the environment
when one applies (``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``, ``NO_PROXY`` honoured),
answers decoded whatever ``Content-Encoding`` (gzip, deflate) they come in. No SDK is
involved: the request is the body already serialized and the headers the SDK would send;
the answer is raw bytes (``post``) or the stream's JSON events (``stream``).

What a kept client does for us, and this module adds on top:

- ``timeout_seconds`` is a **total deadline**: connecting, waiting for a connection, the
  headers and the body all count against it, so a server dripping one byte a second
  cannot hold a call past it.
- **A stale keep-alive connection is retried once, on a fresh connection.** A server may
  close an idle connection just as the next request is written on it; that request was
  never answered, so it goes again at once on a connection opened for it (a second
  session whose connections are never reused), within the same deadline. A failure there
  is the call's.
- **Failures are named:** a non-2xx answer is ``HttpStatusError`` (status, headers, body,
  for ``_openai_errors``' table); no answer ``HttpConnectionError``; the deadline
  ``HttpTimeoutError``; an answer that is not valid HTTP (a header over the size limit,
  a body shorter or longer than its ``Content-Length``, broken chunking or compression)
  ``HttpProtocolError``; a certificate that does not verify ``HttpTLSError`` naming the
  host. A missing ``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` is an ``LLMConfigurationError``
  naming the variable and the path.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import certifi
import orjson
from yarl import URL

from sim.llm.errors import LLMConfigurationError

__all__ = [
    "IDEMPOTENCY_HEADER",
    "HttpConnectionError",
    "HttpPostError",
    "HttpProtocolError",
    "HttpStatusError",
    "HttpStreamCutError",
    "HttpStreamError",
    "HttpTLSError",
    "HttpTimeoutError",
    "Route",
    "Target",
    "environment_proxy",
    "merge_headers",
    "shared_ssl_context",
]

IDEMPOTENCY_HEADER = "Idempotency-Key"
#: seconds an idle connection is kept for reuse (httpx's default)
KEEPALIVE_SECONDS = 5.0

# -- TLS --------------------------------------------------------------------------------------

_SSL_CONTEXTS: dict[tuple[str | None, str | None], ssl.SSLContext] = {}


def _load_context() -> ssl.SSLContext:
    """A verifying context: ``SSL_CERT_FILE``, else ``SSL_CERT_DIR``, else the system's
    certificate store, else certifi's (a system without one, such as a slim container)."""
    cafile = os.environ.get("SSL_CERT_FILE") or None
    capath = os.environ.get("SSL_CERT_DIR") or None
    if cafile is not None:
        if not os.path.isfile(cafile):
            raise LLMConfigurationError(
                f"SSL_CERT_FILE is set to {cafile!r}, which is not a file: point it to a "
                "PEM file of the certificates to trust, or unset it to use the system's"
            )
        try:
            return ssl.create_default_context(cafile=cafile)
        except ssl.SSLError as exc:
            raise LLMConfigurationError(
                f"SSL_CERT_FILE ({cafile!r}) holds no certificate that can be read: {exc}"
            ) from exc
    if capath is not None:
        if not os.path.isdir(capath):
            raise LLMConfigurationError(
                f"SSL_CERT_DIR is set to {capath!r}, which is not a folder: point it to a "
                "folder of hashed certificates (c_rehash), or unset it to use the system's"
            )
        return ssl.create_default_context(capath=capath)
    context = ssl.create_default_context()
    if not context.cert_store_stats().get("x509_ca"):
        context.load_verify_locations(cafile=certifi.where())
    return context


def shared_ssl_context() -> ssl.SSLContext:
    """The verifying TLS context, made once per process and setting and shared by every
    client the adapters build: loading a certificate store costs ~30 ms, and a run makes
    a route per 16 connections.

    Raises:
        LLMConfigurationError: ``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` names nothing usable.
    """
    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    context = _SSL_CONTEXTS.get(key)
    if context is None:
        context = _SSL_CONTEXTS[key] = _load_context()
    return context


# -- where requests go ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """Where a route POSTs, and what every request carries, built by the adapters
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


def environment_proxy(url: str) -> str | None:
    """The proxy the environment sets for ``url`` (``HTTP_PROXY``, ``HTTPS_PROXY``,
    ``ALL_PROXY``, any case), or ``None``: none set, or ``NO_PROXY`` covers its host."""
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme.lower()) or proxies.get("all")
    if not proxy:
        return None
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


def _shown(url: str) -> str:
    """A URL as errors name it: no user info, no query."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host  # IPv6 in brackets
    default_port = 443 if parts.scheme.lower() == "https" else 80
    if parts.port is not None and parts.port != default_port:
        host += f":{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}".rstrip("/")


# -- failures ---------------------------------------------------------------------------------


class HttpPostError(Exception):
    """A request failed; ``message`` says how, ``url`` where it went (no query: never a
    secret, never the headers)."""

    message = "Connection error."

    def __init__(self, url: str, detail: str = "") -> None:
        if detail:
            self.message = f"{self.message.rstrip('.')}: {detail}"
        super().__init__(f"{self.message} (POST {url})")
        self.url = url


class HttpConnectionError(HttpPostError):
    """No answer: the connection could not be opened, or broke before an answer (chained
    from aiohttp's error, which says why)."""


class HttpTimeoutError(HttpConnectionError):
    """No whole answer within the call's total deadline."""

    message = "Request timed out."


class HttpStreamCutError(HttpConnectionError):
    """A streamed answer broke off after it had started (the connection closed or the
    chunked framing ended mid-stream)."""

    message = "The stream was cut short."


class HttpProtocolError(HttpPostError):
    """The server answered, but not in valid HTTP: ``detail`` names what was wrong."""

    message = "The answer is not valid HTTP."


class HttpTLSError(HttpPostError):
    """The server's TLS certificate did not verify (or the TLS handshake failed)."""

    message = "TLS verification failed."

    def __init__(self, url: str, host: str, detail: str) -> None:
        super().__init__(url, detail)
        self.host = host


class HttpStatusError(HttpPostError):
    """A non-2xx answer: its status, headers (names lower-cased) and body, read in full,
    for the error table (``_openai_errors``)."""

    def __init__(self, url: str, status: int, headers: Mapping[str, str], content: bytes) -> None:
        self.message = f"HTTP {status}"
        super().__init__(url)
        self.status = status
        self.headers = headers
        self.content = content


class HttpStreamError(HttpPostError):
    """A stream's event carried an ``error`` object (as the SDK's ``AsyncStream`` reads
    it): its message and the object."""

    def __init__(self, url: str, detail: str, body: object) -> None:
        self.message = detail or "An error occurred during streaming"
        super().__init__(url)
        self.body = body


#: the failures of a request that got no answer because its connection was gone: a
#: server's close or reset met as the request went out (what aiohttp itself retries once
#: for idempotent methods; a POST here carries its idempotency key). Failing to open a
#: connection (``ClientConnectorError``) is not one of them.
_STALE = (
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientConnectionResetError,
    aiohttp.ClientOSError,
)


def _stale(exc: BaseException) -> bool:
    return isinstance(exc, _STALE) and not isinstance(exc, aiohttp.ClientConnectorError)


def _named(exc: BaseException, url: str) -> HttpPostError:
    """aiohttp's exception as one of ours, most specific first."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        cause = exc.certificate_error
        reason = getattr(cause, "verify_message", None) or str(cause)
        return HttpTLSError(
            url,
            exc.host,
            f"the certificate of {exc.host} did not verify ({reason}); if it is signed by "
            "a private authority, point SSL_CERT_FILE to a PEM file that holds it",
        )
    if isinstance(exc, aiohttp.ClientConnectorSSLError):
        return HttpTLSError(url, exc.host, f"TLS handshake with {exc.host} failed: {exc.os_error}")
    if isinstance(exc, TimeoutError):  # aiohttp's timeouts are ``asyncio.TimeoutError``s
        return HttpTimeoutError(url)
    if isinstance(exc, aiohttp.ClientPayloadError):
        return HttpProtocolError(url, _payload_detail(exc))
    if isinstance(exc, aiohttp.ClientResponseError):
        # raised while reading the answer's head (aiohttp's parser), never for a status
        return HttpProtocolError(url, _head_detail(exc.message))
    if isinstance(exc, aiohttp.ClientConnectionError | OSError):
        return HttpConnectionError(url, str(exc) or type(exc).__name__)
    return HttpConnectionError(url, repr(exc))


def _short(text: str, limit: int = 160) -> str:
    """The first line of a parser's message, at most ``limit`` characters."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _head_detail(message: str) -> str:
    """What was wrong with an answer's head, in words (aiohttp's parser message kept)."""
    lowered = message.lower()
    if "got more than" in lowered or "too long" in lowered or "too many" in lowered:
        return f"a header is over the size limit (8190 bytes): {_short(message)}"
    if "bad status line" in lowered:
        return (
            "bytes where no answer was due: the server sent more than its Content-Length "
            "announced (or does not speak HTTP/1.1)"
        )
    return f"its head is broken: {_short(message)}"


def _payload_detail(exc: aiohttp.ClientPayloadError) -> str:
    """What was wrong with an answer's body, in words."""
    text = " ".join(str(part) for part in (exc, exc.__cause__) if part is not None)
    said = re.search(r"message='([^']*)'", text)
    if said is not None:
        text = said.group(1)
    lowered = text.lower()
    if "content length" in lowered or "content-length" in lowered:
        return f"the body ended before its Content-Length: {_short(text)}"
    if "transfer" in lowered or "chunk" in lowered:
        return f"the chunked body is broken: {_short(text)}"
    if "decompress" in lowered or "gzip" in lowered or "deflate" in lowered:
        return f"the compressed body cannot be decoded: {_short(text)}"
    return f"the body is broken: {_short(text)}"


# -- the route --------------------------------------------------------------------------------


class Route:
    """POSTs to one ``Target`` on a pool of at most ``size`` keep-alive connections.

    The session is made on first use, on the running loop, and closed by ``aclose`` (a
    later use makes a new one).

    Args:
        target: URL, default query and headers of every request.
        size: connections open at once, at most; more requests wait for one (within
            their deadline).
        connect_timeout: seconds to open one connection (TCP and TLS), within the
            call's deadline.
    """

    def __init__(self, target: Target, size: int, connect_timeout: float | None = None) -> None:
        if size < 1:
            raise ValueError("a route needs at least one connection")
        self.size = size
        self.connect_timeout = connect_timeout
        parts = urllib.parse.urlsplit(target.base_url)
        self.scheme = parts.scheme.lower()
        if self.scheme not in ("http", "https"):
            raise LLMConfigurationError(
                f"base_url {_shown(target.base_url)!r}: only http:// and https:// URLs are "
                "supported"
            )
        # user info in a base_url is not sent: the request's key goes in its Authorization
        # header, and aiohttp refuses both at once (the user info is redacted wherever the
        # URL is shown or stored)
        netloc = parts.netloc.rpartition("@")[2]
        self._base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")
        query = urllib.parse.urlencode(target.query)
        self._query = f"?{query}" if query else ""
        #: the base URL as errors name it: no user info, no query
        self.shown = _shown(target.base_url)
        self._headers = {
            name: value
            for name, value in target.headers
            if name.lower() not in ("host", "content-length")
        }
        self.proxy = environment_proxy(target.base_url)
        self._proxy_url: URL | None = None
        #: ``Proxy-Authorization`` from the proxy URL's user info, if any
        self._proxy_headers: dict[str, str] | None = None
        if self.proxy is not None:
            proxy = URL(self.proxy)
            if proxy.user is not None:
                credentials = aiohttp.encode_basic_auth(proxy.user, proxy.password or "")
                if self.scheme == "http":  # the request itself goes to the proxy
                    self._headers["Proxy-Authorization"] = credentials
                else:  # the tunnel's CONNECT carries them
                    self._proxy_headers = {"Proxy-Authorization": credentials}
            self._proxy_url = proxy.with_user(None)
        # TLS is needed for an https target, or for an https proxy
        needs_tls = self.scheme == "https" or (
            self._proxy_url is not None and self._proxy_url.scheme == "https"
        )
        self._ssl: ssl.SSLContext | bool = shared_ssl_context() if needs_tls else True
        self._urls: dict[str, URL] = {}
        self._timeouts: dict[float | None, aiohttp.ClientTimeout] = {}
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None
        #: the loop the sessions were made on
        self._loop: asyncio.AbstractEventLoop | None = None
        #: stale keep-alive connections retried (for tests and the curious)
        self.stale_retries = 0

    # -- sessions -----------------------------------------------------------------------------

    def _new_session(self, *, reuse: bool) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self.size,
            limit_per_host=0,
            ssl=self._ssl,
            keepalive_timeout=KEEPALIVE_SECONDS if reuse else None,
            force_close=not reuse,
            ttl_dns_cache=300,
        )
        return aiohttp.ClientSession(
            connector=connector,
            # no default headers: aiohttp adds a session's to what it sends a proxy (the
            # key would reach it, as Proxy-Authorization and in a CONNECT); each request
            # carries them instead (``_with``)
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=True,
            trust_env=False,  # the proxy is this route's, from ``environment_proxy``
            proxy=self._proxy_url,
            raise_for_status=False,
        )

    def _pooled(self) -> aiohttp.ClientSession:
        session = self._session
        if session is None or session.closed or self._loop is not asyncio.get_running_loop():
            self._forget_other_loop()
            session = self._session = self._new_session(reuse=True)
        return session

    def _fresh_session(self) -> aiohttp.ClientSession:
        session = self._fresh
        if session is None or session.closed or self._loop is not asyncio.get_running_loop():
            self._forget_other_loop()
            session = self._fresh = self._new_session(reuse=False)
        return session

    def _forget_other_loop(self) -> None:
        """Sessions made on another loop (one that has ended) cannot be used or closed on
        this one: they are dropped, and new ones made here."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._session = self._fresh = None
            self._loop = loop

    def _url(self, path: str) -> URL:
        url = self._urls.get(path)
        if url is None:  # made once per path, not on every call
            url = self._urls[path] = URL(self._base + path + self._query)
        return url

    def _timeout(self, total: float | None) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(total)
        if timeout is None:
            timeout = self._timeouts[total] = aiohttp.ClientTimeout(
                total=total, sock_connect=self.connect_timeout
            )
        return timeout

    def _with(self, idempotency_key: str | None) -> dict[str, str]:
        """The target's headers, and the idempotency key if there is one."""
        if idempotency_key is None:
            return self._headers
        return {**self._headers, IDEMPOTENCY_HEADER: idempotency_key}

    # -- requests -----------------------------------------------------------------------------

    async def post(
        self, path: str, content: bytes, timeout: float | None, idempotency_key: str | None = None
    ) -> bytes:
        """POST ``content`` (JSON) to ``path``; the whole answer's body.

        Args:
            timeout: the total deadline in seconds (``None``: none).

        Raises:
            HttpPostError: one of its kinds (see the module doc).
        """
        shown = self.shown + path
        url = self._url(path)
        headers = self._with(idempotency_key)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            try:
                return await self._post_once(self._pooled(), url, content, headers, timeout, shown)
            except _STALE as exc:
                if not _stale(exc):
                    raise
                # a keep-alive connection the server closed as the request went out: once
                # more, on a connection opened for it, within what is left of the deadline
                self.stale_retries += 1
                left = None if deadline is None else max(0.001, deadline - loop.time())
                return await self._post_once(
                    self._fresh_session(), url, content, headers, left, shown
                )
        except HttpPostError:
            raise
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise _named(exc, shown) from exc

    async def _post_once(
        self,
        session: aiohttp.ClientSession,
        url: URL,
        content: bytes,
        headers: dict[str, str],
        timeout: float | None,
        shown: str,
    ) -> bytes:
        async with session.post(
            url,
            data=content,
            headers=headers,
            timeout=self._timeout(timeout),
            proxy_headers=self._proxy_headers,
            allow_redirects=False,  # a redirect is an error status, never followed
        ) as response:
            body = await response.read()
            if not 200 <= response.status < 300:
                raise HttpStatusError(
                    shown,
                    response.status,
                    {name.lower(): value for name, value in response.headers.items()},
                    body,
                )
            return body

    async def stream(
        self, path: str, content: bytes, idempotency_key: str | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """POST ``content`` and yield the JSON events of the server-sent event stream that
        answers it, until ``[DONE]`` or the end of the stream.

        Only connecting has a timeout here: the stream's clocks are the caller's
        (``_streaming.read_stream`` cancels this generator when one runs out).

        Raises:
            HttpStatusError: a non-2xx answer (read in full).
            HttpStreamError: an event carried an ``error`` object.
            HttpPostError: any other of its kinds; the stream cut short mid-event is an
                ``HttpProtocolError`` or ``HttpConnectionError``.
        """
        shown = self.shown + path
        url = self._url(path)
        headers = {**self._with(idempotency_key), "Accept": "text/event-stream"}
        try:
            try:
                response = await self._pooled().post(
                    url,
                    data=content,
                    headers=headers,
                    timeout=self._timeout(None),
                    proxy_headers=self._proxy_headers,
                    allow_redirects=False,
                )
            except _STALE as exc:
                if not _stale(exc):
                    raise
                self.stale_retries += 1
                response = await self._fresh_session().post(
                    url,
                    data=content,
                    headers=headers,
                    timeout=self._timeout(None),
                    proxy_headers=self._proxy_headers,
                    allow_redirects=False,
                )
            async with response:
                if not 200 <= response.status < 300:
                    body = await response.read()
                    raise HttpStatusError(
                        shown,
                        response.status,
                        {name.lower(): value for name, value in response.headers.items()},
                        body,
                    )
                async for event in _events(response, shown):
                    yield event
        except HttpPostError:
            raise
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise _named(exc, shown) from exc

    async def get(self, path: str, timeout: float, max_bytes: int) -> bytes | None:
        """GET ``path`` (absolute, on the base URL's scheme and host: llama.cpp serves
        ``/props`` beside ``/v1``), with the target's headers, no redirect followed; the
        body of a 200 answer of at most ``max_bytes``, else ``None``.

        For what a server says of itself (``sim.llm.capacity``): a failure of any kind is
        an answer of ``None``, never an error."""
        parts = urllib.parse.urlsplit(self._base)
        url = URL(urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", "")))
        try:
            async with self._pooled().get(
                url,
                headers=self._headers,
                timeout=self._timeout(timeout),
                proxy_headers=self._proxy_headers,
                allow_redirects=False,
            ) as response:
                if response.status != 200:
                    return None
                body = await response.content.read(max_bytes + 1)
                return body if len(body) <= max_bytes else None
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None

    async def aclose(self) -> None:
        """Close the connections (on the loop that used them)."""
        if self._loop is asyncio.get_running_loop():
            for session in (self._session, self._fresh):
                if session is not None and not session.closed:
                    await session.close()
        self._session = self._fresh = None


async def _events(response: aiohttp.ClientResponse, shown: str) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of a server-sent event stream, read as the OpenAI SDK reads them:
    ``data:`` lines joined per event, ``[DONE]`` ends it, an event whose data has an
    ``error`` object raises it. Lines are split here (aiohttp's ``readline`` refuses a line
    over 128 KiB, and a Responses API stream's last event holds the whole answer)."""
    event: str | None = None
    data: list[bytes] = []
    pending = b""
    try:
        async for chunk in response.content.iter_any():
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = raw.rstrip(b"\r")
                if line:
                    name, _, value = line.partition(b":")
                    value = value.removeprefix(b" ")
                    if name == b"data":
                        data.append(value)
                    elif name == b"event":
                        event = value.decode("utf-8", errors="replace")
                    continue
                if not data:
                    event = None
                    continue
                joined = b"\n".join(data)
                data = []
                kind, event = event, None
                if joined.startswith(b"[DONE]"):
                    return
                parsed = _event(joined, kind, shown)
                if parsed is not None:
                    yield parsed
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, OSError) as exc:
        raise HttpStreamCutError(shown, str(exc) or type(exc).__name__) from exc


def _event(joined: bytes, kind: str | None, shown: str) -> dict[str, Any] | None:
    try:
        parsed = orjson.loads(joined)
    except orjson.JSONDecodeError as exc:
        raise HttpProtocolError(shown, f"a stream event is not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        return None
    problem = parsed.get("error")
    if problem and (kind is None or kind == "error" or kind.startswith("response.")):
        detail = problem.get("message") if isinstance(problem, dict) else None
        raise HttpStreamError(shown, str(detail or ""), problem)
    return parsed
