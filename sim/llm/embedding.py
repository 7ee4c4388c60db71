"""Embeddings from a provider (``[memory] embeddings = "provider"``): the contract an
adapter offers them by.

An adapter that can embed has ``async def embed(model, texts, timeout_seconds)``
returning an ``Embedded`` (one vector per text, in order, and the usage the server
counted), and ``max_texts``, the most texts its API takes in one request. Only the
bottom of a stack has it: the stack's builder hands each endpoint's provider adapter that
embeds to the runner (``sim.engine.stack.Stack.embedders``), so the request goes over the
connections, base URL and key that endpoint's calls use, and nowhere else.
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


@dataclass(frozen=True, slots=True)
class EmbeddingSent:
    """One embeddings request the server answered, as the tick's log records it
    (``sim.engine.recorder.TickRecorder.embedded``): before which phase, the model, the
    endpoint it went to, how many texts it carried and the tokens the server counted."""

    phase: str
    model: str
    provider: str
    texts: int
    usage: Usage = field(default_factory=Usage)


@runtime_checkable
class Embedder(Protocol):
    """An adapter that fetches embeddings (``OpenAIFamilyAdapter.embed``,
    ``GeminiAdapter.embed``)."""

    #: the most texts one ``embed`` may be given (its API's limit per request)
    max_texts: int

    async def embed(self, model: str, texts: Sequence[str], timeout_seconds: float) -> Embedded: ...
