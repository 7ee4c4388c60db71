"""A world the user defines: everything in it reaches the model, templated prompts,
phases and verbs it declares (issue 12)."""

from __future__ import annotations

from pathlib import Path

import orjson
from click.testing import CliRunner

from sim.cli import main
from sim.config import load_config
from sim.engine.runner import Runner
from sim.ticklog.format import log_path, read_log


def _edit(path: Path, change: object) -> None:
    data = orjson.loads(path.read_bytes())
    change(data)  # type: ignore[operator]
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))


def test_description_and_custom_fields_reach_every_intention_input(demo_world: Path) -> None:
    _edit(demo_world / "world.json", lambda d: d.update(description="MARKER-PREMISE-41 a vote"))
    _edit(demo_world / "world.json", lambda d: d.update(season="drought"))
    for path in sorted((demo_world / "characters").glob("*.json")):
        _edit(path, lambda d: d["identity"].update(secret_goal="MARKER-SECRET-77"))
        _edit(path, lambda d: d["state"].update(age=61))
    Runner(demo_world, load_config(world_dir=demo_world)).run(2)
    for tick in (1, 2):
        log = read_log(log_path(demo_world, tick))
        intentions = [c for c in log.calls.values() if c["phase"] == "intentions"]
        assert len(intentions) == 10
        for call in intentions:
            document = orjson.loads(call["input"])
            assert "MARKER-PREMISE-41" in call["input"]
            assert "MARKER-SECRET-77" in call["input"]
            assert document["world"]["season"] == "drought"
            assert document["character"]["age"] == 61
        resolutions = [c for c in log.calls.values() if c["phase"] == "resolution"]
        assert resolutions and all("MARKER-SECRET-77" in c["input"] for c in resolutions)
        assert all("MARKER-PREMISE-41" in c["input"] for c in log.calls.values())


def test_a_characters_secret_is_not_shown_to_the_others(demo_world: Path) -> None:
    path = demo_world / "characters" / "ada.json"
    _edit(path, lambda d: d.update(secret="ADA-ONLY-SECRET"))
    Runner(demo_world, load_config(world_dir=demo_world)).run(1)
    log = read_log(log_path(demo_world, 1))
    for call in log.calls.values():
        if call["phase"] == "intentions":
            assert ("ADA-ONLY-SECRET" in call["input"]) == (call["entity_key"] == "intention:ada")


def test_cli_tick_runs(demo_world: Path) -> None:
    result = CliRunner().invoke(main, ["tick", "--world", str(demo_world)])
    assert result.exit_code == 0, result.output
