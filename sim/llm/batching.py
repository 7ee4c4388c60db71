"""Batch mode, as the provider-agnostic client sees it: a phase's calls sent as one batch.

With ``[llm] batch = true`` the stack's builder chooses the transport (the OpenAI Batch
API's ``sim.providers.batch.BatchSession``: ``sim.engine.stack``), and an ``LLMClient``
opens a session of it (``BatchOptions.transport``) for each batch of requests; each request
of the batch carries its session (``ModelRequest.batch``). Everything above the wire stays
as it is: each call still goes through recovery, budget and the recorder; only the POST
changes (the ``openai`` / ``chat`` adapters hand their body to the request's session, and
the budget prices it at the batch rate). The records a batch leaves
in the tick log (``BatchLine``, ``SubmittedBatch``) and the journal a session resumes from
(``BatchJournal``) are defined here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sim.llm.budget import BATCH_PRICE_FACTOR
from sim.llm.calls import CallIdentity

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One request of a batch as the journal keeps it: its custom id and body digest."""

    custom_id: str
    digest: str


@dataclass(frozen=True, slots=True)
class SubmittedBatch:
    """A batch the provider has accepted (what the tick log records)."""

    batch_id: str
    phase: str
    endpoint: str
    input_file_id: str
    lines: tuple[BatchLine, ...]


@dataclass(frozen=True, slots=True)
class BatchProgress:
    """Where one batch is, for a progress line.

    Attributes:
        resumed: the batch was created by an earlier run of this tick.
        elapsed: seconds since this run started waiting for it.
    """

    phase: str
    batch_id: str
    status: str
    total: int
    completed: int
    failed: int
    resumed: bool
    elapsed: float


class BatchJournal(Protocol):
    """Where a session records the batches it creates, and finds those of an earlier run."""

    def resumable(self) -> Mapping[BatchLine, str]:
        """Batch ids by line, of the batches earlier runs of this tick created."""
        ...

    def submitted(self, batch: SubmittedBatch) -> None:
        """Record ``batch`` durably (called as soon as the provider accepted it)."""
        ...

    def carried(self, request_id: str, batch_id: str) -> None:
        """Note that batch ``batch_id`` carried an attempt of the call ``request_id``
        (answered or failed in it)."""
        ...


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """How a run uses the Batch API (the runner builds it from ``[llm]``)."""

    journal: BatchJournal | None = None
    poll_seconds: float = 30.0
    on_progress: Callable[[BatchProgress], None] | None = None
    #: opens the session of one ``create_batch`` for a phase (the Batch API's:
    #: ``sim.providers.batch.BatchSession``; the stack's builder chooses it)
    transport: Callable[[str, BatchOptions], BatchTransport] | None = None


class BatchTransport(Protocol):
    """A session collecting the calls of one ``create_batch``: the client counts its calls
    in and out; the adapters of the endpoints that batch post their bodies to it."""

    created: list[str]
    resumed: list[str]

    def enter(self) -> None: ...

    def leave(self) -> None: ...

    async def aclose(self) -> None: ...

    async def post(
        self,
        client: Any,
        path: str,
        payload: Json,
        *,
        model: str,
        api_key_env: str,
        call: CallIdentity | None = None,
    ) -> Json: ...


__all__ = [
    "BATCH_PRICE_FACTOR",
    "BatchJournal",
    "BatchLine",
    "BatchOptions",
    "BatchProgress",
    "BatchTransport",
    "SubmittedBatch",
]
