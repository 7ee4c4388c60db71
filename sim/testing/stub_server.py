"""A loopback OpenAI-compatible server with fault injection, for tests and free rehearsals.

Endpoints (under ``/v1``): ``POST /responses`` (``previous_response_id`` as OpenAI
documents it: the model sees the whole chain), ``GET``/``DELETE /responses/{id}`` (404 after
delete or when ``store`` was false), ``POST /chat/completions`` (``response_format`` and
``tools``). Answers come from the offline engine, from the request's schema or tools.

Control: ``GET /stub/stats`` (requests and tokens served: what a real provider would have
billed), ``POST /stub/reset``, ``POST /stub/faults`` (``{"script": [...], "fault_rate": x,
"model_faults": {model: fault}}``). In-process users set the same on ``StubServer``, and
can also ``hold`` the generation requests a predicate picks until ``release``: a test holds
one client's call open (to kill it mid-call, say) however loaded the machine is.

Server flavours: ``reject_json_schema`` answers ``response_format: {"type": "json_schema"}``
exactly as llama-cpp-python's server does (HTTP 500, a validation error naming
``response_format.type``) and takes ``{"type": "json_object", "schema": ...}`` instead;
``slots=1`` generates one request at a time and queues the others, like a single-slot local
server; ``capacity_report`` answers how a local server reports that capacity (llama.cpp's
``/props`` and ``/slots``, llama-cpp-python's ``/openapi.json``; counted as ``probes``, not
billed ``requests``); a Responses bridge: ``reject_json_schema`` also refuses
``text.format`` ``json_schema`` (and takes ``json_object`` with a ``schema``),
``ignore_previous_response_id`` drops the chain, ``delete_not_found`` answers every
delete 404 and ``null_usage`` sends ``usage: null`` (llama-stack's quirks);
``POST /embeddings`` answers OpenAI's format with a deterministic vector per text
(``stub_embedding``: words hashed onto ``EMBEDDING_DIMENSIONS`` axes; a test may set
``StubServer.embedding`` to its own, and fail the next ones with ``embedding_faults``);
``stream: true`` is answered with server-sent events (chat chunks, with ``usage`` when
``stream_options.include_usage`` asks, or Responses events), ``stream_chunk_delay`` apart.

Faults: ``rate_limit`` (429 with retry-after), ``server_error`` (500), ``hang`` (past the
client's timeout), ``stall`` (a stream that stops after its first event; otherwise a
hang), ``malformed`` (invalid JSON output), ``raw_newline`` (a raw line break inside a
JSON string, as small models write one), ``refusal``, ``incomplete``,
``insufficient_quota`` (429), ``auth`` (401), ``forbidden`` (403), ``context_length``
(400), ``bad_request`` (400 for a parameter), ``model_not_found`` (404), ``bad_gateway``
(502 with a body that is not JSON, as a proxy in front of a model server sends),
``unknown_tool``, ``empty`` (``200 {}``: a body with no answer in it), ``wrong_ids`` (a
schema-valid answer whose references name nothing in the world: a target ``"place"``,
outcomes for characters ``"1"`` and ``"2"``, a move to ``"nowhere"``, as a small model
writes them; ``stub_model.wrong_ids``).

A generation request carrying an ``Idempotency-Key`` it has already answered gets the same
answer back without being generated or billed again (``replayed`` in the stats), as a
provider with idempotent requests would do: as one JSON body, even to a request that asked
for a stream (a client must read the reply's ``Content-Type``).

Built on asyncio streams with HTTP/1.1 keep-alive, so one process serves hundreds of
concurrent connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import re
import ssl as ssl_module
import threading
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from sim.testing.batch_routes import PREFIXES as BATCH_PREFIXES
from sim.testing.batch_routes import BatchRoutes
from sim.testing.stub_model import (
    ANSWER_FAULTS,
    Ask,
    Json,
    Pair,
    StubAnswer,
    answer,
    chat_body,
    chat_chunks,
    error_body,
    response_body,
    responses_events,
    split_messages,
)

FAULTS = (
    "rate_limit",
    "server_error",
    "hang",
    "malformed",
    "raw_newline",
    "refusal",
    "incomplete",
    "insufficient_quota",
    "auth",
    "context_length",
    "unknown_tool",
    "stall",
    "forbidden",
    "model_not_found",
    "bad_gateway",
    "bad_request",
    "empty",
    "wrong_ids",
)
#: what ``fault_rate`` draws from unless told otherwise
RANDOM_FAULTS = ("rate_limit", "server_error", "hang", "malformed", "refusal", "incomplete")
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
}
_GENERATION = ("/v1/responses", "/v1/chat/completions")
#: where servers report their capacity (``sim.providers._capacity``): answered by
#: ``capacity_report``, counted as ``probes``, not as billable ``requests``
CAPACITY_PATHS = ("/props", "/slots", "/openapi.json")
#: llama-cpp-python 0.3's answer to ``response_format: {"type": "json_schema"}`` (its
#: pydantic request model allows only "text" and "json_object"), captured from the server
LLAMA_CPP_JSON_SCHEMA_ERROR = (
    "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', "
    "'type'), 'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema', "
    "'ctx': {'expected': \"'text' or 'json_object'\"}}\n\n  File \"llama_cpp/server/app.py\", "
    "line 376, in create_chat_completion\n    POST /v1/chat/completions"
)


@dataclass(slots=True)
class _Stream:
    """A streamed answer: the events to send (``event`` name, data), in order."""

    events: list[tuple[str | None, Json]]
    done_marker: bool
    stall: bool = False
    #: seconds between its events
    delay: float = 0.0


@dataclass
class StubOptions:
    """How the stub behaves.

    Attributes:
        latency: seconds before each answer.
        latency_jitter: extra uniform random latency in ``[0, latency_jitter]``.
        fault_rate: probability that a generation request gets a random fault.
        faults: the faults ``fault_rate`` draws from.
        retry_after: seconds sent in ``retry-after-ms`` / ``retry-after`` with a 429
            (``None``: no header, the client backs off on its own).
        hang_seconds: how long a ``hang`` holds the request (set past the client timeout).
        seed: randomness of faults, latency and answers.
        reject_json_schema: answer chat ``response_format`` json_schema as
            llama-cpp-python does (HTTP 500 naming ``response_format.type``).
        slots: generation requests served at once, the rest queued (0: no limit).
        stream_chunk_delay: seconds between the events of a streamed answer.
        slow_stream_field: with a name, only the streamed answers whose requested JSON
            schema has a top-level property of that name wait ``stream_chunk_delay``
            between events (one phase streamed slowly, the others at full speed).
        stream_usage: honour ``stream_options.include_usage`` (llama-cpp-python does not).
        batch_delay: seconds a Batch API batch stays ``in_progress`` (``batch_routes``).
        capacity_report, ignore_previous_response_id, delete_not_found, null_usage:
            local servers and Responses bridges (see each field).
    """

    latency: float = 0.0
    latency_jitter: float = 0.0
    fault_rate: float = 0.0
    faults: tuple[str, ...] = RANDOM_FAULTS
    retry_after: float | None = 0.01
    hang_seconds: float = 600.0
    seed: int = 0
    reject_json_schema: bool = False
    slots: int = 0
    stream_chunk_delay: float = 0.0
    slow_stream_field: str | None = None
    stream_usage: bool = True
    batch_delay: float = 0.0
    # -- local servers and bridges (issue 25: a local server used well) ------------------
    #: how the server reports its capacity (``slots``, or 1): ``"props"``: llama.cpp's
    #: ``GET /props`` (``total_slots``) and ``GET /slots``; ``"slots"``: only ``/slots``;
    #: ``"llama-cpp-python"``: only ``GET /openapi.json`` titled as llama-cpp-python's
    #: (which serves one request at a time); ``""``: nothing (404)
    capacity_report: str = ""
    #: answer Responses calls as a bridge that ignores ``previous_response_id`` does: the
    #: model sees only the request's own input (no error, no chain)
    ignore_previous_response_id: bool = False
    #: answer every ``DELETE /responses/{id}`` with 404, as a bridge that keeps nothing does
    delete_not_found: bool = False
    #: send ``usage: null`` in Responses answers, as llama-stack does
    null_usage: bool = False
    #: take a Responses ``json_object`` text format and drop its ``schema``, as llama-stack
    #: 0.7.3 does (the model then answers without the schema: in prose, here)
    drop_json_object_schema: bool = False


#: the HTTP error each transport-level fault answers with, in OpenAI's wording:
#: (status, message, type, code, param)
_HTTP_FAULTS: dict[str, tuple[int, str, str, str | None, str | None]] = {
    "rate_limit": (
        429,
        "Rate limit reached, retry shortly",
        "requests",
        "rate_limit_exceeded",
        None,
    ),
    "insufficient_quota": (
        429,
        "You exceeded your current quota",
        "insufficient_quota",
        "insufficient_quota",
        None,
    ),
    "server_error": (500, "The server had an error", "server_error", None, None),
    "auth": (401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key", None),
    "forbidden": (
        403,
        "You are not allowed to sample from this model",
        "invalid_request_error",
        None,
        None,
    ),
    "model_not_found": (
        404,
        "The model does not exist or you do not have access to it.",
        "invalid_request_error",
        "model_not_found",
        "model",
    ),
    "context_length": (
        400,
        "This model's maximum context length is 128 tokens",
        "invalid_request_error",
        "context_length_exceeded",
        "input",
    ),
    "bad_request": (
        400,
        "Unsupported value: 'temperature' does not support this value with this model",
        "invalid_request_error",
        "unsupported_value",
        "temperature",
    ),
}

#: how many answers the server keeps for Idempotency-Key replays
_IDEMPOTENCY_CACHE = 100_000


@dataclass
class StubStats:
    """Counters a test reads to prove what was paid for."""

    requests: int = 0
    connections: int = 0
    generations: int = 0
    #: requests answered from the idempotency cache (not generated, not billed)
    replayed: int = 0
    #: generation requests received and not yet answered (a test waits on this instead of
    #: sleeping: after a client is killed, its requests still finish server-side)
    in_flight: int = 0
    #: generation requests waiting at a ``hold`` (a test waits on this before acting)
    held: int = 0
    #: capacity questions (``GET /props``, ``/slots``, ``/openapi.json``): not billed
    probes: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    by_route: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    models: Counter[str] = field(default_factory=Counter)
    #: generation requests received, and generated (billed), per Idempotency-Key: a test
    #: over several servers proves no call was paid twice and a moved call kept its key
    received_keys: Counter[str] = field(default_factory=Counter)
    generated_keys: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> Json:
        return {
            "requests": self.requests,
            "connections": self.connections,
            "generations": self.generations,
            "replayed": self.replayed,
            "in_flight": self.in_flight,
            "held": self.held,
            "probes": self.probes,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "by_route": dict(self.by_route),
            "faults": dict(self.faults),
            "models": dict(self.models),
            "keys_generated_twice": sum(1 for n in self.generated_keys.values() if n > 1),
        }


@dataclass(slots=True)
class _Stored:
    body: Json
    pairs: tuple[Pair, ...]  # the whole chain up to and including this response


@dataclass
class _Hold:
    """Generation requests ``when`` picks wait until ``released`` is set."""

    when: Callable[[Json], bool]
    released: threading.Event = field(default_factory=threading.Event)


#: the body of ``bad_gateway``: a proxy's HTML page, not JSON
BAD_GATEWAY_BODY = b"<html><body><h1>502 Bad Gateway</h1></body></html>"


#: how many numbers a stub embedding has
EMBEDDING_DIMENSIONS = 64


def stub_embedding(text: str) -> list[float]:
    """A deterministic embedding: each word of the text (lower case) adds one to an axis
    of ``EMBEDDING_DIMENSIONS``, chosen by a stable hash (BLAKE2b), with a sign from it;
    texts that share words point alike. A text without words gets the first axis."""
    vector = [0.0] * EMBEDDING_DIMENSIONS
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        value = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big")
        vector[value % EMBEDDING_DIMENSIONS] += 1.0 if value >> 63 else -1.0
    if not any(vector):
        vector[0] = 1.0
    return vector


class _HTTPError(Exception):
    def __init__(
        self, status: int, body: Json | bytes, headers: dict[str, str] | None = None
    ) -> None:
        self.status, self.body, self.headers = status, body, headers or {}


async def read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes]:
    """One HTTP/1.1 request off ``reader``: its method, target, headers (lower-cased names)
    and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length") or 0)
    body = await reader.readexactly(length) if length else b""
    return method, target, headers, body


def sse_frames(events: list[tuple[str | None, Json]], done_marker: bool) -> list[str]:
    """Server-sent event frames, one per ``(event name, data)``, and ``[DONE]`` last when
    ``done_marker``."""
    frames = [
        (f"event: {name}\n" if name else "") + f"data: {orjson.dumps(data).decode()}\n\n"
        for name, data in events
    ]
    if done_marker:
        frames.append("data: [DONE]\n\n")
    return frames


async def close_server(server: asyncio.Server | None, tasks: set[asyncio.Task[None]]) -> None:
    """Stop listening and end every open connection's task."""
    if server is not None:
        server.close()
    for task in list(tasks):
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


#: how a client ends a connection: it goes away, or sends what is not HTTP/1.1
CLIENT_GONE: tuple[type[Exception], ...] = (
    asyncio.IncompleteReadError,
    asyncio.LimitOverrunError,
    ConnectionError,
)


@contextlib.contextmanager
def client_connection(
    tasks: set[asyncio.Task[None]],
    writer: asyncio.StreamWriter,
    quiet: tuple[type[Exception], ...] = CLIENT_GONE,
) -> Iterator[None]:
    """Around one connection's handling: its task in ``tasks`` (for ``close_server`` to
    end) while it lasts, ``quiet`` (a client gone) and a shutdown ending it without a
    word, the writer closed last."""
    task = asyncio.current_task()
    if task is not None:
        tasks.add(task)
    try:
        yield
    except quiet:
        pass
    except asyncio.CancelledError:  # shutdown: end this connection quietly
        pass
    finally:
        if task is not None:
            tasks.discard(task)
        with contextlib.suppress(Exception):
            writer.close()


class StubServer:
    """The server; ``start``/``close`` on a running loop, or ``ServerThread`` for tests."""

    #: answers OpenAI's files and batches routes (``batch_routes``)
    batch_api: ClassVar[bool] = True

    def __init__(self, options: StubOptions | None = None) -> None:
        self.options = options or StubOptions()
        self.stats = StubStats()
        self.script: deque[str | None] = deque()
        self.model_faults: dict[str, str] = {}
        self.responses: dict[str, _Stored] = {}
        #: the last generation request bodies, oldest first (for tests to inspect)
        self.log: deque[Json] = deque(maxlen=1000)
        #: the embeddings request bodies, oldest first, and the vector of a text
        self.embedding_log: deque[Json] = deque(maxlen=1000)
        self.embedding: Callable[[str], list[float]] = stub_embedding
        #: faults for the next embeddings requests: an HTTP fault's name (``rate_limit``,
        #: ``server_error``, ``auth``...)
        self.embedding_faults: deque[str] = deque()
        self._rng = random.Random(f"sim-stub:{self.options.seed}")
        self._prefixes: set[tuple[str, str]] = set()
        #: answers by Idempotency-Key, oldest first (a bounded cache, as providers keep)
        self._answered: OrderedDict[str, Json] = OrderedDict()
        self._hold: _Hold | None = None
        self._server: asyncio.Server | None = None
        self._slots = asyncio.Semaphore(self.options.slots) if self.options.slots > 0 else None
        #: generation requests being answered right now, and the most at once (slots tests)
        self.active = 0
        self.peak_active = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        self.scheme = "http"
        #: the Batch API: files and batches (``sim.testing.batch_routes``)
        self.batches = BatchRoutes(self, self.options.batch_delay)

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/v1"

    def enqueue(self, *faults: str | None) -> None:
        """Faults for the next generation requests, in order (``None``: answer normally)."""
        for fault in faults:
            if fault is not None and fault not in FAULTS:
                raise ValueError(f"unknown fault {fault!r}; expected one of {FAULTS}")
            self.script.append(fault)

    def hold(self, when: Callable[[Json], bool]) -> None:
        """Hold every generation request whose body ``when`` accepts until ``release``.

        ``when`` runs on the server's event loop, once per request as it arrives; a held
        request is counted in ``stats.held`` and ``stats.in_flight``, then answered normally
        once released (or dropped if its client is gone). Replaces any earlier hold.
        """
        self.release()
        self._hold = _Hold(when)

    def release(self) -> None:
        """Let the held requests go on, and hold no more (callable from any thread)."""
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.released.set()

    async def _wait_if_held(self, request: Json) -> None:
        hold = self._hold
        if hold is None or not hold.when(request):
            return
        stats = self.stats  # the counters it was held in, even across a reset
        stats.held += 1
        try:
            while not hold.released.is_set():  # set from another thread: polled
                await asyncio.sleep(0.01)
        finally:
            stats.held -= 1

    def reset(self) -> None:
        self.release()
        self.stats = StubStats()
        self._answered.clear()
        self.script.clear()
        self.model_faults.clear()
        self.log.clear()
        self.batches.reset()

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, ssl: ssl_module.SSLContext | None = None
    ) -> int:
        """Listen on ``host:port`` (0: any free port); with ``ssl``, as an https server."""
        self._server = await asyncio.start_server(
            self._connection, host, port, backlog=1024, ssl=ssl
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.scheme = "https" if ssl is not None else "http"
        return self.port

    async def close(self) -> None:
        await close_server(self._server, self._tasks)

    async def serve_forever(
        self, host: str = "127.0.0.1", port: int = 0, ssl: ssl_module.SSLContext | None = None
    ) -> None:
        await self.start(host, port, ssl)
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    # ------------------------------------------------------------------ HTTP

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        with client_connection(self._tasks, writer, (*CLIENT_GONE, ValueError)):
            while True:
                method, target, headers, body = await read_request(reader)
                path = target.split("?")[0]
                slot = (
                    self._slots
                    if self._slots is not None and method == "POST" and path in _GENERATION
                    else contextlib.nullcontext()
                )
                async with slot:
                    if self.batch_api and path.startswith(BATCH_PREFIXES):
                        # the Batch API: multipart uploads in, raw files out
                        self.stats.requests += 1
                        self.stats.by_route[f"{method} {path.split('/')[2]}"] += 1
                        content_type = headers.get("content-type", "")
                        status, payload = await self.batches.handle(
                            method, path, body, content_type
                        )
                        extra: dict[str, str] = {}
                    else:
                        status, payload, extra = await self._dispatch(
                            method, path, body, headers.get("idempotency-key")
                        )
                    if isinstance(payload, _Stream):
                        await self._write_stream(writer, payload)
                        if headers.get("connection", "").lower() == "close":
                            break
                        continue
                data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
                head_out = [
                    f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
                    "content-type: application/json",
                    f"content-length: {len(data)}",
                ]
                head_out += [f"{k}: {v}" for k, v in extra.items()]
                writer.write(("\r\n".join(head_out) + "\r\n\r\n").encode() + data)
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break

    async def _write_stream(self, writer: asyncio.StreamWriter, stream: _Stream) -> None:
        """Server-sent events in chunked transfer encoding (the connection stays open)."""
        head = (
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            "cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        writer.write(head.encode())
        frames = sse_frames(stream.events, stream.done_marker)
        delay = stream.delay
        for index, frame in enumerate(frames):
            if index and delay > 0:
                await asyncio.sleep(delay)
            raw = frame.encode()
            writer.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            await writer.drain()
            if stream.stall:
                await asyncio.sleep(self.options.hang_seconds)
                return
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _dispatch(
        self, method: str, path: str, body: bytes, idempotency_key: str | None = None
    ) -> tuple[int, Any, dict[str, str]]:
        """Count the request, parse its JSON body and answer it; errors as HTTP answers."""
        if path not in CAPACITY_PATHS:
            self.stats.requests += 1
            self.stats.by_route[f"{method} {path.split('/resp_')[0]}"] += 1
        try:
            request = orjson.loads(body) if body else {}
            return 200, await self._handle(method, path, request, idempotency_key), {}
        except _HTTPError as exc:
            return exc.status, exc.body, exc.headers
        except orjson.JSONDecodeError:
            return 400, self._not_json(), {}

    def _not_json(self) -> Json:
        """The error body for a request body that is not JSON, in this API's format."""
        return error_body("body is not JSON", "invalid_request_error", None)

    async def _handle(
        self, method: str, path: str, request: Json, idempotency_key: str | None
    ) -> Any:
        """The answer to one parsed request (an ``_HTTPError`` for an error answer)."""
        if method == "POST" and path in ("/v1/responses", "/v1/chat/completions"):
            self.log.append(request)
            if idempotency_key is not None:
                self.stats.received_keys[idempotency_key] += 1
            if idempotency_key is not None and idempotency_key in self._answered:
                # the same attempt sent again (after a crash or a client timeout):
                # answered from the cache, not generated or billed a second time
                self.stats.replayed += 1
                return self._answered[idempotency_key]
            self.stats.in_flight += 1
            self.active += 1
            self.peak_active = max(self.peak_active, self.active)
            try:
                await self._wait_if_held(request)
                if path == "/v1/responses":
                    payload = await self._responses(request)
                else:
                    payload = await self._chat(request)
            finally:
                self.stats.in_flight -= 1
                self.active -= 1
            stall = bool(payload.pop("_stub_stall", False))
            if idempotency_key is not None:
                self.stats.generated_keys[idempotency_key] += 1
                self._answered[idempotency_key] = payload
                if len(self._answered) > _IDEMPOTENCY_CACHE:
                    self._answered.popitem(last=False)
            if request.get("stream"):
                return self._stream(path, request, payload, stall)
            return payload
        if method == "POST" and path == "/v1/embeddings":
            return self._embeddings(request)
        if path.startswith("/v1/responses/") and method in ("GET", "DELETE"):
            return self._stored(method, path.rsplit("/", 1)[1])
        if method == "GET" and path in CAPACITY_PATHS:
            return self._capacity(path)
        if path.startswith("/stub/"):
            return self._control(method, path, request)
        raise _HTTPError(
            404, error_body(f"no route {method} {path}", "invalid_request_error", "not_found")
        )

    async def generate(self, path: str, request: Json) -> tuple[int, Json]:
        """Answer one generation request as if it had been posted to ``path``: status and
        body (a Batch API line, ``batch_routes``). Faults, model and counters are the live
        path's."""
        self.log.append(request)
        try:
            if path == "/v1/responses":
                return 200, await self._responses(request)
            return 200, await self._chat(request)
        except _HTTPError as exc:
            if isinstance(exc.body, bytes):  # a batch line's body is JSON: the text wrapped
                text = exc.body.decode("utf-8", errors="replace")
                return exc.status, error_body(text, "server_error", None)
            return exc.status, exc.body

    def _embeddings(self, request: Json) -> Json:
        """OpenAI's embeddings answer: ``data[i].embedding`` for ``input[i]`` (a string
        input is one text); ``usage.prompt_tokens`` counts the texts' words."""
        texts = request.get("input")
        if isinstance(texts, str):
            texts = [texts]
        model = request.get("model")
        if not isinstance(model, str) or not model:
            raise _HTTPError(400, error_body("model is required", "invalid_request_error", None))
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise _HTTPError(
                400, error_body("input must be a list of strings", "invalid_request_error", None)
            )
        self.embedding_log.append(request)
        fault = self.embedding_faults.popleft() if self.embedding_faults else None
        if fault is not None:
            self.stats.faults[fault] += 1
            status, message, type_, code, param = _HTTP_FAULTS[fault]
            raise _HTTPError(status, error_body(message, type_, code, param), {"retry-after": "0"})
        tokens = sum(max(1, len(t.split())) for t in texts)
        self.stats.input_tokens += tokens
        data = [
            {"object": "embedding", "index": i, "embedding": self.embedding(t)}
            for i, t in enumerate(texts)
        ]
        return {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def _control(self, method: str, path: str, request: Json) -> Any:
        if path == "/stub/stats":
            return self.stats.to_dict()
        if path == "/stub/reset" and method == "POST":
            self.reset()
            return {"ok": True}
        if path == "/stub/faults" and method == "POST":
            self.enqueue(*request.get("script", []))
            if "fault_rate" in request:
                self.options.fault_rate = float(request["fault_rate"])
            self.model_faults.update(request.get("model_faults", {}))
            return {"ok": True}
        raise _HTTPError(404, error_body(f"no route {path}", "invalid_request_error", None))

    # ------------------------------------------------------------------ faults

    def _fault(self, model: str) -> str | None:
        if self.script:
            return self.script.popleft()
        fault = self.model_faults.get(model)
        if fault is not None:
            return fault
        opts = self.options
        if opts.fault_rate and self._rng.random() < opts.fault_rate:
            return self._rng.choice(opts.faults)
        return None

    async def _delay_and_fault(self, model: str) -> str | None:
        """Count the model, wait the configured latency and pick (and count) its fault.

        Shared by every API's prelude: what the fault then does is the API's own.
        """
        self.stats.models[model] += 1
        fault = self._fault(model)
        opts = self.options
        delay = opts.latency + (
            self._rng.uniform(0, opts.latency_jitter) if opts.latency_jitter else 0.0
        )
        if delay > 0:
            await asyncio.sleep(delay)
        if fault is not None:
            self.stats.faults[fault] += 1
        return fault

    async def _prelude(self, model: str, stream: bool = False) -> str | None:
        """Latency and transport-level faults; returns an answer-level fault, if any."""
        fault = await self._delay_and_fault(model)
        if fault is None:
            return None
        opts = self.options
        if fault == "stall" and stream:
            return fault
        if fault in ("hang", "stall"):
            await asyncio.sleep(opts.hang_seconds)
            raise _HTTPError(500, error_body("hung", "server_error", None))
        if fault == "bad_gateway":
            raise _HTTPError(502, BAD_GATEWAY_BODY)
        if fault == "empty":  # a server (or bridge) that answers with nothing in the body
            raise _HTTPError(200, {})
        http_fault = _HTTP_FAULTS.get(fault)
        if http_fault is not None:
            status, message, type_, code, param = http_fault
            headers = {}
            if fault == "rate_limit" and opts.retry_after is not None:
                headers = {
                    "retry-after-ms": f"{opts.retry_after * 1000:g}",
                    "retry-after": f"{opts.retry_after:g}",
                }
            raise _HTTPError(status, error_body(message, type_, code, param), headers)
        return fault if fault in ANSWER_FAULTS else None

    def _answer(self, ask: Ask) -> StubAnswer:
        """The stub model's answer (an instructions prefix seen before is cached), counted."""
        prefix = (ask.model, ask.instructions)
        cached = prefix in self._prefixes
        self._prefixes.add(prefix)
        ans = answer(ask, seed=self.options.seed, cached_prefix=cached)
        self.stats.generations += 1
        self.stats.input_tokens += ans.input_tokens
        self.stats.output_tokens += ans.output_tokens
        self.stats.cached_tokens += ans.cached_tokens
        return ans

    # ------------------------------------------------------------------ endpoints

    async def _responses(self, request: Json) -> Json:
        model = str(request.get("model") or "stub")
        history: list[Pair] = []
        previous = request.get("previous_response_id")
        if self.options.ignore_previous_response_id:
            previous = None
        if previous:
            stored = self.responses.get(previous)
            if stored is None:
                raise _HTTPError(
                    400,
                    error_body(
                        f"Previous response with id '{previous}' not found.",
                        "invalid_request_error",
                        "previous_response_not_found",
                        "previous_response_id",
                    ),
                )
            history.extend(stored.pairs)
        fault = await self._prelude(model, bool(request.get("stream")))
        raw_input = request.get("input") or ""
        items = [raw_input] if isinstance(raw_input, str) else list(raw_input)
        _, pairs, input_text = split_messages(items)
        history.extend(pairs)
        fmt = (request.get("text") or {}).get("format") or {}
        self._bridge_rejects(fmt)
        schema = fmt.get("schema") if fmt.get("type") in ("json_schema", "json_object") else None
        if self.options.drop_json_object_schema and fmt.get("type") == "json_object":
            schema = None
        tools = request.get("tools") or None
        if request.get("tool_choice") == "none":  # tools declared but not to be called: text
            tools = None
        instructions = str(request.get("instructions") or "")
        spoil = None if fault == "stall" else fault
        ans = self._answer(Ask(model, instructions, history, input_text, schema, tools, spoil))
        rid = f"resp_{uuid.uuid4().hex}"
        store = request.get("store", True) is not False
        body = response_body(rid, model, request, ans, store)
        if self.options.null_usage:
            body["usage"] = None
        if fault == "stall":
            body["_stub_stall"] = True
        if store:
            output = ans.text if ans.call is None else orjson.dumps(ans.call[1]).decode()
            self.responses[rid] = _Stored(body, (*history, (input_text, output)))
        return body

    def _stored(self, method: str, rid: str) -> Json:
        stored = self.responses.get(rid)
        if stored is None or (method == "DELETE" and self.options.delete_not_found):
            raise _HTTPError(
                404,
                error_body(f"No response found with id '{rid}'.", "invalid_request_error", None),
            )
        if method == "DELETE":
            del self.responses[rid]
            return {"id": rid, "object": "response.deleted", "deleted": True}
        return stored.body

    # ------------------------------------------------------------------ local servers

    def _capacity(self, path: str) -> Any:
        """How many requests it serves at once, as the server flavour reports it
        (``capacity_report``); 404 where the flavour has no such route."""
        self.stats.probes += 1
        report = self.options.capacity_report
        slots = self.options.slots if self.options.slots > 0 else 1
        if path == "/props" and report == "props":
            return {
                "total_slots": slots,
                "default_generation_settings": {"n_ctx": 4096},
                "model_path": "stub.gguf",
            }
        if path == "/slots" and report in ("props", "slots"):
            return [{"id": i, "is_processing": False} for i in range(slots)]
        if path == "/openapi.json" and report == "llama-cpp-python":
            # llama-cpp-python 0.3's title, emoji and all
            return {"openapi": "3.1.0", "info": {"title": "\U0001f999 llama.cpp Python API"}}
        raise _HTTPError(404, {"detail": "Not Found"})

    def _bridge_rejects(self, fmt: Json) -> None:
        """A Responses bridge in front of llama-cpp-python passes ``json_schema`` on, and
        relays the server's refusal (``reject_json_schema``)."""
        if self.options.reject_json_schema and fmt.get("type") == "json_schema":
            message = LLAMA_CPP_JSON_SCHEMA_ERROR.replace("'response_format'", "'text', 'format'")
            raise _HTTPError(
                500,
                {
                    "error": {
                        "message": message,
                        "type": "internal_server_error",
                        "param": None,
                        "code": None,
                    }
                },
            )

    async def _chat(self, request: Json) -> Json:
        model = str(request.get("model") or "stub")
        fmt = request.get("response_format") or {}
        if self.options.reject_json_schema and fmt.get("type") not in (None, "text", "json_object"):
            raise _HTTPError(
                500,
                {
                    "error": {
                        "message": LLAMA_CPP_JSON_SCHEMA_ERROR.replace(
                            "'json_schema'", repr(fmt.get("type"))
                        ),
                        "type": "internal_server_error",
                        "param": None,
                        "code": None,
                    }
                },
            )
        fault = await self._prelude(model, bool(request.get("stream")))
        system, pairs, input_text = split_messages(request.get("messages") or [])
        schema = None
        if fmt.get("type") == "json_schema" and not self.options.reject_json_schema:
            schema = (fmt.get("json_schema") or {}).get("schema")
        elif fmt.get("type") == "json_object" and isinstance(fmt.get("schema"), dict):
            schema = fmt["schema"]  # llama-cpp-python's form
        tools = request.get("tools") or None
        if request.get("tool_choice") == "none":  # tools declared but not to be called: text
            tools = None
        spoil = None if fault == "stall" else fault
        ans = self._answer(Ask(model, system, pairs, input_text, schema, tools, spoil))
        body = chat_body(f"chatcmpl-{uuid.uuid4().hex}", model, ans)
        if fault == "stall":
            body["_stub_stall"] = True
        return body

    def _stream(self, path: str, request: Json, body: Json, stall: bool) -> _Stream:
        delay = self.options.stream_chunk_delay
        field = self.options.slow_stream_field
        if field is not None and field not in _schema_properties(request):
            delay = 0.0
        if path == "/v1/responses":
            return _Stream(responses_events(body), done_marker=False, stall=stall, delay=delay)
        include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        return _Stream(
            chat_chunks(body, include_usage and self.options.stream_usage),
            done_marker=True,
            stall=stall,
            delay=delay,
        )


def _schema_properties(request: Json) -> set[str]:
    """The top-level property names of the JSON schema a generation request asks for
    (chat's ``response_format``, in OpenAI's or llama-cpp-python's form, or Responses'
    ``text.format``); empty without one."""
    chat = request.get("response_format") or {}
    text = (request.get("text") or {}).get("format") or {}
    for schema in (
        (chat.get("json_schema") or {}).get("schema") if isinstance(chat, dict) else None,
        chat.get("schema") if isinstance(chat, dict) else None,
        text.get("schema") if isinstance(text, dict) else None,
    ):
        if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
            return set(schema["properties"])
    return set()


class ServerThread:
    """Run a ``StubServer`` on its own event loop in a daemon thread (pytest, notebooks).

    Usage (runs as a doctest in the test suite):

    >>> from openai import OpenAI
    >>> with ServerThread(StubServer()) as server:
    ...     client = OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    ...     answer = client.chat.completions.create(
    ...         model="stub-model", messages=[{"role": "user", "content": "Hello"}]
    ...     )
    ...     print(server.stats.generations, answer.choices[0].message.content)
    1 Understood.
    """

    def __init__(
        self,
        server: StubServer,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl: ssl_module.SSLContext | None = None,
    ) -> None:
        self.server = server
        self.host, self.port = host, port
        self.ssl = ssl
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-stub-server", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self.server.start(self.host, self.port, self.ssl))
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self.server.close())
        self._loop.close()

    def start(self) -> StubServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("stub server did not start")
        return self.server

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
