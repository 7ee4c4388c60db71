"""Replay, rewind, fork and `sim log` on scratch copies of the demo world."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import copy_demo, tree

from sim.cli import main
from sim.config import load_config
from sim.engine.replay import replay
from sim.engine.rewind import rewind
from sim.engine.runner import Runner
from sim.llm.budget import Price, cost_usd
from sim.llm.types import Usage
from sim.testing.logs import plain_log
from sim.ticklog.format import list_logs, log_path
from sim.ticklog.reader import read_log

PROMPTS = Path(__file__).resolve().parents[2] / "sim" / "prompts"


def run(world: Path, ticks: int) -> list:
    return Runner(world, load_config(world_dir=world, cwd=world)).run(ticks)


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def five_ticks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo world after 5 offline ticks (shared read-only: copy before changing it)."""
    world = copy_demo(tmp_path_factory.mktemp("five") / "demo")
    run(world, 5)
    return world


def test_replay_of_five_ticks_is_identical_and_touches_nothing(five_ticks: Path) -> None:
    before = tree(five_ticks, logs=True)
    config = load_config(world_dir=five_ticks, cwd=five_ticks)
    report = replay(five_ticks, 1, 5, config=config)
    assert [t.tick for t in report.ticks] == [1, 2, 3, 4, 5]
    assert report.identical, [(t.tick, t.drifts[:1], t.differing_files) for t in report.ticks]
    # every call of every tick was answered from its log, none sent
    for t in report.ticks:
        assert t.served == len(read_log(log_path(five_ticks, t.tick)).calls) > 0
        assert t.sent == 0
    assert tree(five_ticks, logs=True) == before
    result = invoke("replay", "--world", str(five_ticks), "--tick", "1", "--to", "5")
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith("identical")


def test_a_changed_prompt_names_exactly_the_requests_that_drifted(
    five_ticks: Path, tmp_path: Path
) -> None:
    world = tmp_path / "w"

    shutil.copytree(five_ticks, world)
    (world / "prompts").mkdir()
    text = (PROMPTS / "intentions.md").read_text() + "\nAlways prefer to speak.\n"
    (world / "prompts" / "intentions.md").write_text(text)
    config = load_config(world_dir=world, cwd=world)
    report = replay(world, 2, 4, config=config)
    assert not report.identical
    expected = {
        rid
        for t in (2, 3, 4)
        for rid in read_log(log_path(world, t)).calls
        if ":intentions:" in rid
    }
    assert {d.request_id for d in report.drifts} == expected
    assert all(d.fields == ("instructions",) for d in report.drifts)
    assert "+Always prefer to speak." in report.drifts[0].diff
    assert all(t.state_matches for t in report.ticks)  # answers served as recorded
    result = invoke("replay", "--world", str(world), "--tick", "3")
    assert result.exit_code == 1
    assert "instructions differ" in result.output and "drifted" in result.output


def test_live_replay_sends_only_the_drifted_requests(five_ticks: Path, tmp_path: Path) -> None:
    world = tmp_path / "w"

    shutil.copytree(five_ticks, world)
    (world / "prompts").mkdir()
    text = (PROMPTS / "narrative.md").read_text() + "\nEnd on the weather.\n"
    (world / "prompts" / "narrative.md").write_text(text)
    config = load_config(world_dir=world, cwd=world)
    report = replay(world, 2, config=config, live=True)
    tick = report.ticks[0]
    narratives = [rid for rid in read_log(log_path(world, 2)).calls if ":narrative:" in rid]
    assert tick.sent == len(narratives) == len(tick.drifts)
    assert tick.narratives != tick.recorded_narratives


def test_rewind_then_retick_reproduces_the_same_files(five_ticks: Path, tmp_path: Path) -> None:
    world = tmp_path / "w"

    shutil.copytree(five_ticks, world)
    after_five = tree(world)
    done = rewind(world, 3)
    assert orjson.loads((world / "world.json").read_bytes())["tick"] == 2
    assert [t for t, _ in list_logs(world)] == [1, 2]
    assert done.moved_to is not None and done.logs_moved == 3
    assert sorted(p.name for p in done.moved_to.iterdir()) == [
        "tick-000003.jsonl",
        "tick-000004.jsonl",
        "tick-000005.jsonl",
    ]
    run(world, 3)
    assert tree(world) == after_five
    # the state after the re-run ticks is the one the moved-aside logs recorded
    old = read_log(done.moved_to / "tick-000005.jsonl")
    new = read_log(log_path(world, 5))
    assert new.commit is not None and old.commit is not None
    assert new.commit.state_after == old.commit.state_after


def test_rewind_via_cli_to_the_start(five_ticks: Path, tmp_path: Path) -> None:
    world = tmp_path / "w"

    shutil.copytree(five_ticks, world)
    result = invoke("rewind", "--world", str(world), "--tick", "1")
    assert result.exit_code == 0, result.output
    original = copy_demo(tmp_path / "fresh")
    assert {k: v for k, v in tree(world).items() if not k.startswith(".sim/")} == tree(original)
    assert not (world / ".sim" / "responses").exists() or not any(
        (world / ".sim" / "responses").rglob("*.json")
    )
    bad = invoke("rewind", "--world", str(world), "--tick", "4")
    assert bad.exit_code == 2 and "--tick" in bad.output


def test_fork_leaves_the_original_untouched(five_ticks: Path, tmp_path: Path) -> None:
    before = tree(five_ticks, logs=True)
    dest = tmp_path / "fork"
    result = invoke("fork", "--world", str(five_ticks), "--tick", "4", "--to", str(dest))
    assert result.exit_code == 0, result.output
    assert tree(five_ticks, logs=True) == before
    assert orjson.loads((dest / "world.json").read_bytes())["tick"] == 3
    assert [t for t, _ in list_logs(dest)] == [1, 2, 3]
    run(dest, 2)  # the fork runs ticks 4 and 5 exactly as the original did
    assert tree(dest) == tree(five_ticks)
    again = invoke("fork", "--world", str(five_ticks), "--tick", "4", "--to", str(dest))
    assert again.exit_code == 2


def test_sim_log_shows_a_tick_and_a_summary(five_ticks: Path, tmp_path: Path) -> None:
    result = invoke("log", "--world", str(five_ticks))
    assert result.exit_code == 0, result.output
    assert "== tick 5 ==" in result.output and "intends" in result.output
    result = invoke("log", "--world", str(five_ticks), "--tick", "all")
    lines = result.output.strip().splitlines()
    assert len(lines) == 6 and lines[0].split()[:3] == ["tick", "calls", "failures"]
    result = invoke("log", "--world", str(five_ticks), "--tick", "2", "--json")
    records = [orjson.loads(line) for line in result.output.splitlines()]
    assert records[0]["type"] == "header" and records[-1]["type"] == "commit"
    assert {r["type"] for r in records} >= {"state_before", "call", "phase", "usage"}
    # the records as the tick wrote them, byte for byte (the log is compressed now: the
    # same records as a plain log written from it)
    copy = tmp_path / "copy"
    shutil.copytree(five_ticks, copy)
    assert result.output.encode() == plain_log(copy, 2).read_bytes()


def test_an_unreadable_log_is_reported_not_skipped(five_ticks: Path, tmp_path: Path) -> None:
    world = tmp_path / "w"

    shutil.copytree(five_ticks, world)
    plain_log(world, 3).write_bytes(b'{"type": "header", "format": 1}\n{oops\n{"type":"x"}\n')
    result = CliRunner().invoke(main, ["log", "--world", str(world), "--tick", "all"])
    assert result.exit_code == 1
    assert "tick-000003.jsonl: line 2" in result.output
    result = CliRunner().invoke(main, ["replay", "--world", str(world), "--tick", "3"])
    assert result.exit_code == 1 and "line 2" in result.output


def test_a_config_change_replays_with_the_logged_config_and_names_the_key(
    five_ticks: Path, tmp_path: Path
) -> None:
    world = tmp_path / "w"
    shutil.copytree(five_ticks, world)
    (world / "config.toml").write_text("[phase2b]\ntemperature = 1.0\n")
    report = replay(world, 4, config=load_config(world_dir=world, cwd=world))
    assert report.identical  # the tick re-ran with the settings it was logged with
    assert report.ticks[0].config_changes == ["phase2b.temperature: logged 0.9, now 1.0"]


def test_a_request_the_log_lacks_is_reported_missing(five_ticks: Path, tmp_path: Path) -> None:
    world = tmp_path / "w"
    shutil.copytree(five_ticks, world)
    path = plain_log(world, 5)
    lines = [
        line
        for line in path.read_bytes().splitlines(keepends=True)
        if b'"request_id":"5:memory:memory:ada:0"' not in line
    ]
    path.write_bytes(b"".join(lines))
    report = replay(world, 5, config=load_config(world_dir=world, cwd=world))
    (drift,) = report.drifts
    assert drift.request_id == "5:memory:memory:ada:0" and drift.fields == ("missing",)
    assert not report.ticks[0].state_matches  # ada's memory fell back: the state differs


def test_live_replay_over_http_sends_the_provider_only_the_drifted_requests(
    five_ticks: Path, tmp_path: Path, stub_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = tmp_path / "w"
    shutil.copytree(five_ticks, world)
    (world / "prompts").mkdir()
    text = (PROMPTS / "narrative.md").read_text() + "\nEnd on the weather.\n"
    (world / "prompts" / "narrative.md").write_text(text)
    (world / "config.toml").write_text(
        f'[llm]\nprovider = "chat"\nbase_url = "{stub_server.base_url}"\n'
        # the recorded settings: only the prompt differs
    )
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    result = invoke(
        "replay", "--world", str(world), "--tick", "3", "--live", "--trust-world-config"
    )
    assert result.exit_code == 1, result.output
    narratives = [rid for rid in read_log(log_path(world, 3)).calls if ":narrative:" in rid]
    assert stub_server.stats.generations == len(narratives) > 0
    assert f"sent live: {len(narratives)}" in result.output


def test_the_log_prices_a_tick_like_the_provider_billed_it(
    demo_world: Path, stub_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    url = stub_server.base_url
    result = invoke("tick", "--world", str(demo_world), "--provider", "chat", "--base-url", url)
    assert result.exit_code == 0, result.output
    summary = orjson.loads(
        invoke("log", "--world", str(demo_world), "--tick", "all", "--json").output.splitlines()[0]
    )
    stats = stub_server.stats
    billed = cost_usd(
        Usage(stats.input_tokens, stats.output_tokens, stats.cached_tokens),
        Price(input=0.4, cached_input=0.1, output=1.6),  # gpt-4.1-mini in the default prices
    )
    assert summary["calls"] == stats.generations
    assert summary["cost"] == pytest.approx(billed, rel=1e-6) and billed > 0
    assert "$" in invoke("log", "--world", str(demo_world), "--tick", "all").output


def test_a_tick_with_retries_and_failures_over_http_replays_identical(
    demo_world: Path, stub_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Earlier attempts (retries) and failed calls are logged, and replay reproduces them:
    the usage they cost, the fallbacks they caused."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    (demo_world / "config.toml").write_text(
        "[llm]\nbackoff_base_seconds = 0.001\nbackoff_cap_seconds = 0.01\n"
        "max_failed_fraction = 1.0\n"
    )
    stub_server.options.fault_rate = 0.3
    stub_server.options.faults = ("rate_limit", "server_error", "malformed", "refusal")
    url = stub_server.base_url
    args = ("--provider", "chat", "--base-url", url)
    result = invoke("tick", "--world", str(demo_world), "--ticks", "2", *args)
    assert result.exit_code == 0, result.output
    calls = [c for t in (1, 2) for c in read_log(log_path(demo_world, t)).calls.values()]
    assert any(len(c.attempts) > 1 for c in calls)  # retried, every attempt logged
    assert any(c.error_code for c in calls)  # and some failed for good (refusal)
    replayed = invoke("replay", "--world", str(demo_world), "--tick", "1", "--to", "2")
    assert replayed.exit_code == 0, replayed.output
    assert replayed.output.strip().endswith("identical")


def test_tool_calling_ticks_are_logged_and_replay_identical(demo_world: Path) -> None:
    (demo_world / "config.toml").write_text('[phase1]\nmode = "tools"\n')
    assert invoke("tick", "--world", str(demo_world), "--ticks", "2").exit_code == 0
    call = next(iter(read_log(log_path(demo_world, 2)).calls.values()))
    assert call.schema_name == "ToolCalls" and call.result_type == "sim.llm.tools:ToolCalls"
    result = invoke("replay", "--world", str(demo_world), "--tick", "1", "--to", "2")
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith("identical")


def test_replay_of_the_last_tick_names_a_world_file_edited_since(
    five_ticks: Path, tmp_path: Path
) -> None:
    """Issue 39: replay rebuilt the tick from its log and compared it with the log only, so
    a character file edited after the last commit replayed 'identical'."""
    world = tmp_path / "w"
    shutil.copytree(five_ticks, world)
    path = sorted((world / "characters").glob("*.json"))[0]
    data = orjson.loads(path.read_bytes())
    data["state"]["mood"] = "edited by hand"
    path.write_bytes(orjson.dumps(data))
    result = invoke("replay", "--world", str(world), "--tick", "5")
    assert result.exit_code == 1, result.output
    assert f"characters/{path.name}" in result.output and "edited since" in result.output
    # an earlier tick is not the world's last: its replay is still identical
    assert invoke("replay", "--world", str(world), "--tick", "4").exit_code == 0
