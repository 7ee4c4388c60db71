"""How many requests a model server serves at once, as the server reports it.

A single-slot local server sent 16 requests at once queues 15 of them, and each queued
request spends its ``timeout_seconds`` in the server's queue. Before an endpoint's first
call, ``sim.llm.backpressure`` asks its adapter for the server's capacity
(``discover``, over the adapter's HTTP client, once per endpoint and run) and caps the
endpoint's concurrency limit there, so the requests past it wait on the client's side,
where no timeout runs:

- llama.cpp's server: ``GET /props`` -> ``total_slots`` (its ``--parallel``);
  else ``GET /slots`` -> one entry per slot (when started with ``--slots``);
- llama-cpp-python's server reports no capacity, but it serves one request at a time by
  design (its model sits behind one lock), and says who it is: its ``/openapi.json``
  is titled ``🦙 llama.cpp Python API``;
- anything else (vLLM, Ollama, SGLang, a gateway): unreported. The endpoint then adapts
  its limit to latency as well as to 429s and timeouts (``sim.llm.backpressure``).

Whatever a server answers is untrusted: a slot count outside ``1..MAX_SLOTS`` or a body
of another shape counts as no answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

#: the largest slot count believed (a larger one is treated as no answer)
MAX_SLOTS = 4096
#: the title of llama-cpp-python's FastAPI app (``llama_cpp/server/app.py``: after an emoji)
LLAMA_CPP_PYTHON_TITLE = "llama.cpp Python API"

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


def server_root(base_url: str) -> str:
    """The server's root: ``base_url`` without a trailing ``/v1`` (where llama.cpp serves
    ``/props``)."""
    root = base_url.rstrip("/")
    return root.removesuffix("/v1")


def _slots(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 1 <= value <= MAX_SLOTS else None


async def discover(fetch: Fetch) -> ServerCapacity:
    """Ask the server (see the module doc); ``UNREPORTED`` when it says nothing usable."""
    props = await fetch("/props")
    if isinstance(props, dict):
        slots = _slots(props.get("total_slots"))
        if slots is not None:
            return ServerCapacity(slots, "llama.cpp /props total_slots")
    listed = await fetch("/slots")
    if isinstance(listed, list):
        slots = _slots(len(listed))
        if slots is not None:
            return ServerCapacity(slots, "llama.cpp /slots")
    spec = await fetch("/openapi.json")
    info = spec.get("info") if isinstance(spec, dict) else None
    title = info.get("title") if isinstance(info, dict) else None
    if isinstance(title, str) and title.endswith(LLAMA_CPP_PYTHON_TITLE):
        return ServerCapacity(1, "llama-cpp-python serves one request at a time")
    return UNREPORTED
