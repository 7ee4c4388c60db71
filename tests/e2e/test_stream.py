"""``sim tick --stream`` and Ctrl-C over loopback HTTP: narratives shown as they are written,
place by place; one Ctrl-C stops the calls in flight (logged ``interrupted`` with their
partial text) and the tick resumes as before; a second Ctrl-C exits at once."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import interruptible_children

from sim.cli import main
from sim.cli.progress import partial_string
from sim.storage import Storage
from sim.testing.stub_server import ServerThread, StubOptions, StubServer
from sim.ticklog.reader import read_log_bytes


def slow_narratives() -> StubOptions:
    """The narratives' streams slow (0.3 s between events), every other phase's at full
    speed: the tick reaches its narratives in a second or two, not half a minute."""
    return StubOptions(stream_chunk_delay=0.3, slow_stream_field="narrative")


def configure(world: Path, base_url: str) -> Path:
    (world / "config.toml").write_text(
        f'[llm]\nprovider = "chat"\nbase_url = "{base_url}"\n'
        "backoff_base_seconds = 0.01\nbackoff_cap_seconds = 0.05\n"
    )
    return world


def records(world: Path, tick: int = 1) -> list[dict[str, object]]:
    log = world / ".sim" / "log" / f"tick-{tick:06d}.jsonl"
    return [json.loads(line) for line in read_log_bytes(log).splitlines()]


def test_partial_string_reads_a_field_as_it_arrives() -> None:
    assert partial_string('{"narr', "narrative") is None
    assert partial_string('{"narrative": ', "narrative") is None
    assert partial_string('{"narrative": "Fog ro', "narrative") == "Fog ro"
    assert partial_string('{"narrative":"a\\nb \\"c\\', "narrative") == 'a\nb "c'
    assert partial_string('{"narrative":"caf\\u00e9", "x": 1}', "narrative") == "café"
    assert partial_string('{"narrative":"caf\\u00', "narrative") == "caf"
    assert partial_string("", "narrative") is None
    assert partial_string("not json", "narrative") is None
    assert partial_string('{"narrative": 5', "narrative") is None
    assert partial_string('{"other": "x", "narrative": "y', "narrative") == "y"


def test_tick_stream_shows_each_narrative_then_the_summary(demo_world: Path) -> None:
    with ServerThread(StubServer(StubOptions(stream_chunk_delay=0.001))) as server:
        world = configure(demo_world, server.base_url)
        result = CliRunner().invoke(
            main,
            ["tick", "--world", str(world), "--stream", "--trust-world-config"],
            catch_exceptions=False,
        )
        streamed = sum(1 for body in server.log if body.get("stream") is True)
    assert result.exit_code == 0, result.output
    assert streamed == len(server.log) > 0  # every call was streamed
    live, _, summary = result.output.partition("== tick 1 ==")
    narratives = {
        str(r["entity_key"]).partition(":")[2]: r["result"]["narrative"]  # type: ignore[index]
        for r in records(world)
        if r["type"] == "call" and r["phase"] == "narrative"
    }
    assert narratives
    names = Storage(world).load().locations
    for lid, text in narratives.items():
        # shown whole, in one piece under its place's name, before the summary, and not
        # again after it
        name = names[lid]["identity"]["name"]
        assert f"[{name}]\n{text}\n" in live
        assert f"[{name}]" not in summary and text not in summary
    assert f"narratives: {len(narratives)} places, shown above" in summary
    assert "phase        calls" in summary


def _run_until(process: subprocess.Popen[str], marker: str, seconds: float) -> str:
    """Read the process's stdout until ``marker`` appears."""
    assert process.stdout is not None
    seen = ""
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + seconds
    while marker not in seen:
        if time.monotonic() > deadline or process.poll() is not None:
            raise AssertionError(f"never saw {marker!r}; output so far:\n{seen}")
        if selector.select(0.1):
            seen += os.read(process.stdout.fileno(), 65536).decode()
    return seen


def _start(world: Path) -> subprocess.Popen[str]:
    with interruptible_children():  # the tests send it Ctrl-C
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sim",
                "tick",
                "--world",
                str(world),
                "--stream",
                "--trust-world-config",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


@pytest.mark.slow
def test_ctrl_c_stops_streamed_calls_logs_them_and_the_tick_resumes(demo_world: Path) -> None:
    # slow narrative streams: each takes seconds, so the narratives are mid-way at Ctrl-C
    # (the phases before them stream at full speed)
    with ServerThread(StubServer(slow_narratives())) as server:
        world = configure(demo_world, server.base_url)
        process = _start(world)
        try:
            _run_until(process, "\n[", 120)  # a place's narrative is being written
            time.sleep(0.5)
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=20)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == 130, err
        assert "resume" in err or "again" in err
        assert Storage(world).load().tick == 0  # nothing committed
        log = records(world)
        interrupted = [r for r in log if r["type"] == "interrupted"]
        assert interrupted and all(r["phase"] == "narrative" for r in interrupted)
        assert any(str(r["partial"]).startswith('{"narrative"') for r in interrupted)
        done = {r["request_id"] for r in log if r["type"] == "call"}
        assert not done & {r["request_id"] for r in interrupted}
        # resumable exactly as before: the logged calls are reused, the rest sent again
        server.options.stream_chunk_delay = 0.0
        before = server.stats.generations
        result = CliRunner().invoke(
            main, ["tick", "--world", str(world), "--trust-world-config"], catch_exceptions=False
        )
        assert result.exit_code == 0, result.output
        assert f"resumed: {len(done)} calls taken from the interrupted tick's log" in (
            result.output
        )
        resent = server.stats.generations - before
    assert Storage(world).load().tick == 1
    calls = [r for r in records(world) if r["type"] == "call"]
    assert resent == len({r["request_id"] for r in calls}) - len(done)


@pytest.mark.slow
def test_a_second_ctrl_c_exits_at_once(demo_world: Path) -> None:
    with ServerThread(StubServer(slow_narratives())) as server:
        world = configure(demo_world, server.base_url)
        process = _start(world)
        try:
            _run_until(process, "\n[", 120)
            process.send_signal(signal.SIGINT)
            process.send_signal(signal.SIGINT)
            started = time.monotonic()
            _, err = process.communicate(timeout=20)
            took = time.monotonic() - started
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 130, err
    assert took < 5
    assert "Traceback" not in err
    assert Storage(world).load().tick == 0
