"""Where streamed text goes while a call is in flight.

The runner makes one ``StreamHub`` per tick and gives it to the phases' clients. For every
call the client opens the call's text on the hub (``StreamHub.call``: phase, entity key)
and sends it with the request (``ModelRequest.stream_to``); an adapter that streams adds
each piece of answer text to it (``CallText.add``) without knowing which phase or entity
the call is for. The hub forwards each piece to its sink (``sim tick --stream`` prints
narratives as they are written) and keeps the text of the calls still in flight, so an
interrupted tick can log what each had written so far.

A request without a text target (tests, library use) streams to nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """One piece of text of one call, as it arrived."""

    phase: str
    entity_key: str | None
    text: str
    #: the call starts its answer again (a retry): drop what it streamed before
    restart: bool = False


DeltaSink = Callable[[StreamDelta], None]


@dataclass(slots=True)
class CallText:
    """The text one in-flight call has streamed so far, and where each piece goes."""

    phase: str
    entity_key: str | None
    pieces: list[str] = field(default_factory=list)
    #: called with every piece (the hub's sink; ``None``: only kept)
    sink: DeltaSink | None = field(default=None, repr=False)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def add(self, text: str) -> None:
        """Record a piece of the call's answer and pass it to the sink."""
        if not text:
            return
        self.pieces.append(text)
        if self.sink is not None:
            self.sink(StreamDelta(self.phase, self.entity_key, text))

    def restart(self) -> None:
        """Forget the call's text: a new attempt starts the answer again."""
        if not self.pieces:
            return
        self.pieces.clear()
        if self.sink is not None:
            self.sink(StreamDelta(self.phase, self.entity_key, "", restart=True))


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

    @contextlib.contextmanager
    def call(self, phase: str, entity_key: str | None) -> Iterator[CallText]:
        """The text of one call of ``phase`` for ``entity_key``, for the block's duration.

        The call's entry leaves the hub when the block ends normally or with an error;
        when it is cancelled (an interrupt) it stays, for the runner to log its partial
        text.
        """
        call = CallText(phase, entity_key, sink=self.sink)
        self.active[id(call)] = call
        cancelled = False
        try:
            yield call
        except BaseException as exc:
            cancelled = isinstance(exc, asyncio.CancelledError)
            raise
        finally:
            if not cancelled:
                self.active.pop(id(call), None)
