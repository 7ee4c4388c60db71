"""Events the LLM client emits for every call, for progress lines, logs and metrics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from sim.llm.types import Usage

if TYPE_CHECKING:
    from sim.llm.calls import CallIdentity
    from sim.llm.client import LLMRequest
    from sim.llm.errors import LLMError
    from sim.llm.types import AdapterResponse, Exchange

EventKind = Literal["llm_called", "llm_completed", "llm_failed"]


@dataclass(slots=True)
class LLMEvent:
    """One step of one call. ``response`` is set on completion, ``error`` on failure.

    With recovery a call may take several attempts: each failed attempt but the last is
    reported as an ``llm_failed`` event with ``final=False`` (its usage was paid for); the
    call's outcome is the one event with ``final=True``.
    """

    kind: EventKind
    phase: str
    entity_key: str | None
    model: str
    request: LLMRequest
    attempt: int = 1
    latency: float = 0.0
    usage: Usage = field(default_factory=Usage)
    error_code: str | None = None
    error: LLMError | None = None
    response: AdapterResponse | None = None
    history: tuple[Exchange, ...] = ()
    previous_response_id: str | None = None
    depth: int = 0
    final: bool = True
    #: the endpoint the attempt went to (``sim.config.routing``; "": the only one)
    provider: str = ""
    #: the server URL this attempt went to (``None``: no network, or not known)
    endpoint: str | None = None
    #: the call's identity as it was last sent (``ModelRequest.call``; ``None``: anonymous)
    call: CallIdentity | None = None


EventSink = Callable[[LLMEvent], None]


def null_sink(event: LLMEvent) -> None:
    """Discard events."""


class EventFanout:
    """Deliver each event to several sinks, in order."""

    def __init__(self, *sinks: EventSink) -> None:
        self.sinks = list(sinks)

    def add(self, sink: EventSink) -> None:
        self.sinks.append(sink)

    def __call__(self, event: LLMEvent) -> None:
        for sink in self.sinks:
            sink(event)
