"""A pool of model servers over loopback HTTP: three stub servers, one stopped mid-tick.

``[llm] base_url`` lists three ``sim stub-server``s (in this process, so their counters
survive the stop). The third holds a request once it has answered a few, and is stopped
while that request is in flight, so the client loses a call mid-answer and every later
call to it is refused. The tick must commit with no failed call, the held call and the
rest of the tick served by the other two, no call generated (paid) twice anywhere, the
moved call sent with the same Idempotency-Key, and ``sim log --calls`` / ``sim usage --by
endpoint`` must say where each call went.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import copy_demo

from sim.cli import main
from sim.cli.common import build_config
from sim.config import InvalidConfig
from sim.testing.stub_server import ServerThread, StubOptions, StubServer
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

KEY = {"OPENAI_API_KEY": "sk-test"}
#: the stopped server answers at least this many generations (those already past the hold
#: when it began) before it holds one and is stopped
BEFORE_STOP = 3


@pytest.fixture
def servers() -> Iterator[list[tuple[ServerThread, StubServer]]]:
    threads = [ServerThread(StubServer(StubOptions(latency=0.03, seed=i))) for i in range(3)]
    started = [(thread, thread.start()) for thread in threads]
    yield started
    for thread, _ in started:
        if thread._thread.is_alive():
            thread.stop()


def write_config(path: Path, urls: list[str]) -> Path:
    listed = ", ".join(f'"{url}"' for url in urls)
    path.write_text(
        "[llm]\n"
        'provider = "chat"\n'
        f"base_url = [{listed}]\n"
        "max_concurrency = 6\n"
        "timeout_seconds = 20\n"
        "breaker_threshold = 2\n"
        "breaker_cooldown_seconds = 600\n"
    )
    return path


def stop_when_held(thread: ServerThread, server: StubServer) -> threading.Thread:
    """Stop ``server`` (from another thread) as soon as a request is held there."""

    def watch() -> None:
        deadline = time.monotonic() + 60
        while server.stats.held < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        thread.stop()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


def test_a_server_stopped_mid_tick_moves_its_calls_to_the_others(
    tmp_path: Path, servers: list[tuple[ServerThread, StubServer]]
) -> None:
    world = copy_demo(tmp_path / "demo")
    config = write_config(tmp_path / "config.toml", [s.base_url for _, s in servers])
    (_, a), (_, b), (c_thread, c) = servers
    c.hold(lambda request: c.stats.generations >= BEFORE_STOP)
    watcher = stop_when_held(c_thread, c)

    result = CliRunner().invoke(
        main,
        ["tick", "--world", str(world), "--config", str(config)],
        env=KEY,
        catch_exceptions=False,
    )
    watcher.join(60)
    assert result.exit_code == 0, result.output
    assert not c_thread._thread.is_alive(), "the third server was never stopped"
    summary = next(line for line in result.output.splitlines() if line.startswith("servers: "))
    c_part = summary.split(" · ")[2]
    assert "moved away" in c_part and "out of the pool" in c_part

    log = read_log(log_path(world, 1))
    assert log.committed
    calls = list(log.calls.values())
    assert calls and not [call.request_id for call in calls if call.failed]

    # every call was generated exactly once over the three servers: none paid twice
    generated = a.stats.generated_keys + b.stats.generated_keys + c.stats.generated_keys
    assert generated and max(generated.values()) == 1
    assert sum(generated.values()) == len(calls)
    answered_by_c = c.stats.generations  # requests already past the hold when it began
    assert answered_by_c >= BEFORE_STOP

    # the held call was lost mid-answer and moved with its key: another server generated it
    lost = set(c.stats.received_keys) - set(c.stats.generated_keys)
    assert lost
    assert lost <= set(a.stats.generated_keys) | set(b.stats.generated_keys)

    # the log says where each call went: C served only what it answered, A and B the rest
    served = Counter(call.endpoint for call in calls)
    assert served[c.base_url] == answered_by_c
    assert served[a.base_url] + served[b.base_url] == len(calls) - answered_by_c
    assert served[a.base_url] > 0 and served[b.base_url] > 0
    moved = [
        call
        for call in calls
        if any(att.endpoint == c.base_url and att.error_code for att in call.attempts)
    ]
    assert moved, "no call records an attempt that failed on the stopped server"
    for call in moved:
        assert call.endpoint in (a.base_url, b.base_url)
        assert call.attempts[-1].endpoint == call.endpoint
        assert call.attempts[-1].error_code is None

    lines = CliRunner().invoke(main, ["log", "--world", str(world), "--calls"]).output
    c_host = c.base_url.split("//")[1].split("/")[0]
    assert f"(moved from {c_host})" in lines
    assert f"@ {a.base_url.split('//')[1].split('/')[0]}" in lines

    usage = CliRunner().invoke(
        main, ["usage", "--world", str(world), "--by", "endpoint", "--json"], env=KEY
    )
    assert usage.exit_code == 0, usage.output
    rows = {row["key"]: row for row in orjson.loads(usage.output)["rows"]}
    assert rows[c.base_url]["requests"] == answered_by_c
    assert rows[a.base_url]["requests"] + rows[b.base_url]["requests"] == len(calls) - answered_by_c
    assert sum(row["requests"] for row in rows.values()) == len(calls)
    assert rows[c.base_url]["output_tokens"] == c.stats.output_tokens
    assert rows[a.base_url]["output_tokens"] == a.stats.output_tokens


def test_a_phase_can_have_its_own_pool(
    tmp_path: Path, servers: list[tuple[ServerThread, StubServer]]
) -> None:
    world = copy_demo(tmp_path / "demo")
    (_, a), (_, b), (_, c) = servers
    config = tmp_path / "config.toml"
    config.write_text(
        f'[llm]\nprovider = "chat"\nbase_url = "{c.base_url}"\n\n'
        f'[phase2a]\nbase_url = ["{a.base_url}", "{b.base_url}"]\n'
    )
    result = CliRunner().invoke(
        main, ["tick", "--world", str(world), "--config", str(config)], env=KEY
    )
    assert result.exit_code == 0, result.output
    calls = list(read_log(log_path(world, 1)).calls.values())
    where = {
        (call.phase, call.endpoint) for call in calls if call.phase in ("resolution", "narrative")
    }
    resolution = {endpoint for phase, endpoint in where if phase == "resolution"}
    assert resolution == {a.base_url, b.base_url}
    assert {endpoint for phase, endpoint in where if phase == "narrative"} == {c.base_url}
    assert a.stats.generations + b.stats.generations == sum(
        1 for call in calls if call.phase == "resolution"
    )


def test_the_command_line_takes_several_servers_comma_separated(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "demo")
    urls = "http://127.0.0.1:8001/v1, http://127.0.0.1:8002/v1"
    config = build_config(None, world, "chat", base_url=urls)
    assert config.llm.base_url == ("http://127.0.0.1:8001/v1", "http://127.0.0.1:8002/v1")
    assert config.phase("phase2a").endpoint(config.llm)[1] == config.llm.base_url
    with pytest.raises(InvalidConfig, match="listed twice"):
        build_config(None, world, "chat", base_url="http://a/v1,http://a/v1")


def test_the_pool_benchmark_runs_end_to_end() -> None:
    """bench/pool.py (``make bench`` section 9) at a tiny size, a server killed mid-tick:
    every call answered (no timing asserts: benchmarks are not timed tests)."""
    from bench.pool import pool_tick

    result = pool_tick(20, 0.01, 2, 3, kill=True)
    assert result["calls"] > 0 and result["failures"] == 0
    assert sum(result["answered"]) == result["calls"]
    assert result["ideal_s"] > 0 and result["efficiency"] > 0
