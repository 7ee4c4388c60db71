"""The events of ``sim serve``'s page: whom ``/api/events`` streams them to.

A ``Hub`` holds one queue per listener; what the server publishes (a tick committed, a run's
progress, the world's load) goes to each in order, a slow reader missing the newest past
``QUEUE``; a stopping server ends every stream. The stream itself (server-sent events) is
the ``/api/events`` route's, in ``sim.serve.app``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

#: events kept for a listener that reads slowly (the newest are dropped past it)
QUEUE = 1000

Listener = asyncio.Queue[tuple[str, dict[str, Any]] | None]


class Hub:
    """The event listeners (``/api/events``): each gets every event, in order, and
    ``None`` when the server stops (its stream then ends)."""

    def __init__(self) -> None:
        self.listeners: set[Listener] = set()
        self.closed = False

    def add(self) -> Listener:
        """A new listener's queue (already ended if the server is stopping)."""
        queue: Listener = asyncio.Queue(QUEUE)
        if self.closed:
            queue.put_nowait(None)
        self.listeners.add(queue)
        return queue

    def publish(self, kind: str, data: dict[str, Any]) -> None:
        for queue in self.listeners:
            with contextlib.suppress(asyncio.QueueFull):  # a stalled reader misses some
                queue.put_nowait((kind, data))

    def close(self) -> None:
        """End every stream, a stalled one's too (its oldest event makes room for the
        end): a stream left open would hold the server's stop for aiohttp's whole
        shutdown timeout."""
        self.closed = True
        for queue in self.listeners:
            while True:
                try:
                    queue.put_nowait(None)
                    break
                except asyncio.QueueFull:
                    queue.get_nowait()
