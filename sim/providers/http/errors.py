"""How a request failed, named: an answer with a status, no answer, the deadline, an
answer that is not valid HTTP, a certificate that did not verify, a stream cut short.
``named_failure`` turns aiohttp's exceptions into these."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import aiohttp


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
STALE_FAILURES = (
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientConnectionResetError,
    aiohttp.ClientOSError,
)


def stale_connection(exc: BaseException) -> bool:
    return isinstance(exc, STALE_FAILURES) and not isinstance(exc, aiohttp.ClientConnectorError)


@contextmanager
def failures_named(url: str) -> Iterator[None]:
    """Around a request to ``url``: an aiohttp, socket or timeout failure raised as its
    ``HttpPostError`` kind (``named_failure``); one of ours passes as it is."""
    try:
        yield
    except HttpPostError:
        raise
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise named_failure(exc, url) from exc


def named_failure(exc: BaseException, url: str) -> HttpPostError:
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
