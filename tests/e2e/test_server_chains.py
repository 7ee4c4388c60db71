"""Server-kept chains that a server does not keep (issue 25): ``chain_mode = "server"``
through a Responses server that ignores ``previous_response_id`` stops the run and names
``chain_mode = "window"``; one that reports no usage is said to be uncheckable and runs
on; a 404 on deleting a response this run made is reported. Full ``sim tick`` runs of the
demo world against the stub server over real HTTP."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result
from conftest import tree

from sim.cli import main
from sim.storage import Storage
from sim.testing.stub_server import StubServer

CONFIG = """
[llm]
timeout_seconds = 5
backoff_base_seconds = 0.01
backoff_cap_seconds = 0.05
chain_mode = "server"
"""


def tick(world: Path, server: StubServer, ticks: int = 1) -> Result:
    (world / "config.toml").write_text(CONFIG)
    return CliRunner().invoke(
        main,
        [
            *("tick", "--world", str(world), "--provider", "openai"),
            *("--base-url", server.base_url, "--ticks", str(ticks)),
        ],
        env={"OPENAI_API_KEY": "sk-test"},
        catch_exceptions=False,
    )


def committed_tick(world: Path) -> int:
    return int(Storage(world).load().meta["tick"])


def test_a_server_ignoring_previous_response_id_stops_the_run(
    demo_world: Path, stub_server: StubServer
) -> None:
    stub_server.options.ignore_previous_response_id = True
    result = tick(demo_world, stub_server, ticks=3)
    assert result.exit_code != 0, result.output
    assert "ignores previous_response_id" in result.output
    assert 'chain_mode = "window"' in result.output
    assert committed_tick(demo_world) == 1  # the first tick chains nothing; the second stops


def test_a_later_run_looks_the_previous_response_up(
    demo_world: Path, stub_server: StubServer
) -> None:
    stub_server.options.ignore_previous_response_id = True
    assert tick(demo_world, stub_server).exit_code == 0
    before = tree(demo_world)
    result = tick(demo_world, stub_server)  # a new run: it knows no sizes of its own
    assert result.exit_code != 0, result.output
    assert "ignores previous_response_id" in result.output
    assert tree(demo_world) == before  # nothing committed
    assert stub_server.stats.by_route["GET /v1/responses"] >= 1


def test_a_server_keeping_its_chains_runs_on_and_is_not_looked_up_each_call(
    demo_world: Path, stub_server: StubServer
) -> None:
    assert tick(demo_world, stub_server, ticks=2).exit_code == 0
    result = tick(demo_world, stub_server)
    assert result.exit_code == 0, result.output
    assert committed_tick(demo_world) == 3
    assert stub_server.stats.by_route["GET /v1/responses"] <= 3  # until one was covered


def test_a_server_reporting_no_usage_cannot_be_told_and_does_not_stop(
    demo_world: Path, stub_server: StubServer
) -> None:
    stub_server.options.ignore_previous_response_id = True
    stub_server.options.null_usage = True
    result = tick(demo_world, stub_server, ticks=2)
    assert result.exit_code == 0, result.output
    assert result.output.count("reports no token usage") == 1
    assert "cannot be told" in result.output
    assert committed_tick(demo_world) == 2


def test_a_404_deleting_a_response_of_this_run_is_reported(
    demo_world: Path, stub_server: StubServer
) -> None:
    stub_server.options.delete_not_found = True
    result = tick(demo_world, stub_server, ticks=3)
    assert result.exit_code == 0, result.output
    assert stub_server.stats.by_route["DELETE /v1/responses"] > 0
    assert "answered 404 to deleting response" in result.output
    assert "which it made in this run" in result.output
    # not retried forever: a lost response is not left pending
    assert not (demo_world / ".sim" / "pending_deletions.json").exists()
