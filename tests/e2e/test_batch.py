"""The OpenAI Batch API end to end: `sim tick --batch` with the real openai SDK against the
stub server's files and batches routes on loopback.

The stub generates each batch line as it would the same request sent live (same model,
faults and counters) and counts, per ``custom_id``, how often it generated it: a test
asserts that no call was paid for twice, across a kill -9 while polling too.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import REPO, copy_demo, interruptible_children, tree

from sim.cli import main
from sim.config import load_config
from sim.engine.runner import Runner
from sim.llm.batching import BATCH_PRICE_FACTOR
from sim.testing.stub_server import ServerThread, StubOptions, StubServer
from sim.ticklog.books import attempts_cost
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

BASE_TICK = 5  # tick 6 of the demo calls every LLM phase
KEY = {"OPENAI_API_KEY": "sk-test"}
CONFIG = "[llm]\nbatch_poll_seconds = 0.05\nbackoff_base_seconds = 0.01\n"
#: response ids are the server's random ids: the same answer has another id in each run
IDS = re.compile(rb"(resp_|chatcmpl-)[0-9a-f]{32}")
#: the stub models prompt caching: a request whose instructions it has seen before counts
#: cached input tokens, so the second of two runs against one server sees more of them
CACHED = re.compile(rb',\n\s*"total_cached_input_tokens": \d+')


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    world = copy_demo(tmp_path_factory.mktemp("base") / "demo")
    Runner(world, load_config(world_dir=world, cwd=world)).run(BASE_TICK)
    (world / "config.toml").write_text(CONFIG)
    return world


@pytest.fixture
def server() -> Iterator[StubServer]:
    thread = ServerThread(StubServer(StubOptions(seed=3, batch_delay=0.1)))
    yield thread.start()
    thread.stop()


def scratch(base: Path, tmp_path: Path, name: str) -> Path:
    world = tmp_path / name
    shutil.copytree(base, world)
    return world


def args(world: Path, server: StubServer, *extra: str, provider: str = "openai") -> list[str]:
    return [
        "tick",
        "--world",
        str(world),
        "--provider",
        provider,
        "--base-url",
        server.base_url,
        *extra,
    ]


def run(world: Path, server: StubServer, *extra: str, provider: str = "openai") -> Result:
    result = CliRunner().invoke(
        main, args(world, server, *extra, provider=provider), env=KEY, catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return result


def normalised(world: Path) -> dict[str, bytes]:
    """The world's files with the server's response ids replaced (they are random) and
    the cached-token counts left out (the stub's prompt cache is warm for a second run)."""
    return {rel: CACHED.sub(b"", IDS.sub(rb"\1ID", data)) for rel, data in tree(world).items()}


def batches_of(world: Path, tick: int = BASE_TICK + 1) -> list[tuple[str, list[str]]]:
    """(phase, custom ids) of each batch the tick's log records, in order."""
    log = read_log(log_path(world, tick))
    return [(b.phase, [line.custom_id for line in b.lines]) for b in log.batches]


def assert_paid_once(server: StubServer) -> None:
    generated = server.batches.generated
    assert generated, "nothing was generated through a batch"
    twice = {cid: n for cid, n in generated.items() if n > 1}
    assert not twice, f"generated more than once: {twice}"
    assert len(server.batches.lines) == len(set(server.batches.lines)), "a line sent twice"


@pytest.mark.parametrize("provider", ["openai", "chat"])
def test_batch_tick_commits_the_same_world_as_a_live_tick(
    base: Path, tmp_path: Path, server: StubServer, provider: str
) -> None:
    live = scratch(base, tmp_path, "live")
    batched = scratch(base, tmp_path, "batched")
    run(live, server, provider=provider)
    live_generations = server.stats.generations
    assert not server.batches.lines  # the live tick used no batch
    result = run(batched, server, "--batch", provider=provider)

    assert server.stats.generations == 2 * live_generations
    assert_paid_once(server)
    # the same world, with the chains' response ids (random per answer) set aside
    assert normalised(batched) == normalised(live)
    # one batch per phase with calls, holding each of the phase's calls once
    log = read_log(log_path(batched, BASE_TICK + 1))
    phases = [phase for phase, _ in batches_of(batched)]
    assert phases == [p for p in ("intentions", "resolution", "narrative", "memory") if p in phases]
    assert len(phases) == len(set(phases)) >= 3
    assert sum(len(ids) for _, ids in batches_of(batched)) == len(log.calls)
    # every call is an ordinary record, marked with its batch and priced at the batch rate
    prices = load_config(world_dir=batched, cwd=batched).prices
    live_log = read_log(log_path(live, BASE_TICK + 1))
    for rid, call in log.calls.items():
        assert call.batch_ids and call.batch_ids[0] in {b.batch_id for b in log.batches}
        full = attempts_cost(call.attempts, prices).value
        assert full is not None and full > 0
        assert call.cost_usd == pytest.approx(full * BATCH_PRICE_FACTOR)
        assert live_log.calls[rid].batch_ids is None
        assert live_log.calls[rid].result == call.result
    # the progress line (stderr)
    assert "batch batch_" in result.stderr and "completed" in result.stderr

    # sim usage prices the batch tick at half the live one's cost (same tokens)
    usage_live = CliRunner().invoke(main, ["usage", "--world", str(live), "--json"])
    usage_batch = CliRunner().invoke(main, ["usage", "--world", str(batched), "--json"])
    assert usage_live.exit_code == usage_batch.exit_code == 0
    calls = CliRunner().invoke(
        main, ["log", "--world", str(batched), "--tick", str(BASE_TICK + 1), "--calls"]
    )
    assert calls.exit_code == 0, calls.output
    assert calls.output.count("  batch\n") == len(log.calls)
    assert f"batch {log.batches[0].batch_id}: intentions" in calls.output
    # replay of the batch tick: offline, from the log, identical
    replayed = CliRunner().invoke(
        main, ["replay", "--world", str(batched), "--tick", str(BASE_TICK + 1)]
    )
    assert replayed.exit_code == 0, replayed.output
    assert "identical" in replayed.output


def test_a_batch_tick_with_workers_runs_in_one_process_and_says_so(
    base: Path, tmp_path: Path, server: StubServer
) -> None:
    """A phase's calls go as one batch from one process: ``--workers 2 --batch`` runs
    the tick there (a note says why), the same world as ``--workers 1``, each call paid
    once."""
    alone = scratch(base, tmp_path, "alone")
    sharded = scratch(base, tmp_path, "sharded")
    run(alone, server, "--batch")
    result = run(sharded, server, "--batch", "--workers", "2")
    assert "--workers 2: ran in one process ([llm] batch" in result.output
    # each call generated once by each run (the two worlds ask the same calls)
    assert server.batches.generated and set(server.batches.generated.values()) == {2}
    assert normalised(sharded) == normalised(alone)
    assert [p for p, _ in batches_of(sharded)] == [p for p, _ in batches_of(alone)]


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "ctrl-c"])
def test_stopped_while_polling_resumes_the_same_batch(
    base: Path, tmp_path: Path, server: StubServer, signum: int
) -> None:
    world = scratch(base, tmp_path, "killed")
    server.batches.delay = 60.0  # the first batch stays in progress until the kill
    env = {**os.environ, **KEY, "PYTHONPATH": str(REPO)}
    with interruptible_children():  # Ctrl-C reaches it even if ours is ignored
        child = subprocess.Popen(
            [sys.executable, "-m", "sim", *args(world, server, "--batch")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    try:
        deadline = time.monotonic() + 60
        log = log_path(world, BASE_TICK + 1)
        while time.monotonic() < deadline:
            if log.is_file() and b'"type":"batch"' in log.read_bytes():
                break
            assert child.poll() is None, child.communicate()[1].decode()
            time.sleep(0.02)
        else:
            pytest.fail("the child never logged its batch")
        time.sleep(0.2)  # polling now
        child.send_signal(signum)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # kill -9 ends it on the spot; Ctrl-C stops the polling and exits 130, resumable
    assert child.returncode == (-signal.SIGKILL if signum == signal.SIGKILL else 130)
    first = batches_of(world)
    assert len(first) == 1 and first[0][0] == "intentions"
    assert len(server.batches.batches) == 1
    assert not server.batches.generated  # still in progress at the kill

    server.batches.delay = 0.1
    result = run(world, server, "--batch")
    assert "(resumed)" in result.stderr
    # the intentions batch was polled again, not submitted again
    after = batches_of(world)
    assert after[0] == first[0]
    assert [phase for phase, _ in after].count("intentions") == 1
    assert len(server.batches.batches) == len(after)
    assert_paid_once(server)
    log = read_log(log_path(world, BASE_TICK + 1))
    assert log.committed and log.resumes == 1
    assert sum(server.batches.generated.values()) == len(log.calls)
    intentions = [c for c in log.calls.values() if c.phase == "intentions"]
    assert intentions
    assert all(c.batch_ids == [log.batches[0].batch_id] for c in intentions)


def test_failed_lines_are_retried_in_a_batch_of_their_own(
    base: Path, tmp_path: Path, server: StubServer
) -> None:
    world = scratch(base, tmp_path, "faults")
    # the first line answers invalid JSON (a schema retry with feedback), the second a 500
    # (a transient retry); every other line is fine
    server.enqueue("malformed", "server_error")
    run(world, server, "--batch")
    batches = batches_of(world)
    assert [phase for phase, _ in batches][:2] == ["intentions", "intentions"]
    first, retry = batches[0][1], batches[1][1]
    failed = first[:2]
    assert sorted(retry) == sorted(cid.replace("#0", "#1") for cid in failed)
    assert_paid_once(server)
    log = read_log(log_path(world, BASE_TICK + 1))
    assert log.committed and log.failures() == 0
    for cid, code in zip(failed, ["schema_error", "server_error"], strict=True):
        call = log.calls[cid.partition("#")[0]]
        assert [a.error_code for a in call.attempts] == [code, None]
        assert call.batch_ids == [log.batches[0].batch_id, log.batches[1].batch_id]


def test_fallback_model_goes_into_a_retry_batch(
    base: Path, tmp_path: Path, server: StubServer
) -> None:
    world = scratch(base, tmp_path, "fallback")
    (world / "config.toml").write_text(
        CONFIG
        + "transient_retries = 0\n\n"
        + "[phase2b]\nmodel = 'narrator'\nfallback_models = ['gpt-4.1-nano']\n"
    )
    server.model_faults["narrator"] = "server_error"
    run(world, server, "--batch")
    log = read_log(log_path(world, BASE_TICK + 1))
    narratives = [c for c in log.calls.values() if c.phase == "narrative"]
    assert narratives and all(c.response_model == "gpt-4.1-nano" for c in narratives)
    phases = [phase for phase, _ in batches_of(world)]
    assert phases.count("narrative") == 2  # the model asked for, then the fallback model
    assert_paid_once(server)


def test_expired_batch_sends_what_did_not_run_again(
    base: Path, tmp_path: Path, server: StubServer
) -> None:
    world = scratch(base, tmp_path, "expired")
    server.batches.expire_next(3)  # the first batch runs 3 lines, then its window ends
    result = run(world, server, "--batch")
    assert "expired" in result.stderr
    batches = batches_of(world)
    first, retry = batches[0][1], batches[1][1]
    assert batches[1][0] == "intentions"
    assert sorted(retry) == sorted(cid.replace("#0", "#1") for cid in first[3:])
    assert_paid_once(server)
    generated = [cid for cid in server.batches.generated if cid.startswith("6:intentions:")]
    assert len(generated) == len(first)
    log = read_log(log_path(world, BASE_TICK + 1))
    assert log.committed and log.failures() == 0
    expired = [log.calls[cid.partition("#")[0]] for cid in first[3:]]
    assert all([a.error_code for a in c.attempts] == ["batch_expired", None] for c in expired)


def test_batch_needs_a_provider_with_a_batch_api(demo_world: Path) -> None:
    result = CliRunner().invoke(main, ["tick", "--world", str(demo_world), "--batch"])
    assert result.exit_code == 2
    assert "llm.batch" in result.output and "offline" in result.output
    assert not (demo_world / ".sim" / "log").exists()


def test_the_batch_api_goes_on_the_adapters_own_connections(
    base: Path, tmp_path: Path, server: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files, batches and their polls go through the adapter's aiohttp routes, as its
    calls do: no SDK client is made (the SDK is for a client a user hands in)."""
    import openai

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("an SDK client was made")

    monkeypatch.setattr(openai, "AsyncOpenAI", refused)
    world = scratch(base, tmp_path, "batched")
    run(world, server, "--batch")
    assert_paid_once(server)
    assert batches_of(world), "no batch was recorded"
