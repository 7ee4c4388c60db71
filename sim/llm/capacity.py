"""How many requests a model server serves at once, as the server reports it.

A single-slot local server sent 16 requests at once queues 15 of them, and each queued
request spends its ``timeout_seconds`` in the server's queue. Before an endpoint's first
call, ``sim.llm.backpressure`` asks its adapter for the server's capacity (once per
endpoint and run, over the adapter's HTTP client: ``Fetch``) and caps the endpoint's
concurrency limit there, so the requests past it wait on the client's side, where no
timeout runs. How a server is asked is its provider's business (the profile's
``capacity``: ``sim.llm.profile``); a server that says nothing is ``UNREPORTED``, and
the endpoint then adapts its limit to latency as well as to 429s and timeouts
(``sim.llm.backpressure``).

Whatever a server answers is untrusted: a slot count outside ``1..MAX_SLOTS`` or a body
of another shape counts as no answer (``believed_slots``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

#: the largest slot count believed (a larger one is treated as no answer)
MAX_SLOTS = 4096

#: GET a path under the server's root: the parsed JSON body, or ``None`` (any failure)
Fetch = Callable[[str], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class ServerCapacity:
    """What a server said about its capacity.

    Attributes:
        slots: requests it serves at once; ``None``: it does not say.
        source: where the figure comes from, for the note.
    """

    slots: int | None
    source: str = ""

    def note(self, url: str, limit: int) -> str | None:
        """The tick summary's line about it (none when the server said nothing)."""
        if self.slots is None:
            return None
        return (
            f"concurrency: {url} serves {self.slots} request(s) at once ({self.source}); "
            f"at most {limit} sent at a time, the others wait on this side (no timeout runs)"
        )


UNREPORTED = ServerCapacity(None)


def believed_slots(value: Any) -> int | None:
    """A slot count a server reported, if it is believable: an int in ``1..MAX_SLOTS``."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 1 <= value <= MAX_SLOTS else None
