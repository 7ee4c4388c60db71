"""A wrapper adapter that slows calls down and counts the ones it answers, in a file.

It stands in for a provider's request counters in crash tests: each call appends
``{"started": <digest of instructions and input>}`` to ``count_file`` when it arrives and
``{"call": <digest>}`` just before its answer is returned, so a test can wait until calls
are in flight (``read_in_flight``) instead of sleeping, and check after a ``kill -9`` which
calls were paid for (``read_counts``).
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import orjson

from sim.llm.types import Adapter, AdapterResponse, ModelRequest
from sim.llm.wrapper import AdapterWrapper


def call_digest(instructions: str, input_data: str) -> str:
    """How ``CountingAdapter`` names a call (instructions and input; unique within a tick)."""
    return hashlib.sha256(f"{instructions}\x00{input_data}".encode()).hexdigest()[:24]


class CountingAdapter(AdapterWrapper):
    """Wraps an adapter: optional latency, and a durable count of answered calls.

    Args:
        inner: the adapter that answers.
        delay: seconds every call takes at least.
        jitter: up to this many more seconds, fixed per request (varies completion order).
        count_file: where arriving and answered calls are appended (one JSON line each), if
            anywhere.
    """

    def __init__(
        self,
        inner: Adapter,
        *,
        delay: float = 0.0,
        jitter: float = 0.0,
        count_file: Path | None = None,
    ) -> None:
        super().__init__(inner)
        self.delay = delay
        self.jitter = jitter
        self.count_file = count_file
        self.answered: list[str] = []

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        name = call_digest(request.instructions, request.input)
        self._note("started", name)
        wait = self.delay + self.jitter * (int(name[:6], 16) / 0xFFFFFF)
        if wait > 0:
            await asyncio.sleep(wait)
        response = await self.inner.execute(request)
        self.answered.append(name)
        self._note("call", name)
        return response

    def _note(self, kind: str, name: str) -> None:
        if self.count_file is not None:
            with open(self.count_file, "ab") as handle:
                handle.write(orjson.dumps({kind: name}) + b"\n")


def _read(count_file: Path, kind: str) -> list[str]:
    try:
        lines = count_file.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:  # a torn last line
            continue
        if kind in entry:
            out.append(str(entry[kind]))
    return out


def read_counts(count_file: Path) -> list[str]:
    """The calls a ``CountingAdapter`` answered, in order (a torn last line is ignored)."""
    return _read(count_file, "call")


def read_in_flight(count_file: Path) -> list[str]:
    """The calls that arrived and have not been answered (yet, or ever: cancelled or
    killed)."""
    pending = _read(count_file, "started")
    for name in read_counts(count_file):
        pending.remove(name)
    return pending
