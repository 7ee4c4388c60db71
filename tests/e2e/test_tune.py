"""``sim tune``: one row per depth from scratch copies; the live world is never touched; a
paid provider asks before spending."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result
from conftest import tree

from sim.analysis.tune import tune
from sim.cli import main
from sim.config import load_config
from sim.testing.stub_server import StubServer

ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+([\d.]+)s\s+(\d+)")


def invoke(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(
        main, list(args), input=input, env={"OPENAI_API_KEY": "sk-test"}, catch_exceptions=False
    )


def rows(output: str) -> dict[int, dict[str, str]]:
    out = {}
    for line in output.splitlines():
        if match := ROW.match(line):
            depth, requests, failed, inp, cached, outp, cost, _wall, phase_in = match.groups()
            out[int(depth)] = {
                "requests": requests,
                "failed": failed,
                "input": inp,
                "cached": cached,
                "output": outp,
                "cost": cost,
                "phase_input": phase_in,
            }
    return out


@pytest.fixture
def ticked(demo_world: Path) -> Path:
    """The demo world after one offline tick: it has logs and a response store."""
    result = invoke("tick", "--world", str(demo_world))
    assert result.exit_code == 0, result.output
    assert (demo_world / ".sim" / "log").is_dir()
    return demo_world


def test_tune_gives_a_row_per_depth_and_never_touches_the_live_world(ticked: Path) -> None:
    before = tree(ticked, logs=True)
    result = invoke(
        "tune", "--world", str(ticked), "--phase", "resolution", "--depths", "0,2", "--ticks", "3"
    )
    assert result.exit_code == 0, result.output
    table = rows(result.output)
    assert sorted(table) == [0, 2]
    assert int(table[2]["input"]) > int(table[0]["input"])
    assert int(table[2]["phase_input"]) > int(table[0]["phase_input"])
    assert table[0]["cost"] == table[2]["cost"] == "$0.0000"  # offline is free
    assert tree(ticked, logs=True) == before


def test_tune_json_rows_parse(ticked: Path) -> None:
    result = invoke(
        "tune", "--world", str(ticked), "--phase", "phase1", "--depths", "0,1", "--ticks", "2",
        "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = [orjson.loads(line) for line in result.output.splitlines()]
    assert [d["depth"] for d in data] == [0, 1]
    for row in data:
        assert row["phase"] == "intentions" and row["ticks"] == 2
        assert row["requests"] > 0 and row["failures"] == 0 and row["cost_usd"] == 0.0
        assert row["input_tokens"] > row["phase_input_tokens"] > 0
    assert data[0]["avg_window"] == 0.0
    assert 0 < data[1]["avg_window"] <= 1


def test_tune_rows_come_from_the_same_starting_state(demo_world: Path) -> None:
    config = load_config(None, demo_world)
    first, again = tune(demo_world, config, "phase2a", [2, 2], 2)
    assert first.to_dict() | {"wall_seconds": 0} == again.to_dict() | {"wall_seconds": 0}
    assert not (demo_world / ".sim").exists()


def test_tune_rejects_bad_depths_and_phases(demo_world: Path) -> None:
    bad = invoke("tune", "--world", str(demo_world), "--phase", "phase2a", "--depths", "0,-1")
    assert bad.exit_code == 2 and "--depths" in bad.output
    bad = invoke("tune", "--world", str(demo_world), "--phase", "phase9", "--depths", "0")
    assert bad.exit_code == 2 and "unknown phase" in bad.output


def paid(world: Path, server: StubServer, *extra: str, input: str | None = None) -> Result:
    return invoke(
        "tune", "--world", str(world), "--phase", "phase2a", "--depths", "0,1", "--ticks", "1",
        "--provider", "openai", "--base-url", server.base_url, *extra, input=input,
    )  # fmt: skip


def test_a_paid_provider_asks_first_with_an_estimate(
    demo_world: Path, stub_server: StubServer
) -> None:
    before = tree(demo_world, logs=True)
    result = paid(demo_world, stub_server, input="n\n")
    assert result.exit_code == 1, result.output
    assert "Spend it?" in result.output
    assert re.search(r"cost \$\d+\.\d{4}", result.output)  # gpt-4.1-mini has a price
    assert "offline" in result.output  # says how it was estimated
    assert stub_server.stats.generations == 0
    assert tree(demo_world, logs=True) == before


def test_yes_skips_the_question_and_runs(demo_world: Path, stub_server: StubServer) -> None:
    before = tree(demo_world, logs=True)
    result = paid(demo_world, stub_server, "--yes")
    assert result.exit_code == 0, result.output
    assert "Spend it?" not in result.output
    table = rows(result.output)
    assert sorted(table) == [0, 1]
    assert sum(int(r["requests"]) for r in table.values()) == stub_server.stats.generations
    assert all(r["cost"].startswith("$") and r["cost"] != "$0.0000" for r in table.values())
    assert tree(demo_world, logs=True) == before


def test_an_unpriced_model_has_unknown_cost_and_still_asks(
    demo_world: Path, stub_server: StubServer
) -> None:
    asked = paid(demo_world, stub_server, "--model", "mystery-model", input="n\n")
    assert asked.exit_code == 1
    assert "cost unknown" in asked.output and "mystery-model" in asked.output
    assert "Spend it?" in asked.output
    ran = paid(demo_world, stub_server, "--model", "mystery-model", "--yes")
    assert ran.exit_code == 0, ran.output
    table = rows(ran.output)
    assert [r["cost"] for r in table.values()] == ["unknown", "unknown"]
    assert "no price for mystery-model" in ran.output
