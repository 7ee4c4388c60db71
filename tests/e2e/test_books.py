"""The books balance: every view counts a logged call's every attempt and every record, the
same way (``sim.ticklog.books``); abandoned runs and client-side timeouts are accounted."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from conftest import copy_demo

from sim.analysis.report.data import collect
from sim.cli import main
from sim.testing.stub_server import StubServer
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log, read_log_bytes

FIXTURE = Path(__file__).parent.parent / "fixtures" / "ticklog" / "tick-000001.jsonl"
#: gpt-4.1-mini in the default [prices] ($ per million tokens), what the fixture's tick used
MINI = {"input": 0.4, "cached_input": 0.1, "output": 1.6}


def invoke(*args: str) -> Result:
    return CliRunner().invoke(
        main, list(args), env={"OPENAI_API_KEY": "sk-test"}, catch_exceptions=False
    )


def raw_books(paths: list[Path]) -> dict[str, Any]:
    """Tokens and cost straight from the JSONL: every call record, every attempt."""
    tokens = cost = 0.0
    per_char: dict[str, float] = {}
    for path in paths:
        for line in read_log_bytes(path).splitlines():
            record = orjson.loads(line)
            if record["type"] != "call":
                continue
            for attempt in record["attempts"]:
                u = attempt["usage"]
                used = u["input_tokens"] + u["output_tokens"]
                tokens += used
                cached = u["cached_input_tokens"]
                cost += (
                    (u["input_tokens"] - cached) * MINI["input"]
                    + cached * MINI["cached_input"]
                    + u["output_tokens"] * MINI["output"]
                ) / 1_000_000
                chain, _, owner = record["entity_key"].partition(":")
                if chain in ("intention", "memory"):
                    per_char[owner] = per_char.get(owner, 0) + used
    return {"tokens": int(tokens), "cost": cost, "per_char": per_char}


@pytest.fixture
def resumed_world(tmp_path: Path) -> Path:
    """The demo world with the log of a tick that retried calls, failed one with
    ``incomplete`` five times (aborting the tick) and was then resumed and committed."""
    world = copy_demo(tmp_path / "w")
    log = log_path(world, 1)
    log.parent.mkdir(parents=True)
    shutil.copy(FIXTURE, log)
    return world


def test_a_tick_with_retried_and_resent_calls_shows_one_total_everywhere(
    resumed_world: Path,
) -> None:
    expected = raw_books([log_path(resumed_world, 1)])
    # the call that failed five times and the retried calls are in it: the last attempt of
    # the last record per call is less than the whole
    log = read_log(log_path(resumed_world, 1))
    last_only = sum(c.usage.input_tokens + c.usage.output_tokens for c in log.calls.values())
    assert expected["tokens"] > last_only

    tick_all = invoke("log", "--world", str(resumed_world), "--tick", "all", "--json")
    assert tick_all.exit_code == 0, tick_all.output
    summary = orjson.loads(tick_all.output.splitlines()[0])
    assert summary["tokens"] == expected["tokens"]
    assert summary["cost"] == pytest.approx(expected["cost"])

    usage = invoke("usage", "--world", str(resumed_world), "--by", "tick", "--json")
    assert usage.exit_code == 0, usage.output
    total = orjson.loads(usage.output)["total"]
    assert total["total_tokens"] == expected["tokens"]
    assert total["cost_usd"] == pytest.approx(expected["cost"])
    assert total["requests"] == len(log.call_records)  # the resent call once per sending

    data = collect(resumed_world)
    assert data["ticks"][0]["tokens"] == expected["tokens"]
    assert data["ticks"][0]["cost"] == pytest.approx(expected["cost"])
    chars = {c["id"]: c["tokens"] for c in data["chars"] if c["tokens"]}
    assert chars == expected["per_char"]

    per_call = invoke("log", "--world", str(resumed_world), "--tick", "1", "--calls")
    rows = [line.split() for line in per_call.output.splitlines()[1:]]
    assert sum(int(r[4]) + int(r[6]) for r in rows) == expected["tokens"]


def test_logs_set_aside_by_a_tick_started_afresh_are_counted_by_sim_usage(
    resumed_world: Path,
) -> None:
    """A tick aborted, the world changed, the tick ran afresh: the first run's calls were
    billed, and its log (moved to .sim/log/abandoned/) is in the books."""
    aside = resumed_world / ".sim" / "log" / "abandoned" / "tick-000001.1.jsonl"
    aside.parent.mkdir(parents=True)
    shutil.copy(FIXTURE, aside)
    expected = raw_books([log_path(resumed_world, 1), aside])
    usage = invoke("usage", "--world", str(resumed_world), "--by", "phase", "--json")
    assert usage.exit_code == 0, usage.output
    data = orjson.loads(usage.output)
    assert data["total"]["total_tokens"] == expected["tokens"]
    assert any("abandoned" in note for note in data["notes"])


def test_the_log_set_aside_by_sim_tick_is_the_one_sim_usage_counts(
    demo_world: Path, stub_server: StubServer
) -> None:
    """End to end: a tick fails on a provider, the world is edited, the tick runs afresh
    (its old log is set aside by the engine); sim usage still counts the first run."""
    # a budget stop aborts the tick after tokens were spent (refusals no longer abort one)
    (demo_world / "config.toml").write_text("[budget]\nmax_total_tokens = 4000\n")
    args = ("--provider", "chat", "--base-url", stub_server.base_url)
    assert invoke("tick", "--world", str(demo_world), *args).exit_code == 1
    first = raw_books([log_path(demo_world, 1)])
    assert first["tokens"] > 0
    (demo_world / "config.toml").unlink()
    meta = orjson.loads((demo_world / "world.json").read_bytes())
    meta["description"] += " Edited."
    (demo_world / "world.json").write_bytes(orjson.dumps(meta))
    result = invoke("tick", "--world", str(demo_world), *args)
    assert result.exit_code == 0, result.output
    assert "set aside" in result.output
    aside = sorted((demo_world / ".sim" / "log" / "abandoned").glob("*.jsonl"))
    assert len(aside) == 1
    expected = raw_books([log_path(demo_world, 1), *aside])
    usage = invoke("usage", "--world", str(demo_world), "--by", "tick", "--json")
    assert orjson.loads(usage.output)["total"]["total_tokens"] == expected["tokens"]
    assert expected["tokens"] > raw_books([log_path(demo_world, 1)])["tokens"]


def test_attempts_that_timed_out_on_the_client_are_counted_as_maybe_billed(
    demo_world: Path, stub_server: StubServer
) -> None:
    (demo_world / "config.toml").write_text(
        # far past what an answered request takes even on a loaded machine: the one hung
        # request is the only one timed out
        "[llm]\ntimeout_seconds = 1.5\ntransient_retries = 1\nmax_failed_fraction = 1.0\n"
        "backoff_base_seconds = 0.001\nbackoff_cap_seconds = 0.01\n"
    )
    stub_server.options.hang_seconds = 5.0
    stub_server.enqueue("hang")  # the first request hangs past the client's timeout
    args = ("--provider", "chat", "--base-url", stub_server.base_url)
    result = invoke("tick", "--world", str(demo_world), *args)
    assert result.exit_code == 0, result.output
    assert "timed out (may be billed): 1 attempts" in result.output
    tick_all = invoke("log", "--world", str(demo_world), "--tick", "all")
    assert "1 timed out (may be billed)" in tick_all.output
    summary = orjson.loads(
        invoke("log", "--world", str(demo_world), "--tick", "all", "--json").output
    )
    assert summary["timed_out"] == 1
    usage = orjson.loads(
        invoke("usage", "--world", str(demo_world), "--by", "tick", "--json").output
    )
    assert usage["total"]["timed_out"] == 1
    assert any("timed out on the client (may be billed)" in n for n in usage["notes"])
