"""``Route``: POSTs and server-sent event streams to one ``Target`` on an aiohttp session
of keep-alive connections, and the other requests of an API (``request``: files,
batches, stored responses); see the package's doc for what it adds to aiohttp."""

from __future__ import annotations

import asyncio
import ssl
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from yarl import URL

from sim.llm.errors import LLMConfigurationError
from sim.providers.http.errors import (
    STALE_FAILURES,
    HttpProtocolError,
    HttpStatusError,
    HttpStreamCutError,
    HttpStreamError,
    failures_named,
    stale_connection,
)
from sim.providers.http.target import IDEMPOTENCY_HEADER, Target, environment_proxy, shown_url
from sim.providers.http.tls import shared_ssl_context

#: seconds an idle connection is kept for reuse (httpx's default)
KEEPALIVE_SECONDS = 5.0

#: concurrent connections per connection pool (per route): a run at high concurrency
#: spreads over several small pools, each call on the least busy (measured with httpx's
#: pool at 200 in flight, client CPU per call: pools of 200 ~2.9 ms, 64 ~2.2 ms, 32
#: ~2.0 ms, 16 ~2.0 ms; bench/RESULTS.md)
POOL_SIZE = 16


def pool_sizes(max_concurrency: int) -> tuple[int, int]:
    """(pools, connections each) for ``max_concurrency`` calls in flight: enough pools of
    at most ``POOL_SIZE`` connections."""
    count = max(1, -(-max_concurrency // POOL_SIZE))
    return count, -(-max_concurrency // count)


@dataclass(frozen=True, slots=True)
class Upload:
    """A file sent as a multipart form (``Route.request``): the form's plain ``fields``,
    then the file under ``field``."""

    filename: str
    data: bytes
    content_type: str = "application/octet-stream"
    field: str = "file"
    fields: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class WholeAnswer:
    """The answer to a streamed request that came as one JSON body, not as server-sent
    events: a provider replaying an idempotency key from its cache, or a server that does
    not stream, answers this way. ``body`` is the JSON object a plain call would get."""

    body: dict[str, Any]


def is_event_stream(content_type: str | None) -> bool:
    """Whether a 2xx answer's ``Content-Type`` says server-sent events: any type but a
    JSON one is read as events (a server may send none, or a bare ``text/plain``)."""
    kind = (content_type or "").partition(";")[0].strip().lower()
    return not (kind == "application/json" or kind.endswith("+json"))


def whole_answer(content: bytes, shown: str) -> WholeAnswer:
    """The JSON object a non-streamed answer to a streamed request holds.

    Raises:
        HttpProtocolError: the body is not a JSON object.
    """
    try:
        parsed = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise HttpProtocolError(
            shown, f"a JSON answer to a streamed request is not JSON: {exc}"
        ) from exc
    if not isinstance(parsed, dict):
        raise HttpProtocolError(shown, "a JSON answer to a streamed request is not an object")
    return WholeAnswer(parsed)


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
                f"base_url {shown_url(target.base_url)!r}: only http:// and https:// URLs are "
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
        self.shown = shown_url(target.base_url)
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
        #: the sessions by ``reuse``: the pooled one (keep-alive connections), and the one
        #: that opens a connection for each request (a stale connection's retry)
        self._sessions: dict[bool, aiohttp.ClientSession] = {}
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

    def _live(self, *, reuse: bool) -> aiohttp.ClientSession:
        """The open session of this kind (``_new_session``) on the running loop."""
        session = self._sessions.get(reuse)
        if session is None or session.closed or self._loop is not asyncio.get_running_loop():
            self._forget_other_loop()
            session = self._sessions[reuse] = self._new_session(reuse=reuse)
        return session

    def _pooled(self) -> aiohttp.ClientSession:
        return self._live(reuse=True)

    def _fresh_session(self) -> aiohttp.ClientSession:
        return self._live(reuse=False)

    def _forget_other_loop(self) -> None:
        """Sessions made on another loop (one that has ended) cannot be used or closed on
        this one: they are dropped, and new ones made here."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._sessions = {}
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
        with failures_named(shown):
            try:
                return await self._post_once(self._pooled(), url, content, headers, timeout, shown)
            except STALE_FAILURES as exc:
                if not stale_connection(exc):
                    raise
                # a keep-alive connection the server closed as the request went out: once
                # more, on a connection opened for it, within what is left of the deadline
                self.stale_retries += 1
                left = None if deadline is None else max(0.001, deadline - loop.time())
                return await self._post_once(
                    self._fresh_session(), url, content, headers, left, shown
                )

    async def _post_once(
        self,
        session: aiohttp.ClientSession,
        url: URL,
        content: bytes,
        headers: dict[str, str],
        timeout: float | None,
        shown: str,
    ) -> bytes:
        async with await self._send(session, "POST", url, content, headers, timeout) as response:
            body = await response.read()
            _check_status(response, body, shown)
            return body

    async def _send(
        self,
        session: aiohttp.ClientSession,
        method: str,
        url: URL,
        data: bytes | aiohttp.FormData | None,
        headers: dict[str, str],
        timeout: float | None,
    ) -> aiohttp.ClientResponse:
        """Send one request on ``session``, through the target's proxy; the answer's head."""
        return await session.request(
            method,
            url,
            data=data,
            headers=headers,
            timeout=self._timeout(timeout),
            proxy_headers=self._proxy_headers,
            allow_redirects=False,  # a redirect is an error status, never followed
        )

    async def stream(
        self, path: str, content: bytes, idempotency_key: str | None = None
    ) -> AsyncIterator[dict[str, Any] | WholeAnswer]:
        """POST ``content`` and yield the JSON events of the server-sent event stream that
        answers it, until ``[DONE]`` or the end of the stream; an answer whose
        ``Content-Type`` is JSON (a provider replaying the idempotency key from its cache
        answers so) is read whole and yielded as one ``WholeAnswer``.

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
        with failures_named(shown):
            try:
                response = await self._send(self._pooled(), "POST", url, content, headers, None)
            except STALE_FAILURES as exc:
                if not stale_connection(exc):
                    raise
                self.stale_retries += 1
                response = await self._send(
                    self._fresh_session(), "POST", url, content, headers, None
                )
            async with response:
                if not 200 <= response.status < 300:
                    _check_status(response, await response.read(), shown)
                if not is_event_stream(response.headers.get("Content-Type")):
                    yield whole_answer(await response.read(), shown)
                    return
                async for event in _events(response, shown):
                    yield event

    async def request(
        self,
        method: str,
        path: str,
        timeout: float | None,
        *,
        content: bytes | None = None,
        upload: Upload | None = None,
    ) -> bytes:
        """A request besides a call (the Batch API's files and batches, a stored response
        read or deleted): ``method`` to ``path`` under the base URL, with the target's
        headers and ``content`` (JSON) or ``upload`` (a multipart form), on the pooled
        connections, no redirect followed; the body of a 2xx answer.

        Raises:
            HttpPostError: one of its kinds, as ``post`` raises them.
        """
        shown = self.shown + path
        headers = self._headers
        data: bytes | aiohttp.FormData | None = content
        if upload is not None:
            # the form's own Content-Type (with its boundary), not the target's JSON one
            headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
            form = aiohttp.FormData()
            for name, value in upload.fields:
                form.add_field(name, value)
            form.add_field(
                upload.field,
                upload.data,
                filename=upload.filename,
                content_type=upload.content_type,
            )
            data = form
        with failures_named(shown):
            async with await self._send(
                self._pooled(), method, self._url(path), data, headers, timeout
            ) as response:
                body = await response.read()
                _check_status(response, body, shown)
                return body

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

    @property
    def open(self) -> bool:
        """Whether it holds a session (connections may be open): until ``aclose``."""
        return any(not s.closed for s in self._sessions.values())

    async def aclose(self) -> None:
        """Close the connections (on the loop that used them)."""
        if self._loop is asyncio.get_running_loop():
            for session in self._sessions.values():
                if not session.closed:
                    await session.close()
        self._sessions = {}


def _check_status(response: aiohttp.ClientResponse, body: bytes, shown: str) -> None:
    """Raise ``HttpStatusError`` for an answer that is not 2xx (``body``: what it said)."""
    if not 200 <= response.status < 300:
        raise HttpStatusError(
            shown,
            response.status,
            {name.lower(): value for name, value in response.headers.items()},
            body,
        )


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
