"""What a real model still got into the world (issue 35): the game master adding the cast's
names as objects of a place, and characters present whom no outcome reached, unnamed.

A scripted adapter plays the game master: each resolution answer is built from the
request's input (the place and the characters present), with what a test scripts per place.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from sim import sections
from sim.cli import main
from sim.cli.run import print_tick
from sim.config import load_config
from sim.engine.runner import Runner, TickResult
from sim.phases.intentions import Intention
from sim.phases.resolution import Resolution
from sim.storage import Storage
from sim.testing import MockAdapter, default_instance

FAST = "[llm]\nbackoff_base_seconds = 0.0\nbackoff_cap_seconds = 0.0\n"

#: place id -> (attempt number from 1 -> the answer's changes to the default)
Script = dict[str, Callable[[int], dict[str, Any]]]


class GameMaster(MockAdapter):
    """Intentions wait; a resolution gives each character present an outcome, changed by
    ``script`` for its place and attempt (re-asks included)."""

    def __init__(self, script: Script) -> None:
        super().__init__(default=self.answer)
        self.script = script
        self.attempts: dict[str, int] = {}
        self.feedback: list[str] = []

    def answer(self, schema: type[BaseModel], text: str) -> Any:
        if schema is Intention:
            return Intention(action="wait", target=None, content="", reasoning="scripted")
        if not issubclass(schema, Resolution):
            return default_instance(schema)
        data = sections.loads(text)
        assert data is not None
        lid = data["location"]["id"]
        self.attempts[lid] = self.attempts.get(lid, 0) + 1
        answer: dict[str, Any] = {
            "outcomes": [
                {
                    "character_id": c["id"],
                    "outcome": f"{c['name']} stays.",
                    "moved_to": None,
                    "mood": None,
                    "gained": [],
                    "lost": [],
                }
                for c in data["characters"]
            ],
            "location_update": None,
        }
        if lid in self.script:
            answer.update(self.script[lid](self.attempts[lid]))
        return answer

    async def execute(self, request: Any) -> Any:
        if "Your previous answer was rejected" in request.instructions:
            self.feedback.append(request.instructions.rsplit("rejected:", 1)[1])
        return await super().execute(request)


def run_tick(world: Path, script: Script) -> tuple[TickResult, GameMaster]:
    (world / "config.toml").write_text(FAST + "max_failed_fraction = 1.0\n")
    adapter = GameMaster(script)
    config = load_config(world_dir=world, cwd=world)
    (result,) = Runner(world, config, adapter=adapter).run(1)
    return result, adapter


def update(*added: str) -> dict[str, Any]:
    return {
        "location_update": {"atmosphere": None, "objects_added": list(added), "objects_removed": []}
    }


def bell_objects(world: Path) -> list[str]:
    return list(Storage(world).load().locations["drowned-bell"]["state"]["objects"])


@pytest.mark.parametrize(
    "name",
    ["Bram Hollis", "corin penhallow", "  HERRING quay ", "bram", "Market Steps", "sea-caves"],
)
def test_an_added_object_named_after_a_character_or_place_is_reasked(
    demo_world: Path, name: str
) -> None:
    # what Gemma 3 270M did at The Drowned Bell in both real ticks: the first answer adds
    # a name of the cast (or of a place, in any case); the re-ask, told why, adds a thing
    result, gm = run_tick(
        demo_world, {"drowned-bell": lambda n: update(name if n == 1 else "spilt ale")}
    )
    assert gm.attempts["drowned-bell"] == 2
    assert "objects_added names" in gm.feedback[0] and "a place or character" in gm.feedback[0]
    objects = bell_objects(demo_world)
    assert "spilt ale" in objects
    assert name not in objects and name.strip().casefold() not in {o.casefold() for o in objects}
    assert not any(report.errors for report in result.reports)


def test_a_name_the_model_keeps_adding_never_reaches_the_world(demo_world: Path) -> None:
    before = bell_objects(demo_world)
    result, gm = run_tick(demo_world, {"drowned-bell": lambda n: update("Bram Hollis")})
    assert gm.attempts["drowned-bell"] == 3  # json_max_retries = 2
    assert bell_objects(demo_world) == before
    resolution = next(r for r in result.reports if r.name == "resolution")
    assert "resolution:drowned-bell" in resolution.errors
    # the fallback is named in the summary: who at The Drowned Bell got no outcome, and why
    apply = next(r for r in result.reports if r.name == "apply")
    assert apply.gaps == [
        "drowned-bell: bram, corin (its resolution fell back; remembered as what they meant to do)"
    ]


def test_a_character_gains_no_place_or_character(demo_world: Path) -> None:
    def gains(n: int) -> dict[str, Any]:
        item = "Pell Dunmore" if n == 1 else "herring"
        return {
            "outcomes": [
                {"character_id": c, "outcome": "ok", "moved_to": None, "mood": None}
                | {"gained": [item], "lost": []}
                for c in ("ada", "pell")
            ]
        }

    _, gm = run_tick(demo_world, {"quay": gains})
    assert "gained names 'Pell Dunmore'" in gm.feedback[0]
    world = Storage(demo_world).load()
    assert world.characters["ada"]["state"]["inventory"][-1] == "herring"
    assert "Pell Dunmore" not in world.characters["ada"]["state"]["inventory"]


def test_characters_left_without_an_outcome_are_named_in_the_summary(
    demo_world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Ada and Pell at Herring Quay got no outcome in either real tick, and nothing said so:
    # the quay's resolution gives outcomes to no one here (a partial list passes the check)
    result, _ = run_tick(demo_world, {"quay": lambda n: {"outcomes": []}})
    apply = next(r for r in result.reports if r.name == "apply")
    assert apply.gaps == [
        "quay: ada, pell (the game master gave them none; remembered as what they meant to do)"
    ]
    print_tick(result)
    out = capsys.readouterr().out
    assert "no outcome: quay: ada, pell (the game master gave them none;" in out
    # every other place's characters got theirs: nothing else is named
    assert out.count("no outcome:") == 1
    ada = Storage(demo_world).load().characters["ada"]
    assert ada["memory"]["cells"][-1]["text"] == "Ada Strand waited; nothing came of it."


def test_the_gap_is_in_the_tick_log_and_a_full_tick_names_none(demo_world: Path) -> None:
    run_tick(demo_world, {"quay": lambda n: {"outcomes": []}})
    shown = CliRunner().invoke(main, ["log", "--world", str(demo_world), "--tick", "1", "--json"])
    assert shown.exit_code == 0, shown.output
    story = CliRunner().invoke(main, ["log", "--world", str(demo_world), "--tick", "1"])
    assert "no outcome: quay: ada, pell (the game master gave them none;" in story.output
    records = [json.loads(line) for line in shown.output.splitlines()]
    apply = next(r for r in records if r["type"] == "phase" and r["name"] == "apply")
    assert apply["report"]["gaps"][0].startswith("quay: ada, pell (the game master gave")
    # the offline model gives everyone present an outcome: no gap, and no "gaps" key logged
    second = CliRunner().invoke(main, ["tick", "--world", str(demo_world)])
    assert second.exit_code == 0, second.output
    assert "no outcome:" not in second.output
    logged = CliRunner().invoke(main, ["log", "--world", str(demo_world), "--tick", "2", "--json"])
    assert '"gaps"' not in logged.output
