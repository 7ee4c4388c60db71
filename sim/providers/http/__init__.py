"""The adapters' HTTP client, the only code that knows about connections: POSTs and
server-sent event streams on aiohttp.

``Route`` sends to one base URL (a ``Target``: URL, default query, headers with the key)
through an ``aiohttp.ClientSession`` it owns: a pool of keep-alive connections (at most
``size``), TLS verified with ``shared_ssl_context``, a proxy taken from the environment
when one applies (``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``, ``NO_PROXY`` honoured),
answers decoded whatever ``Content-Encoding`` (gzip, deflate) they come in. No SDK is
involved: the request is the body already serialized and the headers the SDK would send;
the answer is raw bytes (``post``) or the stream's JSON events (``stream``; a JSON answer
to a streamed request, as a provider replays a cached one, is yielded whole). The other
requests of an API (the Batch API's files and batches, a stored response read or
deleted) go through the same connections (``request``; a file as a multipart ``Upload``).

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
  for ``sim.providers._openai_errors``' table); no answer ``HttpConnectionError``; the deadline
  ``HttpTimeoutError``; an answer that is not valid HTTP (a header over the size limit,
  a body shorter or longer than its ``Content-Length``, broken chunking or compression)
  ``HttpProtocolError``; a certificate that does not verify ``HttpTLSError`` naming the
  host. A missing ``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` is an ``LLMConfigurationError``
  naming the variable and the path.

Its modules: ``target`` (where a request goes, headers, proxy), ``tls`` (the shared
verifying context), ``errors`` (the failures, named), ``route`` (the client, and how
many connection pools a run's concurrency gets: ``pool_sizes``) and ``sdk_pool`` (the
pools of the adapters that send through a vendor's SDK: ``gemini``, ``anthropic``).
"""

from __future__ import annotations

from sim.providers.http.errors import (
    HttpConnectionError,
    HttpPostError,
    HttpProtocolError,
    HttpStatusError,
    HttpStreamCutError,
    HttpStreamError,
    HttpTimeoutError,
    HttpTLSError,
)
from sim.providers.http.route import (
    POOL_SIZE,
    Route,
    Upload,
    WholeAnswer,
    is_event_stream,
    pool_sizes,
    whole_answer,
)
from sim.providers.http.target import IDEMPOTENCY_HEADER, Target, environment_proxy, merge_headers
from sim.providers.http.tls import shared_ssl_context

__all__ = [
    "IDEMPOTENCY_HEADER",
    "POOL_SIZE",
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
    "Upload",
    "WholeAnswer",
    "environment_proxy",
    "is_event_stream",
    "merge_headers",
    "pool_sizes",
    "shared_ssl_context",
    "whole_answer",
]
