"""``sim usage`` and ``sim log --calls``: what a world used and cost, from its entities and its
tick logs; unknown prices say so; unreadable logs are reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from conftest import copy_demo

from sim.analysis.usage import usage_report
from sim.cli import main
from sim.llm.budget import Price, cost_usd
from sim.llm.types import Usage
from sim.storage import Storage
from sim.testing.logs import plain_log
from sim.testing.stub_server import StubServer
from sim.ticklog.format import list_logs
from sim.ticklog.reader import read_log_bytes, read_logs

FIELDS = ("input_tokens", "cached_input_tokens", "output_tokens")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(
        main, list(args), env={"OPENAI_API_KEY": "sk-test"}, catch_exceptions=False
    )


def usage_json(world: Path, by: str) -> dict[str, Any]:
    result = invoke("usage", "--world", str(world), "--by", by, "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = orjson.loads(result.output)
    return data


@pytest.fixture(scope="module")
def three_ticks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo world after 3 offline ticks with deeper chains (read-only)."""
    world = copy_demo(tmp_path_factory.mktemp("usage") / "demo")
    result = invoke("tick", "--world", str(world), "--ticks", "3", "--depth", "phase1=2")
    assert result.exit_code == 0, result.output
    return world


def log_sums(world: Path) -> dict[str, int]:
    """Every attempt of every logged call, summed straight from the JSONL records."""
    sums = dict.fromkeys(("requests", *FIELDS), 0)
    for _, path in list_logs(world):
        for line in read_log_bytes(path).splitlines():
            record = orjson.loads(line)
            if record["type"] != "call":
                continue
            sums["requests"] += 1
            for attempt in record["attempts"]:
                for key in FIELDS:
                    sums[key] += attempt["usage"][key]
    return sums


@pytest.mark.parametrize("by", ["phase", "tick"])
def test_usage_totals_equal_the_sum_over_the_tick_logs(three_ticks: Path, by: str) -> None:
    data = usage_json(three_ticks, by)
    sums = log_sums(three_ticks)
    assert sums["requests"] > 0
    for key, value in sums.items():
        assert data["total"][key] == value
        assert sum(row[key] for row in data["rows"]) == value
    keys = {row["key"] for row in data["rows"]}
    assert keys == ({"intentions", "resolution", "narrative"} if by == "phase" else {"1", "2", "3"})
    assert data["total"]["cost_usd"] == 0.0 and data["problems"] == []


def test_usage_by_entity_equals_the_entities_openai_usage(three_ticks: Path) -> None:
    data = usage_json(three_ticks, "entity")
    world = Storage(three_ticks).load()
    expected: dict[str, dict[str, int]] = {}
    for eid, entity in {**world.characters, **world.locations}.items():
        stats = entity.get("_openai", {}).get("usage")
        if stats:
            expected[eid] = {
                "requests": stats["total_requests"],
                "input_tokens": stats["total_input_tokens"],
                "output_tokens": stats["total_output_tokens"],
            }
    got = {
        row["key"]: {k: row[k] for k in ("requests", "input_tokens", "output_tokens")}
        for row in data["rows"]
    }
    assert got == expected
    for key in ("requests", "input_tokens", "output_tokens"):
        assert data["total"][key] == sum(e[key] for e in expected.values())
    # every tick is logged, so the logs and the entities agree, and cost is known
    assert data["total"]["input_tokens"] == log_sums(three_ticks)["input_tokens"]
    assert all(row["cost_usd"] == 0.0 for row in data["rows"])


def test_rows_are_sorted_by_cost_then_tokens(three_ticks: Path) -> None:
    for by in ("entity", "phase"):
        rows = usage_json(three_ticks, by)["rows"]
        keys = [(-(r["cost_usd"] or 0), -r["total_tokens"]) for r in rows]
        assert keys == sorted(keys)
    # by tick, in tick order (issue 35: it was by cost too)
    assert [r["key"] for r in usage_json(three_ticks, "tick")["rows"]] == ["1", "2", "3"]


def test_a_model_without_a_price_has_unknown_cost(three_ticks: Path) -> None:
    report = usage_report(three_ticks, "phase", {})  # no prices at all, not even offline's
    assert report.total.input_tokens > 0  # a row read by the names `sim usage --json` gives
    total = report.total.to_dict()
    assert (report.total.requests, report.total.total_tokens) == (
        total["requests"],
        total["total_tokens"],
    )
    assert report.total.cost.value is None and report.total.cost.unpriced == {"offline"}
    assert all(row.to_dict()["cost_usd"] is None for row in report.rows)
    priced = usage_report(three_ticks, "phase", {"offline": Price(input=1.0, output=2.0)})
    total = priced.total
    assert priced.total.cost.value == pytest.approx(
        cost_usd(Usage(total.input_tokens, total.output_tokens), Price(1.0, 0.0, 2.0))
    )


def test_usage_over_http_prices_each_model_and_unknown_ones_say_so(
    demo_world: Path, stub_server: StubServer
) -> None:
    url = stub_server.base_url
    ran = invoke("tick", "--world", str(demo_world), "--provider", "chat", "--base-url", url)
    assert ran.exit_code == 0, ran.output
    stats = stub_server.stats
    data = usage_json(demo_world, "tick")
    billed = cost_usd(
        Usage(stats.input_tokens, stats.output_tokens, stats.cached_tokens),
        Price(input=0.4, cached_input=0.1, output=1.6),  # gpt-4.1-mini's default price
    )
    assert data["total"]["cost_usd"] == pytest.approx(billed, rel=1e-6) and billed > 0
    ran = invoke(
        "tick", "--world", str(demo_world), "--provider", "chat", "--base-url", url,
        "--model", "mystery-model",
    )  # fmt: skip
    assert ran.exit_code == 0, ran.output
    text = invoke("usage", "--world", str(demo_world), "--by", "tick").output
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert lines["2"].rstrip().endswith("unknown") and lines["1"].split()[-1].startswith("$")
    assert lines["total"].rstrip().endswith("unknown")
    assert "no price for mystery-model" in text
    entity = usage_json(demo_world, "entity")
    assert entity["total"]["cost_usd"] is None and "mystery-model" in str(entity["rows"])


def test_unreadable_logs_are_reported_not_skipped(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "demo")
    assert invoke("tick", "--world", str(world), "--ticks", "2").exit_code == 0
    path = plain_log(world, 1)  # a log without a summary is read whole
    path.write_bytes(b"not json\n" + path.read_bytes())
    for by in ("phase", "entity"):
        result = invoke("usage", "--world", str(world), "--by", by)
        assert result.exit_code == 1
        assert "unreadable log" in result.output and path.name in result.output
    logs, problems = read_logs(world)
    assert len(logs) == 1 and len(problems) == 1
    # the entities hold both ticks, the logs only one: the cost cannot be known
    assert "cost unknown for" in invoke("usage", "--world", str(world)).output


def test_sim_log_shows_the_depth_and_window_of_every_call(three_ticks: Path) -> None:
    log = read_logs(three_ticks)[0][-1]
    assert all("depth" in call.model_fields_set for call in log.calls.values())
    depths = {call.phase: call.depth for call in log.calls.values()}
    assert depths == {"intentions": 2, "resolution": 2, "narrative": 0}
    result = invoke("log", "--world", str(three_ticks), "--calls")
    assert result.exit_code == 0, result.output
    lines = [line.split() for line in result.output.splitlines()[1:]]
    assert len(lines) == len(log.calls)
    intentions = [parts for parts in lines if ":intentions:" in parts[0]]
    assert intentions and all(parts[2] == "2" and parts[3] == "2" for parts in intentions)


def test_every_grouping_counts_the_same_calls_after_compaction(
    demo_world: Path, stub_server: StubServer
) -> None:
    """``sim usage --by endpoint`` read only the full logs: after ``sim log --compact
    --before`` dropped old ticks' call detail, it counted fewer requests than every other
    grouping (40 against 62). The compacted ticks count from their summaries."""
    url = stub_server.base_url
    ran = invoke(
        "tick", "--world", str(demo_world), "--provider", "chat", "--base-url", url,
        "--ticks", "3",
    )  # fmt: skip
    assert ran.exit_code == 0, ran.output
    before = usage_json(demo_world, "endpoint")["total"]
    assert before["requests"] == stub_server.stats.generations
    compacted = invoke("log", "--world", str(demo_world), "--compact", "--before", "3")
    assert compacted.exit_code == 0, compacted.output
    totals = {
        by: usage_json(demo_world, by) for by in ("entity", "phase", "tick", "model", "endpoint")
    }
    keys = ("requests", "failures", *FIELDS, "cost_usd")
    for by, data in totals.items():
        assert {k: data["total"][k] for k in keys} == {k: before[k] for k in keys}, by
    endpoint = totals["endpoint"]
    rows = {row["key"]: row for row in endpoint["rows"]}
    assert url in rows  # tick 3 still knows its server
    assert rows["(compacted: server not kept)"]["requests"] > 0
    assert any("--compact" in note for note in endpoint["notes"])
