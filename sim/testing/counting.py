"""A wrapper adapter that slows calls down and counts the ones it answers, in a file.

It stands in for a provider's request counter in crash tests: each answered call appends
one line (``{"call": <digest of instructions and input>}``) to ``count_file`` just before
the answer is returned, so a test can check after a ``kill -9`` which calls were paid for.
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
        count_file: where answered calls are appended (one JSON line each), if anywhere.
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
        wait = self.delay + self.jitter * (int(name[:6], 16) / 0xFFFFFF)
        if wait > 0:
            await asyncio.sleep(wait)
        response = await self.inner.execute(request)
        self.answered.append(name)
        if self.count_file is not None:
            with open(self.count_file, "ab") as handle:
                handle.write(orjson.dumps({"call": name}) + b"\n")
        return response


def read_counts(count_file: Path) -> list[str]:
    """The calls a ``CountingAdapter`` answered, in order (a torn last line is ignored)."""
    try:
        lines = count_file.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(str(orjson.loads(line)["call"]))
        except orjson.JSONDecodeError:
            continue
    return out
