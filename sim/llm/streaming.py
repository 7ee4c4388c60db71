"""Where streamed text goes while a call is in flight.

An adapter that streams calls ``emit_delta`` with each piece of answer text; it does not
know which phase or entity the call is for. The client opens a ``call_scope`` around every
call (phase, entity key), inside the call's own task, and the runner installs one
``StreamHub`` per tick. The hub forwards each piece to its sink (``sim tick --stream``
prints narratives as they are written) and keeps the text of the calls still in flight, so
an interrupted tick can log what each had written so far.

Everything here is a no-op when no hub is installed (tests, library use).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass(slots=True)
class CallText:
    """The text one in-flight call has streamed so far."""

    phase: str
    entity_key: str | None
    pieces: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """One piece of text of one call, as it arrived."""

    phase: str
    entity_key: str | None
    text: str
    #: the call starts its answer again (a retry): drop what it streamed before
    restart: bool = False


DeltaSink = Callable[[StreamDelta], None]


class StreamHub:
    """The calls streaming in one tick, and where their text goes.

    Args:
        sink: called with every piece of streamed text (``None``: only kept).
    """

    def __init__(self, sink: DeltaSink | None = None) -> None:
        self.sink = sink
        self.active: dict[int, CallText] = {}

    def in_flight(self) -> list[CallText]:
        """Calls begun and not ended, oldest first."""
        return list(self.active.values())


_HUB: ContextVar[StreamHub | None] = ContextVar("sim_stream_hub", default=None)
_CALL: ContextVar[CallText | None] = ContextVar("sim_stream_call", default=None)


@contextlib.contextmanager
def installed(hub: StreamHub) -> Iterator[StreamHub]:
    """Install ``hub`` for the calls started inside this block (and the tasks they make)."""
    token = _HUB.set(hub)
    try:
        yield hub
    finally:
        _HUB.reset(token)


@contextlib.contextmanager
def call_scope(phase: str, entity_key: str | None) -> Iterator[None]:
    """Mark the current task as one call of ``phase`` for ``entity_key``.

    The call's entry leaves the hub when the block ends normally or with an error; when
    it is cancelled (an interrupt) it stays, for the runner to log its partial text.
    """
    hub = _HUB.get()
    if hub is None:
        yield
        return
    call = CallText(phase, entity_key)
    hub.active[id(call)] = call
    token = _CALL.set(call)
    cancelled = False
    try:
        yield
    except BaseException as exc:
        cancelled = isinstance(exc, asyncio.CancelledError)
        raise
    finally:
        _CALL.reset(token)
        if not cancelled:
            hub.active.pop(id(call), None)


def emit_delta(text: str) -> None:
    """Record a piece of the current call's answer and pass it to the hub's sink."""
    call = _CALL.get()
    if call is None or not text:
        return
    call.pieces.append(text)
    hub = _HUB.get()
    if hub is not None and hub.sink is not None:
        hub.sink(StreamDelta(call.phase, call.entity_key, text))


def restart_text() -> None:
    """Forget the current call's text: a new attempt starts the answer again."""
    call = _CALL.get()
    if call is None or not call.pieces:
        return
    call.pieces.clear()
    hub = _HUB.get()
    if hub is not None and hub.sink is not None:
        hub.sink(StreamDelta(call.phase, call.entity_key, "", restart=True))
