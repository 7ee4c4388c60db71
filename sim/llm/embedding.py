"""Embeddings from a provider (``[memory] embeddings = "provider"``): the contract an
adapter offers them by, and finding the adapter of an endpoint in a built stack.

An adapter that can embed has ``async def embed(model, texts, timeout_seconds)``
returning an ``Embedded`` (one vector per text, in order, and the usage the server
counted). Only the bottom of a stack has it: wrappers (recovery, budget, backpressure,
rate limits, the policy gate, a resume's replay) are stepped through to the endpoint's
provider adapter, so the request goes over the connections, base URL and key that
endpoint's calls use, and nowhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from sim.llm.types import Usage


@dataclass(frozen=True, slots=True)
class Embedded:
    """What one embeddings request brought back: a vector per text, in the texts' order."""

    vectors: tuple[tuple[float, ...], ...]
    usage: Usage = field(default_factory=Usage)


@runtime_checkable
class Embedder(Protocol):
    """An adapter that fetches embeddings (``OpenAIFamilyAdapter.embed``)."""

    async def embed(self, model: str, texts: Sequence[str], timeout_seconds: float) -> Embedded: ...


#: the attributes a wrapper keeps the adapter it wraps in: ``inner`` (every
#: ``AdapterWrapper``), ``live`` (a resume's ``ReplayAdapter``)
_WRAPPED = ("inner", "live")
#: wrappers are never this deep: a loop of references is not followed forever
_MAX_DEPTH = 32


def embedder_of(adapter: object, endpoint: str) -> Embedder | None:
    """The provider adapter of ``endpoint`` under ``adapter`` if it embeds, else ``None``.

    A router (``sim.llm.router.Router``: a ``routes`` mapping) is followed down the
    route named ``endpoint`` (its default for ``""``); a pool of servers down its first
    server (every server speaks the same provider with the same key)."""
    seen = 0
    while adapter is not None and seen < _MAX_DEPTH:
        seen += 1
        if isinstance(adapter, Embedder):
            return adapter
        routes = getattr(adapter, "routes", None)
        if isinstance(routes, dict):  # a router: the endpoint's route, else its default's
            adapter = routes.get(endpoint) or routes.get(getattr(adapter, "default", ""))
            continue
        adapter = next(
            (getattr(adapter, a) for a in _WRAPPED if getattr(adapter, a, None) is not None),
            None,
        )
    return None
