"""In-world time (``[time]``): ticks mapped to dates and hours, shown to phases' inputs and
templates; phases that run only at given times (``when``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from conftest import tree

from sim.cli import main
from sim.config.clock import Clock, parse_duration, parse_start
from sim.sections import loads as read_sections
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

ORDER = '["intentions", "resolution", "narrative", "apply", "vote", "memory"]'
VOTE = """
[phases.vote]
per = "world"
when = "sun 18:00"
instructions = "prompts/vote.md"
schema = "schemas/vote.json"
"""


def read_input(text: str) -> dict[str, Any]:
    """A call's input as its phase wrote it (labelled sections, or JSON)."""
    doc = read_sections(text)
    assert doc is not None, text
    return doc


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def calls(world: Path, tick: int, phase: str) -> dict[str, dict[str, Any]]:
    log = read_log(log_path(world, tick))
    return {str(c.entity_key): read_input(c.input) for c in log.calls.values() if c.phase == phase}


def instructions(world: Path, tick: int, phase: str) -> list[str]:
    log = read_log(log_path(world, tick))
    return [log.instructions[c.instructions_digest] for c in log.calls.values() if c.phase == phase]


@pytest.fixture
def town(tmp_path: Path) -> Path:
    world = tmp_path / "w"
    assert run("init", str(world)).exit_code == 0
    (world / "schemas").mkdir()
    (world / "schemas" / "vote.json").write_text(
        '{"type": "object", "title": "Vote", "properties": {"choice": {"type": "string"}}, '
        '"required": ["choice"]}'
    )
    (world / "prompts" / "vote.md").write_text(
        "It is {{ time.weekday }} {{ time.date }} at {{ time.time }}, "
        "{{ world.time.part_of_day }}. Vote."
    )
    # 1340-05-01 is a Sunday (proleptic Gregorian)
    (world / "config.toml").write_text(
        '[llm]\nprovider = "offline"\n\n[time]\nstart = "1340-05-01T16:00"\ntick = "1h"\n\n'
        f"[tick]\nphases = {ORDER}\n{VOTE}"
    )
    return world


def test_ticks_are_in_world_time_in_inputs_and_templates(town: Path) -> None:
    result = run("tick", "--world", str(town), "--ticks", "4")
    assert result.exit_code == 0, result.output
    first = calls(town, 1, "intentions")["intention:ada"]["world"]["time"]
    assert first == {
        "now": "1340-05-01T16:00",
        "date": "1340-05-01",
        "weekday": "Sunday",
        "time": "16:00",
        "part_of_day": "afternoon",
        "elapsed": "0m",
    }
    third = calls(town, 3, "resolution")
    assert all(doc["world"]["time"]["time"] == "18:00" for doc in third.values())
    narratives = calls(town, 4, "narrative").values()
    assert narratives and all(doc["world"]["time"]["elapsed"] == "3h" for doc in narratives)
    # the vote runs only in the tick holding Sunday 18:00, and its template saw the time
    assert [bool(calls(town, t, "vote")) for t in (1, 2, 3, 4)] == [False, False, True, False]
    assert instructions(town, 3, "vote") == ["It is Sunday 1340-05-01 at 18:00, evening. Vote."]
    replay = run("replay", "--world", str(town), "--tick", "3")
    assert replay.exit_code == 0, replay.output


def test_without_time_ticks_stay_plain_numbers(tmp_path: Path) -> None:
    world = tmp_path / "w"
    assert run("init", str(world)).exit_code == 0
    assert run("tick", "--world", str(world)).exit_code == 0
    doc = calls(world, 1, "intentions")["intention:ada"]
    assert "time" not in doc["world"] and doc["tick"] == 1


def test_a_nightly_memory_phase(town: Path) -> None:
    config = town / "config.toml"
    config.write_text(
        '[llm]\nprovider = "offline"\n\n[time]\nstart = "1340-05-01T22:00"\ntick = "2h"\n\n'
        '[phase4]\nwhen = "03:00"\n'
    )
    for char in ("ada", "bram", "cora"):  # full memories: the memory phase has work each tick
        path = town / "characters" / f"{char}.json"
        data = orjson.loads(path.read_bytes())
        data["memory"]["capacity"] = 1
        path.write_bytes(orjson.dumps(data))
    assert run("tick", "--world", str(town), "--ticks", "4").exit_code == 0
    # ticks at 22:00, 00:00, 02:00 (holds 03:00), 04:00
    ran = [bool(calls(town, t, "memory")) for t in (1, 2, 3, 4)]
    assert ran == [False, False, True, False]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (f'[llm]\nprovider = "offline"\n[tick]\nphases = {ORDER}\n{VOTE}', "phases.vote.when"),
        (
            '[llm]\nprovider = "offline"\n[time]\nstart = "1340-05-01T06:00"\n'
            '[phase1]\nwhen = "06:00"\n',
            "phase1.when",
        ),
        ('[llm]\nprovider = "offline"\n[time]\nstart = "May 1st, 1340"\n', "time.start"),
        (
            '[llm]\nprovider = "offline"\n[time]\nstart = "1340-05-01T06:00"\ntick = "soon"\n',
            "time.tick",
        ),
        ('[llm]\nprovider = "offline"\n[phase4]\nwhen = "sunday evening"\n', "phase4.when"),
    ],
)
def test_bad_time_settings_are_refused_by_name(town: Path, config: str, field: str) -> None:
    (town / "config.toml").write_text(config)
    before = tree(town)
    result = run("tick", "--world", str(town))
    assert result.exit_code == 2, result.output
    assert field in result.output
    assert tree(town) == before


def test_clock_spans_and_weeks() -> None:
    clock = Clock(parse_start("1340-05-01T06:00"), parse_duration("1d"))
    assert clock.view(8)["date"] == "1340-05-08" and clock.view(8)["elapsed"] == "7d"
    # a daily tick starting 06:00 holds 18:00 of its own day; a weekly time only on that day
    assert clock.due(1, ("18:00",))
    assert [t for t in range(1, 15) if clock.due(t, ("sun 18:00",))] == [1, 8]
    assert parse_duration("1d12h") == 36 * 3600
    with pytest.raises(ValueError, match="duration"):
        parse_duration("")


def test_time_past_the_year_9999_is_a_named_error(tmp_path: Path) -> None:
    world = tmp_path / "w"
    assert run("init", str(world)).exit_code == 0
    (world / "config.toml").write_text(
        '[llm]\nprovider = "offline"\n[time]\nstart = "9999-12-31T23:00"\ntick = "1h"\n'
    )
    assert run("tick", "--world", str(world)).exit_code == 0  # tick 1: 23:00
    before = tree(world)
    result = run("tick", "--world", str(world))
    assert result.exit_code == 2, result.output
    assert "beyond the year 9999" in result.output
    assert tree(world) == before
