"""The tick log's Batch API records: round trip, and what a batched call costs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from sim.config import DEFAULT_PRICES
from sim.llm.batching import BATCH_PRICE_FACTOR
from sim.ticklog.books import call_cost
from sim.ticklog.reader import read_log
from sim.ticklog.records import BatchRecord, CallRecord, parse_record, record_data
from sim.ticklog.writer import LogWriter

HEADER = {"type": "header", "format": 1, "tick": 2}
BATCH = {
    "type": "batch",
    "batch_id": "batch_1",
    "phase": "intentions",
    "endpoint": "/v1/responses",
    "input_file_id": "file-1",
    "lines": [{"custom_id": "2:intentions:intention:a:0#0", "digest": "sha256:aa"}],
}
ATTEMPT = {
    "attempt": 1,
    "model": "gpt-4.1-mini",
    "usage": {"input_tokens": 1000, "output_tokens": 500, "cached_input_tokens": 0},
}


def call(**extra: object) -> dict[str, object]:
    return {
        "type": "call",
        "request_id": "2:intentions:intention:a:0",
        "phase": "intentions",
        "attempts": [ATTEMPT],
        **extra,
    }


def test_batch_records_round_trip_byte_for_byte(tmp_path: Path) -> None:
    records = [HEADER, BATCH, call(batch_ids=["batch_1"])]
    path = tmp_path / "tick-000002.jsonl"
    writer = LogWriter(path)
    for record in records:
        writer.append(parse_record(record))
    writer.close()
    assert path.read_bytes() == b"".join(orjson.dumps(r) + b"\n" for r in records)
    log = read_log(path)
    assert [record_data(r) for r in log.records] == records
    assert [b.batch_id for b in log.batches] == ["batch_1"]
    assert isinstance(log.batches[0], BatchRecord)
    assert log.calls["2:intentions:intention:a:0"].batch_ids == ["batch_1"]


def test_a_batched_call_costs_the_batch_rate() -> None:
    live = parse_record(call())
    batched = parse_record(call(batch_ids=["batch_1"]))
    assert isinstance(live, CallRecord) and isinstance(batched, CallRecord)
    assert "batch_ids" not in record_data(live)  # a live call's line is unchanged
    full = call_cost(live, DEFAULT_PRICES).value
    assert full == pytest.approx((1000 * 0.4 + 500 * 1.6) / 1_000_000)
    assert call_cost(batched, DEFAULT_PRICES).value == pytest.approx(full * BATCH_PRICE_FACTOR)


def test_the_budget_charges_batched_attempts_at_the_batch_rate() -> None:
    import asyncio

    from sim.llm.batching import BatchOptions
    from sim.llm.budget import Budget, BudgetAdapter, Price
    from sim.llm.types import CallSettings, ModelRequest
    from sim.phases.intentions import Intention
    from sim.providers.batch import BatchSession
    from sim.testing.adapters import MockAdapter

    request = ModelRequest("Intend.", "{}", Intention, settings=CallSettings(model="m"))

    async def spend(batched: bool) -> float:
        budget = Budget(prices={"m": Price(input=1.0, output=2.0)})
        adapter = BudgetAdapter(MockAdapter(), budget)
        session = BatchSession("p", BatchOptions()) if batched else None
        await adapter.execute(replace(request, batch=session))  # a call of the session
        assert budget.reserved_usd == pytest.approx(0.0)
        return budget.spent_usd

    live, batched = asyncio.run(spend(False)), asyncio.run(spend(True))
    assert live > 0
    assert batched == pytest.approx(live * BATCH_PRICE_FACTOR)


def test_each_call_of_a_batch_carries_its_session_and_no_other_call_does() -> None:
    """Batch mode reaches the adapter in the request (``ModelRequest.batch``), not through
    a context variable: the calls of a ``create_batch`` carry the session the client opened
    for it, a single call and a client without batch options carry none."""
    import asyncio
    from typing import Any

    from sim.llm.batching import BatchOptions, BatchTransport
    from sim.llm.client import LLMClient, LLMRequest
    from sim.llm.types import AdapterResponse, ModelRequest
    from sim.phases.intentions import Intention
    from sim.testing.adapters import MockAdapter

    opened: list[BatchTransport] = []
    seen: list[Any] = []

    class Session:
        def __init__(self) -> None:
            self.created: list[str] = []
            self.resumed: list[str] = []

        def enter(self) -> None: ...

        def leave(self) -> None: ...

        async def aclose(self) -> None: ...

        async def post(self, client: Any, path: str, payload: Any, **kw: Any) -> Any: ...

    def transport(phase: str, options: BatchOptions) -> BatchTransport:
        opened.append(Session())
        return opened[-1]

    class Seeing(MockAdapter):
        async def execute(self, request: ModelRequest) -> AdapterResponse:
            seen.append(request.batch)
            return await super().execute(request)

    requests = [LLMRequest("Intend.", "{}", Intention, f"intention:{n}") for n in "ab"]

    async def run() -> None:
        batched = LLMClient(Seeing(), [], batch=BatchOptions(transport=transport))
        await batched.create_batch(requests)
        await batched.create_response("Intend.", "{}", Intention)
        await LLMClient(Seeing(), []).create_batch(requests)

    asyncio.run(run())
    assert len(opened) == 1
    assert seen == [opened[0], opened[0], None, None, None]
