"""What logged calls used and cost: the one place every view (``sim log``, ``sim usage``,
``sim tune``, the report) gets a call's tokens and money from.

Every attempt counts, not only the last: a failed attempt was sent and may have been
billed. Every call record counts, including one a resume superseded by sending the call
again (``TickLog.call_records``), and so does a log set aside into ``.sim/log/abandoned/``
when the tick started afresh. A cost with a model that has no price is *unknown*
(``Cost.value`` is ``None``), never summed as zero.

An attempt that timed out on the client has no usage (the answer never arrived), but the
server may have generated and billed it: ``Books.timed_out`` counts those attempts.

Embeddings requests (``[memory] embeddings = "provider"``: ``embedding`` records) are
billed too: their tokens and cost are in ``Books.usage`` and ``Books.cost``, each priced as
``[prices]`` prices its model on the provider it went to. They are not model calls:
``Books.calls`` never counts them, ``Books.embedding_requests`` does (and
``Books.embedding_tokens`` holds their part of the tokens).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sim.llm.budget import Cost, Price, price_usage
from sim.llm.types import Usage
from sim.ticklog.reader import TickLog
from sim.ticklog.records import AttemptRecord, CallRecord, EmbeddingRecord

#: the error code of an attempt that timed out on the client
TIMEOUT = "timeout"


def attempts_cost(
    attempts: Iterable[AttemptRecord],
    prices: Mapping[str, Any],
    cache: dict[str, Price | None] | None = None,
    factor: float = 1.0,
) -> Cost:
    """What attempts cost at ``prices``, each priced for the provider and model it actually
    used (times ``factor``: the Batch API's discount for a call sent in a batch)."""
    total = Cost()
    for attempt in attempts:
        total = total + price_usage(
            attempt.usage.to_usage(), attempt.model, prices, cache, attempt.provider, factor
        )
    return total


def call_usage(call: CallRecord) -> Usage:
    """Every token a logged call used: the sum over its attempts."""
    total = Usage()
    for attempt in call.every_attempt():
        total = total + attempt.usage.to_usage()
    return total


def call_cost(
    call: CallRecord, prices: Mapping[str, Any], cache: dict[str, Price | None] | None = None
) -> Cost:
    """What a logged call cost at ``prices``: every attempt, each at its model's price."""
    return attempts_cost(call.every_attempt(), prices, cache, call.price_factor)


def embedding_cost(
    record: EmbeddingRecord,
    prices: Mapping[str, Any],
    cache: dict[str, Price | None] | None = None,
) -> Cost:
    """What a logged embeddings request cost at ``prices``: its tokens at its model's price
    on the provider it went to (as its budget reservation priced it)."""
    return price_usage(record.to_usage(), record.model, prices, cache, record.provider)


def timed_out(call: CallRecord) -> int:
    """How many of a call's attempts timed out on the client (maybe billed, usage unknown)."""
    return sum(1 for attempt in call.every_attempt() if attempt.error_code == TIMEOUT)


#: a new Books' zeros: both frozen, so one of each serves every Books (``sim usage`` makes
#: a row per call)
_NO_USAGE = Usage()
_NO_COST = Cost()


@dataclass(kw_only=True)
class Books:
    """Calls, tokens and cost of a set of logged calls and embeddings requests.

    ``calls`` and ``failures`` are model calls only; ``usage`` and ``cost`` are everything
    billed, embeddings requests included (``embedding_tokens`` is their part). Fields are
    passed by name (a subclass such as ``sim.analysis.usage.UsageRow`` puts its own first).
    """

    calls: int = 0
    failures: int = 0
    usage: Usage = _NO_USAGE
    cost: Cost = _NO_COST
    timed_out: int = 0
    #: embeddings requests (not calls) and the (input) tokens the servers counted for them
    embedding_requests: int = 0
    embedding_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.usage.total_tokens

    def add(self, other: Books, *, billed_only: bool = False) -> None:
        """Count what ``other`` counted; with ``billed_only``, its usage and cost alone (an
        abandoned log's: paid for, but not the calls of the run it is kept beside)."""
        self.usage += other.usage
        self.cost = self.cost + other.cost
        if billed_only:
            return
        self.calls += other.calls
        self.failures += other.failures
        self.timed_out += other.timed_out
        self.embedding_requests += other.embedding_requests
        self.embedding_tokens += other.embedding_tokens

    def add_call(
        self,
        call: CallRecord,
        prices: Mapping[str, Any],
        cache: dict[str, Price | None] | None = None,
        cost: Cost | None = None,
    ) -> None:
        """Count ``call``; ``cost``: its ``call_cost`` at ``prices`` when the caller has
        it already (the recorder prices each call as it logs it)."""
        self.calls += 1
        self.failures += 1 if call.failed else 0
        self.usage = self.usage + call_usage(call)
        self.cost = self.cost + (call_cost(call, prices, cache) if cost is None else cost)
        self.timed_out += timed_out(call)

    def add_embedding(
        self,
        record: EmbeddingRecord,
        prices: Mapping[str, Any],
        cache: dict[str, Price | None] | None = None,
    ) -> None:
        """Count an embeddings request: its tokens and cost, not a call."""
        self.embedding_requests += 1
        self.embedding_tokens += record.input_tokens
        self.usage = self.usage + record.to_usage()
        self.cost = self.cost + embedding_cost(record, prices, cache)


def tick_books(log: TickLog, prices: Mapping[str, Any] | None = None) -> Books:
    """Everything a tick's log says was sent: every call record, every attempt, every
    embeddings request.

    ``prices`` defaults to the ``[prices]`` in effect when the tick ran (its header).
    ``calls`` and ``failures`` count the tick's calls as they ended (one per request id);
    tokens, cost and timeouts count every record, superseded ones included.
    """
    table = log.header.prices if prices is None else prices
    cache: dict[str, Price | None] = {}
    books = Books()
    for record in log.billed():
        if isinstance(record, CallRecord):
            books.add_call(record, table, cache)
        else:
            books.add_embedding(record, table, cache)
    books.calls = len(log.calls)
    books.failures = log.failures()
    return books


__all__ = [
    "TIMEOUT",
    "Books",
    "attempts_cost",
    "call_cost",
    "call_usage",
    "embedding_cost",
    "tick_books",
    "timed_out",
]
