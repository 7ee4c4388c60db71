"""``embedding`` records in the books: for any mix of call records and embeddings requests,
a summary's totals and ``summary_books`` (at any prices) equal ``tick_books`` of the full
log, ``sim usage``'s rows from summaries equal its rows from the logs, calls are never
counted with embeddings requests, and a summary without any is what earlier sims wrote."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from sim.analysis.usage import EMBEDDINGS_ROW, group_calls, group_rows
from sim.llm.budget import Price
from sim.ticklog.books import call_usage, tick_books
from sim.ticklog.reader import read_log, read_log_bytes
from sim.ticklog.records import EmbeddingRecord, dump_record
from sim.ticklog.summary import (
    Listed,
    UsageGroups,
    dump_summary,
    read_summary,
    summarize,
    summary_books,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "ticklog"
MODELS = ["text-embedding-3-small", "mini-embed", "gpt-4.1-mini"]


def _log_with_embeddings(tmp_path: Path, rng: random.Random, name: str) -> Path:
    """The fixture log with embeddings requests put among its records at random."""
    lines = read_log_bytes(FIXTURES / "tick-000001.jsonl").splitlines(keepends=True)
    head, rest = lines[:2], lines[2:]
    for _ in range(rng.randint(0, 6)):
        record = EmbeddingRecord(
            phase=rng.choice(["intentions", "planning", "opinion"]),
            model=rng.choice(MODELS),
            provider=rng.choice(["", "chat", "near"]),
            texts=rng.randint(1, 256),
            input_tokens=rng.randint(0, 5000),
        )
        rest.insert(rng.randint(0, len(rest) - 1), dump_record(record) + b"\n")
    path = tmp_path / name
    path.write_bytes(b"".join([*head, *rest]))
    return path


@pytest.mark.parametrize("seed", range(12))
def test_summaries_count_embeddings_as_the_full_log_does(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    prices = rng.choice(
        [
            {},
            {"text-embedding-3-small": Price(0.02, 0.0, 0.0)},
            {
                "text-embedding-3-small": Price(0.02, 0.0, 0.0),
                "near/mini-embed": Price(0.01, 0.0, 0.0),
                "gpt-4.1-mini": Price(0.4, 0.1, 1.6),
            },
        ]
    )
    logs = [
        read_log(_log_with_embeddings(tmp_path, rng, f"tick-{n:06d}.jsonl"))
        for n in range(1, rng.randint(2, 4))
    ]
    for log in logs:
        books = tick_books(log)
        assert books.embedding_requests == len(log.embeddings)
        assert books.calls == len(log.calls)  # calls only, however many embeddings
        spent = sum(r.input_tokens for r in log.embeddings)
        assert books.embedding_tokens == spent
        called = sum(call_usage(c).input_tokens for c in log.call_records)
        assert books.usage.input_tokens == called + spent
        summary = summarize(log)
        head = summary.head
        assert head.usage.to_usage() == books.usage
        assert head.embedding_requests == books.embedding_requests
        assert head.cost == books.cost.value and set(head.unpriced) == books.cost.unpriced
        for table, full in ((None, books), (prices, tick_books(log, prices))):
            fast = summary_books(summary, table)
            assert (fast.calls, fast.failures, fast.embedding_requests) == (
                full.calls,
                full.failures,
                full.embedding_requests,
            )
            assert fast.usage == full.usage and fast.embedding_tokens == full.embedding_tokens
            assert fast.cost.unpriced == full.cost.unpriced
            assert math.isclose(fast.cost.usd, full.cost.usd, rel_tol=1e-9, abs_tol=1e-12)
        # the summary file reads back as written
        stored = tmp_path / f"{log.path.name}.summary.jsonl.gz"
        stored.write_bytes(dump_summary(summary))
        again = read_summary(stored)
        assert (again.head, again.groups) == (summary.head, summary.groups)
    listed = [Listed(log.tick, log.path, summarize(log)) for log in logs]
    for i, log in enumerate(logs):  # as ticks 1, 2, ...: the fixture is tick 1
        log.tick = listed[i].tick = i + 1
    for by in ("entity", "phase", "tick", "model"):
        new = group_rows(listed, by, prices)  # type: ignore[arg-type]
        old = group_calls(logs, by, prices)  # type: ignore[arg-type]
        assert set(new) == set(old), by
        for key, row in old.items():
            other = new[key]
            assert (other.calls, other.embedding_requests, other.failures) == (
                row.calls,
                row.embedding_requests,
                row.failures,
            ), (by, key)
            assert (other.usage.input_tokens, other.usage.output_tokens) == (
                row.usage.input_tokens,
                row.usage.output_tokens,
            )
            assert other.cost.unpriced == row.cost.unpriced
            assert math.isclose(other.cost.usd, row.cost.usd, rel_tol=1e-9, abs_tol=1e-12)
        if any(log.embeddings for log in logs) and by == "entity":
            assert old[EMBEDDINGS_ROW].calls == 0
            assert old[EMBEDDINGS_ROW].embedding_requests == sum(len(x.embeddings) for x in logs)


def test_a_summary_without_embeddings_is_what_earlier_sims_wrote() -> None:
    """No embeddings request: neither summary line carries the new fields, so an older sim
    (whose models forbid unknown fields) reads the summary, and its bytes are unchanged."""
    summary = summarize(read_log(FIXTURES / "tick-000001.jsonl"))
    import gzip

    text = gzip.decompress(dump_summary(summary))
    assert b"embedding" not in text
    assert summary.head.embedding_requests == 0


def test_bad_embedding_columns_in_a_summary_are_refused() -> None:
    from pydantic import ValidationError

    good = {"models": ["m"], "phases": ["intentions"]}
    UsageGroups.model_validate(
        {
            **good,
            "embedding_phase": [0],
            "embedding_model": [0],
            "embedding_requests": [1],
            "embedding_input": [5],
        }
    )
    for bad in (
        {"embedding_phase": [0], "embedding_model": [0], "embedding_requests": [1]},
        {
            "embedding_phase": [1],
            "embedding_model": [0],
            "embedding_requests": [1],
            "embedding_input": [5],
        },
        {
            "embedding_phase": [0],
            "embedding_model": [0],
            "embedding_requests": [-1],
            "embedding_input": [5],
        },
    ):
        with pytest.raises(ValidationError):
            UsageGroups.model_validate({**good, **bad})
