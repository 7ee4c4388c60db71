"""Provider embeddings in the books (issue 28): each embeddings request a tick sends to the
stub server's ``/v1/embeddings`` is an ``embedding`` record of the tick's log, and ``sim
usage``, ``sim log``, the summaries and ``tick_books`` count its tokens and cost as the
stub counted them, apart from the model calls; a resume and a replay send none again and
count none twice; a log from before them still reads, and a bad one is named."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from conftest import WORLDS

from sim.cli import main
from sim.errors import LogError
from sim.ticklog.books import call_usage, tick_books
from sim.ticklog.format import list_logs, log_path, summary_rel
from sim.ticklog.reader import read_log, read_log_bytes
from sim.ticklog.summary import read_summary, summarize, summary_books

MODEL = "text-embedding-3-small"
KEY = "sk-embed-books-secret"
#: USD per million tokens: the embedding model's input, the chat model's input and output
EMBED_PRICE = 20.0
CHAT_PRICES = {"input": 1.0, "output": 3.0}

CONFIG = f"""
[tick]
phases = ["intentions", "resolution", "narrative", "apply", "memory"]

[memory]
mode = "retrieve"
k = 2
embeddings = "provider"
embedding_model = "{MODEL}"

[prices."{MODEL}"]
input = {EMBED_PRICE}

[prices."stub-chat"]
input = {CHAT_PRICES["input"]}
output = {CHAT_PRICES["output"]}

[phase1]
model = "stub-chat"
[phase2a]
model = "stub-chat"
[phase2b]
model = "stub-chat"
[phase4]
model = "stub-chat"
"""


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), env={"OPENAI_API_KEY": KEY}, catch_exceptions=False)


def make_world(tmp_path: Path, config: str = CONFIG) -> Path:
    world = tmp_path / "minds"
    shutil.copytree(WORLDS / "minds", world, ignore=shutil.ignore_patterns(".sim"))
    (world / "config.toml").write_text(config)
    path = world / "characters" / "bram.json"
    bram = orjson.loads(path.read_bytes())
    texts = [f"Bram counted {n} barrels of cider in the cellar." for n in range(12)]
    bram["memory"]["archive"] = [
        {"tick": 0, "text": t, "importance": 3, "mentions": []} for t in texts
    ]
    path.write_bytes(orjson.dumps(bram, option=orjson.OPT_INDENT_2))
    return world


def tick(world: Path, stub: Any) -> Result:
    result = run("tick", "--world", str(world), "--provider", "chat", "--base-url", stub.base_url)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and KEY not in result.output
    return result


def stub_tokens(stub: Any) -> int:
    """The input tokens the stub counted for its embeddings requests (its rule: a text's
    words, at least one)."""
    return sum(max(1, len(t.split())) for body in stub.embedding_log for t in body["input"])


def usage(world: Path, by: str) -> dict[str, Any]:
    result = run("usage", "--world", str(world), "--by", by, "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = orjson.loads(result.stdout)
    return data


def assert_books_agree(world: Path) -> None:
    """Each tick's books from its full log equal those from its summary, field by field."""
    for number, path in list_logs(world):
        log = read_log(path)
        full = tick_books(log)
        fast = summary_books(read_summary(world / summary_rel(number)))
        assert (fast.calls, fast.failures, fast.timed_out) == (
            full.calls,
            full.failures,
            full.timed_out,
        )
        assert (fast.embedding_requests, fast.embedding_tokens) == (
            full.embedding_requests,
            full.embedding_tokens,
        )
        assert fast.usage == full.usage and fast.cost.unpriced == full.cost.unpriced
        assert math.isclose(fast.cost.usd, full.cost.usd, rel_tol=1e-12)
        # and the summary the commit wrote is the one the log gives
        written = read_summary(world / summary_rel(number))
        assert written.head == summarize(log).head
        assert written.groups == summarize(log).groups


def test_sim_usage_counts_the_embeddings_the_stub_counted(tmp_path: Path, stub_server: Any) -> None:
    world = make_world(tmp_path)
    tick(world, stub_server)
    requests = stub_server.stats.by_route["POST /v1/embeddings"]
    tokens = stub_tokens(stub_server)
    assert requests == 1 and tokens > 0  # a few texts: one batch
    texts = sum(len(body["input"]) for body in stub_server.embedding_log)

    log = read_log(log_path(world, 1))
    assert [r.model for r in log.embeddings] == [MODEL] * requests
    assert sum(r.texts for r in log.embeddings) == texts
    assert sum(r.input_tokens for r in log.embeddings) == tokens
    assert {r.phase for r in log.embeddings} == {"intentions"}
    (provider,) = {r.provider for r in log.embeddings}
    assert provider  # the endpoint the intentions run on
    named = f"{provider}/{MODEL}"
    books = tick_books(log)
    assert books.embedding_requests == requests
    assert books.embedding_tokens == tokens
    assert books.calls == len(log.calls)  # model calls only
    calls_in = sum(call_usage(c).input_tokens for c in log.call_records)
    calls_out = sum(call_usage(c).output_tokens for c in log.call_records)
    # cached input tokens are free at these prices (no cached_input price)
    calls_cached = sum(call_usage(c).cached_input_tokens for c in log.call_records)
    assert books.usage.input_tokens == calls_in + tokens
    expected = (
        tokens * EMBED_PRICE
        + (calls_in - calls_cached) * CHAT_PRICES["input"]
        + calls_out * CHAT_PRICES["output"]
    ) / 1e6
    assert math.isclose(books.cost.usd, expected, rel_tol=1e-9) and books.cost.known
    assert_books_agree(world)
    # what a sweep's budget and a study's books count a folder's spend with
    from sim.config import load_config
    from sim.runs.ledger import spend
    from sim.study.run import folder_spend

    prices = load_config(world_dir=world, cwd=world).prices
    for spent in (spend(world), folder_spend(world, prices)):
        assert spent.usage == books.usage and spent.calls == books.calls
        assert math.isclose(spent.cost.usd, expected, rel_tol=1e-9)

    embed_cost = tokens * EMBED_PRICE / 1e6
    by_model = usage(world, "model")
    (row,) = [r for r in by_model["rows"] if r["key"] == named]
    assert row["embedding_requests"] == requests and row["requests"] == 0
    assert row["input_tokens"] == tokens and row["output_tokens"] == 0
    assert math.isclose(row["cost_usd"], embed_cost, rel_tol=1e-9)
    total = by_model["total"]
    assert total["embedding_requests"] == requests
    assert total["requests"] == len(log.calls)
    assert total["input_tokens"] == calls_in + tokens
    assert math.isclose(total["cost_usd"], expected, rel_tol=1e-9)
    for by in ("phase", "tick", "entity", "endpoint"):
        data = usage(world, by)
        assert data["total"]["embedding_requests"] == requests, by
        assert data["total"]["input_tokens"] >= tokens, by
        assert math.isclose(data["total"]["cost_usd"], expected, rel_tol=1e-9), by
    phase_rows = {r["key"]: r for r in usage(world, "phase")["rows"]}
    assert phase_rows["intentions"]["embedding_requests"] == requests
    entity_rows = {r["key"]: r for r in usage(world, "entity")["rows"]}
    assert entity_rows["(embeddings)"]["input_tokens"] == tokens

    text = run("usage", "--world", str(world), "--by", "phase")
    assert text.exit_code == 0 and "embeds" in text.output
    assert f"{requests} embeddings requests" in text.output
    listed = run("log", "--world", str(world), "--tick", "all", "--json")
    assert listed.exit_code == 0, listed.output
    numbers = orjson.loads(listed.output.splitlines()[0])
    assert numbers["embedding_requests"] == requests
    assert numbers["embedding_tokens"] == tokens
    assert numbers["calls"] == len(log.calls)
    assert math.isclose(numbers["cost"], expected, rel_tol=1e-9)
    shown = run("log", "--world", str(world), "--tick", "1")
    assert f"+{requests} embeddings requests ({tokens} tokens" in shown.output
    calls = run("log", "--world", str(world), "--tick", "1", "--calls")
    assert f"embeddings before intentions: {named}, {texts} texts, {tokens} input" in calls.output


def test_a_replay_sends_none_and_reproduces_the_books(tmp_path: Path, stub_server: Any) -> None:
    world = make_world(tmp_path)
    tick(world, stub_server)
    tick(world, stub_server)  # a second tick fetches only what it adds
    requests = stub_server.stats.by_route["POST /v1/embeddings"]
    before = {by: usage(world, by) for by in ("phase", "model", "tick")}
    logged = [len(read_log(log_path(world, n)).embeddings) for n in (1, 2)]
    replay = run("replay", "--world", str(world), "--tick", "1", "--to", "2", "--json")
    assert replay.exit_code == 0, replay.output
    document = orjson.loads(replay.output)
    assert document["identical"] is True
    assert [t["embedding_requests"] for t in document["ticks"]] == logged
    assert all(t["embeddings_match"] for t in document["ticks"])
    assert stub_server.stats.by_route["POST /v1/embeddings"] == requests  # nothing sent
    assert {by: usage(world, by) for by in before} == before  # nothing counted twice
    assert_books_agree(world)


def test_a_resumed_tick_counts_its_embeddings_once(tmp_path: Path, stub_server: Any) -> None:
    """Stopped after its intentions (the server refuses the key from then on), then
    resumed: the request the first run sent is counted once, and none is sent again."""
    world = make_world(tmp_path)
    chars = len(list((world / "characters").glob("*.json")))
    stub_server.enqueue(*([None] * chars), *(["auth"] * 200))
    stopped = run(
        "tick", "--world", str(world), "--provider", "chat", "--base-url", stub_server.base_url
    )
    assert stopped.exit_code != 0 and "Traceback" not in stopped.output
    requests = stub_server.stats.by_route["POST /v1/embeddings"]
    assert requests == 1
    stub_server.script.clear()
    tick(world, stub_server)
    assert stub_server.stats.by_route["POST /v1/embeddings"] == requests
    log = read_log(log_path(world, 1))
    assert log.resumes == 1 and len(log.embeddings) == requests
    total = usage(world, "tick")["total"]
    assert total["embedding_requests"] == requests
    assert_books_agree(world)
    head = read_summary(world / summary_rel(1)).head
    assert head.embedding_requests == requests
    assert head.embedding_tokens == stub_tokens(stub_server)


def test_a_log_without_embedding_records_reads_and_a_bad_one_is_named(
    tmp_path: Path, stub_server: Any
) -> None:
    world = make_world(tmp_path)
    tick(world, stub_server)
    path = log_path(world, 1)
    lines = read_log_bytes(path).splitlines(keepends=True)
    packed = next(p for _, p in list_logs(world))
    # as a sim before embedding records wrote it: plain JSONL, no such line, no summary
    older = [line for line in lines if not line.startswith(b'{"type":"embedding"')]
    assert len(older) < len(lines)
    packed.unlink()
    (world / summary_rel(1)).unlink()
    path.write_bytes(b"".join(older))
    log = read_log(path)
    assert log.embeddings == [] and log.committed
    books = tick_books(log)
    assert books.embedding_requests == 0 and books.calls == len(log.calls)
    assert summary_books(summarize(log)).usage == books.usage
    data = usage(world, "phase")
    assert data["total"]["embedding_requests"] == 0 and not data["problems"]

    # a record that is not one: named by file, line and field, never a traceback
    bad = orjson.dumps({"type": "embedding", "phase": "intentions", "model": MODEL, "texts": -3})
    path.write_bytes(b"".join([*older[:-1], bad + b"\n", older[-1]]))
    with pytest.raises(LogError, match=r"line \d+: embedding record: field 'texts'"):
        read_log(path)
    shown = run("usage", "--world", str(world), "--by", "phase")
    assert shown.exit_code == 1 and "Traceback" not in shown.output
    assert "embedding record" in shown.output and str(path) in shown.output
    for wrong, field in (
        ({"input_tokens": -100}, "input_tokens"),
        ({"input_tokens": "many"}, "input_tokens"),
        ({"usage": {"input_tokens": 5}}, "usage"),  # not a field of this record
        ({"phase": None}, "phase"),
        ({"cost_usd": -5.0}, "cost_usd"),  # a tampered log cannot lower the books
    ):
        line = orjson.dumps({"type": "embedding", "phase": "intentions", "model": MODEL, **wrong})
        path.write_bytes(b"".join([*older[:-1], line + b"\n", older[-1]]))
        with pytest.raises(LogError, match=rf"embedding record: .*{field}"):
            read_log(path)
    # the same holds for a call's cost
    call = next(line for line in older if line.startswith(b'{"type":"call"'))
    data = orjson.loads(call)
    data["cost_usd"] = -5.0
    path.write_bytes(b"".join(orjson.dumps(data) + b"\n" if ln is call else ln for ln in older))
    with pytest.raises(LogError, match=r"call record: .*cost_usd"):
        read_log(path)
