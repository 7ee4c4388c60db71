"""Streamed answers (``stream: true``): assembled into the same body a plain call returns.

Chat completions stream ``chat.completion.chunk`` objects (content, refusal and tool-call
argument deltas, then a ``finish_reason``, then, asked for with ``stream_options:
{"include_usage": true}``, a chunk holding only ``usage``); ``ChatAssembler`` rebuilds the
``chat.completion`` object from them. The Responses API streams typed events whose last
(``response.completed`` / ``response.incomplete`` / ``response.failed``) carries the whole
response; ``ResponsesAssembler`` keeps it and the text deltas seen before it.

``read_stream`` reads one stream under three clocks: the first event must arrive within the
first-token timeout (which therefore also covers time queued behind a busy server), each
later one within the idle timeout, and the whole call within the total. A timeout raises
``LLMTimeoutError`` whose context holds the partial text. A stream that ends before its
last event (no ``finish_reason`` in a chat stream, no final ``response.*`` event in a
Responses stream), or whose connection breaks mid-stream, was cut short: an
``LLMAPIError`` coded ``stream_cut``, retried as transient with the same idempotency key.

A streamed request may be answered with one JSON body instead of events: a provider that
honours idempotency keys replays a finished answer from its cache so (the attempt resumed
after a crash). The reply's ``Content-Type`` says which; a JSON one is read whole
(``http.WholeAnswer``) and handed to the assembler as the body a plain call gets
(``Assembler.whole``), so a resumed streamed call commits what an uninterrupted one does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from sim.llm.calls import CallIdentity, idempotency_key
from sim.llm.errors import LLMTimeoutError
from sim.llm.streaming import CallText
from sim.providers._openai_common import Connections
from sim.providers._openai_errors import stream_cut
from sim.providers.http import IDEMPOTENCY_HEADER, WholeAnswer, is_event_stream, whole_answer

Json = dict[str, Any]
#: called with each piece of answer text as it arrives
OnDelta = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class StreamTimeouts:
    """The clocks of one streamed call, in seconds (``None``: no limit)."""

    total: float | None = 600.0
    first_token: float | None = 300.0
    idle: float | None = 60.0


class Assembler(Protocol):
    def feed(self, event: Json) -> str:
        """Take one event; return the answer text it adds (may be empty)."""

    def whole(self, body: Json) -> str:
        """Take the whole answer, sent as one JSON body (not as events); return its
        text."""

    @property
    def partial(self) -> str: ...

    @property
    def complete(self) -> bool:
        """Whether the stream's last event arrived (else it was cut short)."""

    def result(self) -> Json: ...


@dataclass
class _ToolCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ChatAssembler:
    """Rebuilds a ``chat.completion`` object from its ``chat.completion.chunk`` stream."""

    def __init__(self) -> None:
        self.id = ""
        self.model = ""
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.tool_calls: dict[int, _ToolCall] = {}
        self.finish_reason: str | None = None
        self.usage: Json | None = None
        #: the answer sent whole (``whole``): the result as it came
        self.body: Json | None = None

    @property
    def partial(self) -> str:
        if self.body is not None:
            return _chat_text(self.body)
        if self.content:
            return "".join(self.content)
        return "".join("".join(call.arguments) for call in self.tool_calls.values())

    @property
    def complete(self) -> bool:
        return self.finish_reason is not None or self.body is not None

    def whole(self, body: Json) -> str:
        self.body = body
        return _chat_text(body)

    def feed(self, event: Json) -> str:
        self.id = self.id or str(event.get("id") or "")
        self.model = self.model or str(event.get("model") or "")
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        added: list[str] = []
        for choice in event.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(str(delta["content"]))
                added.append(str(delta["content"]))
            if delta.get("refusal"):
                self.refusal.append(str(delta["refusal"]))
            for piece in delta.get("tool_calls") or ():
                call = self.tool_calls.setdefault(int(piece.get("index") or 0), _ToolCall())
                call.id = call.id or str(piece.get("id") or "")
                function = piece.get("function") or {}
                call.name = call.name or str(function.get("name") or "")
                if function.get("arguments"):
                    call.arguments.append(str(function["arguments"]))
                    added.append(str(function["arguments"]))
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return "".join(added)

    def result(self) -> Json:
        if self.body is not None:
            return self.body
        message: Json = {
            "role": "assistant",
            "content": "".join(self.content) or None,
            "refusal": "".join(self.refusal) or None,
        }
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": "".join(call.arguments)},
                }
                for _, call in sorted(self.tool_calls.items())
            ]
        body: Json = {
            "id": self.id,
            "object": "chat.completion",
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
        }
        if self.usage is not None:
            body["usage"] = self.usage
        return body


def _chat_text(body: Json) -> str:
    """The text of a whole ``chat.completion`` body's first choice (its content, else its
    tool calls' arguments), as its stream would have sent it; ``""`` when there is none
    (the body is checked where it is read, ``answer``)."""
    choices = body.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str) and content:
        return content
    calls = message.get("tool_calls")
    return "".join(
        str(call["function"].get("arguments") or "")
        for call in (calls if isinstance(calls, list) else ())
        if isinstance(call, dict) and isinstance(call.get("function"), dict)
    )


def _responses_text(body: Json) -> str:
    """The text of a whole Responses API body (output text, else function call
    arguments), as its stream's deltas would have sent it."""
    texts: list[str] = []
    arguments: list[str] = []
    output = body.get("output")
    for item in output if isinstance(output, list) else ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call" and isinstance(item.get("arguments"), str):
            arguments.append(item["arguments"])
        content = item.get("content")
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and part.get("type") == "output_text":
                texts.append(str(part.get("text") or ""))
    return "".join(texts) or "".join(arguments)


_FINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")


class ResponsesAssembler:
    """Keeps the Responses API stream's final response and the text deltas before it."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.response: Json | None = None

    @property
    def partial(self) -> str:
        return "".join(self.text)

    @property
    def complete(self) -> bool:
        return self.response is not None

    def feed(self, event: Json) -> str:
        kind = event.get("type")
        if kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
            delta = str(event.get("delta") or "")
            self.text.append(delta)
            return delta
        if kind in _FINAL_EVENTS and isinstance(event.get("response"), dict):
            self.response = event["response"]
        elif kind == "error":
            self.response = {"status": "failed", "error": event}
        return ""

    def whole(self, body: Json) -> str:
        self.response = body
        text = _responses_text(body)
        self.text = [text]
        return text

    def result(self) -> Json:
        if self.response is None:  # ``read_stream`` checks ``complete`` first
            raise RuntimeError("the stream has no final response event")
        return self.response


class StreamTimeoutError(LLMTimeoutError):
    """A streamed call ran past one of its clocks; ``partial`` holds the text it had sent."""

    def __init__(self, message: str, *, partial: str = "", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.partial = partial


async def read_stream(
    open_stream: Callable[[], Any],
    assembler: Assembler,
    timeouts: StreamTimeouts,
    *,
    on_delta: OnDelta | None = None,
    model: str = "",
) -> Json:
    """Open a stream and read it to its end under ``timeouts``; the assembled body.

    Args:
        open_stream: a coroutine function returning an async iterator of JSON events, or
            of one ``WholeAnswer`` (``http.Route.stream``, or the SDK's ``AsyncStream``);
            its own errors pass through unchanged.
        assembler: where events go.
        timeouts: first-token, idle and total clocks.
        on_delta: called with each piece of answer text.
        model: named in timeout messages.

    Raises:
        StreamTimeoutError: a clock ran out (``code`` says which).
        LLMAPIError: the stream ended before its last event (``stream_cut``).
        asyncio.CancelledError: the caller interrupted the call (its text so far went to
            ``on_delta``).
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    total_deadline = None if timeouts.total is None else started + timeouts.total

    def deadline(span: float | None) -> float | None:
        ends = [
            t
            for t in (total_deadline, None if span is None else loop.time() + span)
            if t is not None
        ]
        return min(ends) if ends else None

    first = True
    code = "first_token_timeout"
    wall = time.perf_counter()
    try:
        async with asyncio.timeout_at(deadline(timeouts.first_token)) as clock:
            stream: AsyncIterator[Json | WholeAnswer] = await open_stream()
            try:
                async for event in stream:
                    if isinstance(event, WholeAnswer):
                        text = assembler.whole(event.body)
                    elif isinstance(event, dict):
                        text = assembler.feed(event)
                    else:
                        continue
                    if text and on_delta is not None:
                        on_delta(text)
                    if first:
                        first = False
                        code = "idle_timeout"
                    clock.reschedule(deadline(timeouts.idle))
            finally:
                close = getattr(stream, "aclose", None) or getattr(stream, "close", None)
                if close is not None:
                    await close()
    except TimeoutError as exc:
        waited = time.perf_counter() - wall
        if total_deadline is not None and loop.time() >= total_deadline - 1e-3:
            code, what = "timeout", f"the total timeout ({timeouts.total:g}s)"
        elif code == "first_token_timeout":
            what = f"no first token within {timeouts.first_token:g}s"
        else:
            what = f"no new token within {timeouts.idle:g}s"
        raise StreamTimeoutError(
            f"streamed request to {model or 'the model'} timed out: {what} (after {waited:.1f}s)",
            code=code,
            cause=exc,
            model=model or None,
            partial=assembler.partial,
        ) from exc
    if not assembler.complete:
        raise stream_cut(
            f"the stream ended before its last event ({len(assembler.partial)} characters "
            "of text received)",
            None,
            model,
        )
    return assembler.result()


async def _one(answer: WholeAnswer) -> AsyncIterator[Json | WholeAnswer]:
    """A stream of the one whole answer."""
    yield answer


async def post_stream(
    connections: Connections,
    path: str,
    payload: Json,
    assembler: Assembler,
    timeouts: StreamTimeouts,
    *,
    connect_timeout_seconds: float,
    model: str,
    call: CallIdentity | None = None,
    stream_to: CallText | None = None,
) -> Json:
    """POST ``payload`` with ``stream: true`` on the least busy route; the assembled body.

    A route reads the server-sent events itself (``http.Route.stream``); a client handed
    in reads them with the SDK's ``AsyncStream`` (whose errors are the SDK's, for the
    caller to map). Only connecting has a timeout of its own: the stream's clocks are
    ``read_stream``'s. Each piece of text goes to the call's ``stream_to``
    (``sim.llm.streaming``; ``None``: nowhere).
    """
    content = orjson.dumps({**payload, "stream": True})
    key = idempotency_key(call, content)  # the call's (``call``: ``None`` sends none)
    index = connections.acquire()
    route = connections.routes[index]

    async def open_stream() -> AsyncIterator[Json | WholeAnswer]:
        if route is not None:
            return route.stream(path, content, key)
        # loaded already: a client was handed in
        import httpx2
        import openai

        options: openai.RequestOptions = {
            "timeout": httpx2.Timeout(None, connect=connect_timeout_seconds)
        }
        if key is not None:
            options["headers"] = {IDEMPOTENCY_HEADER: key}
        stream: openai.AsyncStream[object] = await connections.client(index).post(
            path,
            cast_to=object,
            content=content,
            options=options,
            stream=True,
            stream_cls=openai.AsyncStream[object],
        )
        response = stream.response
        if is_event_stream(response.headers.get("content-type")):
            return stream  # type: ignore[return-value]
        try:
            shown = str(response.url).partition("?")[0]  # no query: never a secret
            return _one(whole_answer(await response.aread(), shown))
        finally:
            await response.aclose()

    on_delta = None
    if stream_to is not None:
        stream_to.restart()  # a retry streams the answer again from its start
        on_delta = stream_to.add
    try:
        return await read_stream(open_stream, assembler, timeouts, on_delta=on_delta, model=model)
    finally:
        connections.release(index)
