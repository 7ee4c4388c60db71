"""The ``planning`` phase: a daily plan of timed intentions, written at a declared hour,
kept in ``memory.plan``; the intentions phase sees the item for now and the next."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner, Result
from conftest import DEMO, tree

from sim.cli import main
from sim.sections import loads as read_sections
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

CONFIG = """[llm]
provider = "offline"

[time]
start = "1340-05-01T05:00"
tick = "12h"

[tick]
phases = ["planning", "intentions", "resolution", "narrative", "apply", "memory"]

[planning]
when = "06:00"
items = 4
"""


def read_input(text: str) -> dict[str, Any]:
    """A call's input as its phase wrote it (labelled sections, or JSON)."""
    doc = read_sections(text)
    assert doc is not None, text
    return doc


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def demo(tmp_path: Path, config: str = CONFIG) -> Path:
    world = tmp_path / "demo"
    shutil.copytree(DEMO, world, ignore=shutil.ignore_patterns(".sim"))
    (world / "config.toml").write_text(config)
    return world


def intention_memory(world: Path, tick: int, cid: str) -> dict[str, Any]:
    log = read_log(log_path(world, tick))
    (call,) = [c for c in log.calls.values() if c.entity_key == f"intention:{cid}"]
    memory: dict[str, Any] = read_input(call.input)["memory"]
    return memory


def test_a_daily_plan_at_a_declared_hour(tmp_path: Path) -> None:
    world = demo(tmp_path)
    result = run("tick", "--world", str(world), "--ticks", "3")  # 05:00, 17:00, next 05:00
    assert result.exit_code == 0, result.output
    planned = [
        sum(c.phase == "planning" for c in read_log(log_path(world, t)).calls.values())
        for t in (1, 2, 3)
    ]
    assert planned == [10, 0, 10]  # every character, once each morning
    ada = orjson.loads((world / "characters" / "ada.json").read_bytes())
    plan = ada["memory"]["plan"]
    assert plan["date"] == "1340-05-02"
    assert 1 <= len(plan["items"]) <= 4
    assert [i["at"] for i in plan["items"]] == sorted(i["at"] for i in plan["items"])
    # tick 1 (05:00) sees what comes next; tick 2 (17:00) the item for now
    assert "next" in intention_memory(world, 1, "ada")["plan"]
    assert "now" in intention_memory(world, 2, "ada")["plan"]
    replay = run("replay", "--world", str(world), "--tick", "1")
    assert replay.exit_code == 0, replay.output


def test_planning_needs_time(tmp_path: Path) -> None:
    world = demo(tmp_path, CONFIG.replace('[time]\nstart = "1340-05-01T05:00"\ntick = "12h"\n', ""))
    result = run("tick", "--world", str(world))
    assert result.exit_code == 2
    assert "planning" in result.output and "[time]" in result.output


def test_a_bad_plan_in_a_world_file_is_refused_by_name(tmp_path: Path) -> None:
    world = demo(tmp_path)
    path = world / "characters" / "ada.json"
    ada = orjson.loads(path.read_bytes())
    ada["memory"]["plan"] = {"date": "1340-05-01", "items": [{"at": "25:00", "intention": "x"}]}
    path.write_bytes(orjson.dumps(ada))
    before = tree(world)
    result = run("tick", "--world", str(world))
    assert result.exit_code == 2
    assert "memory.plan.items.0.at" in result.output
    assert tree(world) == before
