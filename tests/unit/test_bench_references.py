"""The real-model bench's reference checks (bench/references.py), on the demo world with
the offline provider (which names only valid ids) and on answers with wrong ids."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from bench.real_model import calls_of
from bench.references import (
    Snapshot,
    applied,
    every_answer,
    intention_refs,
    moves,
    outcomes_given,
    resolution_refs,
    world_problems,
)
from sim.cli import main


def test_the_offline_demo_tick_names_only_valid_ids(demo_world: Path) -> None:
    before = Snapshot.read(demo_world)
    result = CliRunner().invoke(main, ["tick", "--world", str(demo_world)])
    assert result.exit_code == 0, result.output
    calls = calls_of(demo_world, 1)
    used = applied(calls, before)
    assert used.total > 0 and used.share == 1.0, used.invalid
    assert every_answer(calls, before).share == 1.0
    got, present = outcomes_given(calls, before)
    assert present == len(before.characters) and 0 < got <= present
    after = Snapshot.read(demo_world)
    assert moves(before, after) == sum(
        before.characters[c][0] != after.characters[c][0] for c in after.characters
    )
    assert world_problems(after) == []


def test_wrong_ids_are_counted_invalid(demo_world: Path) -> None:
    world = Snapshot.read(demo_world)
    ada_at = world.characters["ada"][0]
    exits = world.locations[ada_at][0]
    assert intention_refs("ada", {"action": "move", "target": exits[0]}, world).share == 1.0
    for target in ("", "ada", "place", None):
        tally = intention_refs("ada", {"action": "move", "target": target}, world)
        assert (tally.total, tally.valid) == (1, 0)
    speak = intention_refs("ada", {"action": "speak", "target": "ada"}, world)
    assert speak.valid == 0  # not to oneself
    answer = {
        "outcomes": [
            {"character_id": "1", "moved_to": None},
            {"character_id": "ada", "moved_to": "the first lantern"},
        ],
        "location_update": {"objects_removed": ["nothing-here"], "objects_added": ["x"]},
    }
    tally = resolution_refs(ada_at, answer, world)
    assert (tally.total, tally.valid) == (4, 1)  # only ada, present there
