"""What a tick commits is the normal form (``sim.storage.normal``): in a world whose
phases add keys to an entity (``[memory] mode = "retrieve"`` with planning and
reflection: a memory's ``unreflected`` after its ``plan``, its ``archive`` after both;
``[messages]``: an inbox after ``_openai``), every entity file a tick writes is
``dump_json`` of what loading it gives, so the next load keeps it as parsed and a commit
with nothing changed rewrites nothing (it used to rewrite each such file once more,
with a new state digest in the log)."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import WORLDS
from test_relationships import BOND_CONFIG, bond_schema

from sim.cli import main
from sim.storage import store
from sim.storage.normal import normal_form
from sim.storage.store import Storage, dump_json
from sim.study.network import ConditionNetwork, Tie
from sim.study.run import _set_network
from sim.world import Character, Location, WorldMeta

MODELS = {"characters": Character, "locations": Location}


def tick(world: Path) -> None:
    result = CliRunner().invoke(main, ["tick", "--world", str(world)])
    assert result.exit_code == 0, result.output


def not_normal(world: Path) -> list[str]:
    """The world's files that are not ``dump_json`` of their normal form."""
    out = []
    for path in sorted([world / "world.json", *world.glob("characters/*.json")]) + sorted(
        world.glob("locations/*.json")
    ):
        raw = path.read_bytes()
        model = WorldMeta if path.name == "world.json" else MODELS[path.parent.name]
        if dump_json(normal_form(model, orjson.loads(raw))) != raw:
            out.append(path.relative_to(world).as_posix())
    return out


def check_ticks(world: Path, ticks: int) -> set[str]:
    """Run ``ticks`` ticks one by one; after each, every file is in normal form and a load
    finds nothing to write. The keys each tick's files hold: characters' and memories'."""
    keys: set[str] = set()
    for n in range(1, ticks + 1):
        tick(world)
        assert not_normal(world) == [], f"after tick {n}"
        storage = Storage(world)
        assert storage.changed_files(storage.load()) == {}, f"after tick {n}"
        for path in world.glob("characters/*.json"):
            char = orjson.loads(path.read_bytes())
            keys.update(char)
            keys.update(f"memory.{key}" for key in char["memory"])
    return keys


def test_a_retrieving_world_with_plans_and_reflections_commits_normal_files(
    tmp_path: Path,
) -> None:
    world = tmp_path / "minds"
    shutil.copytree(WORLDS / "minds", world)
    keys = check_ticks(world, 5)
    # the phases added the keys that used to land out of order
    assert {"memory.plan", "memory.unreflected", "memory.archive", "_openai"} <= keys


def test_a_world_with_messages_commits_normal_files(tmp_path: Path) -> None:
    world = tmp_path / "w"
    result = CliRunner().invoke(
        main, ["init", str(world), "--characters", "6", "--locations", "4", "--network", "ring"]
    )
    assert result.exit_code == 0, result.output
    with (world / "config.toml").open("a") as handle:
        handle.write("\n[messages]\nenabled = true\n")
    keys = check_ticks(world, 6)
    assert {"inbox", "relationships", "_openai"} <= keys  # an inbox after _openai


def test_a_declared_phase_writing_relationships_commits_normal_files(tmp_path: Path) -> None:
    """Relationships a declared phase gives characters that had none land before
    ``_openai``, not after it."""
    world = tmp_path / "w"
    result = CliRunner().invoke(main, ["init", str(world), "--characters", "4"])
    assert result.exit_code == 0, result.output
    (world / "config.toml").write_text('[llm]\nprovider = "offline"\n' + BOND_CONFIG)
    (world / "schemas").mkdir()
    ids = sorted(p.stem for p in (world / "characters").glob("*.json"))
    (world / "schemas" / "bond.json").write_bytes(orjson.dumps(bond_schema(ids)))
    (world / "prompts" / "bond.md").write_text("How do you feel about the others now?\n")
    keys = check_ticks(world, 2)
    assert {"relationships", "_openai"} <= keys


def test_a_study_network_writes_relationships_in_normal_form(tmp_path: Path) -> None:
    """A study's network factor gives relationships to characters that had none: written
    before a field of the world's own (Wren's ``notes`` in worlds/minds), not after."""
    world = tmp_path / "minds"
    shutil.copytree(WORLDS / "minds", world)
    ids = sorted(p.stem for p in (world / "characters").glob("*.json"))
    ties = tuple(Tie(a, b, "friend", 0.7) for a, b in itertools.pairwise(ids))
    _set_network(world, ConditionNetwork(ties=ties, digest="test"), 1)
    wren = orjson.loads((world / "characters" / "wren.json").read_bytes())
    assert list(wren)[-2:] == ["relationships", "notes"]
    assert not_normal(world) == []
    storage = Storage(world)
    assert storage.changed_files(storage.load()) == {}


def test_sim_set_commits_normal_files(tmp_path: Path) -> None:
    """``sim set`` writes the entity as a load gives it: a key it adds in its place, an
    object given with its keys in another order (a cell's too), an integral trust."""
    world = tmp_path / "w"
    assert CliRunner().invoke(main, ["init", str(world)]).exit_code == 0
    tick(world)  # ada now has _openai, after which relationships used to land
    for assignment in (
        'ada.memory.cells.0={"text": "A new start.", "tick": 0, "importance": 3}',
        'ada.memory.plan={"items": [{"intention": "rest", "at": "06:00"}], "date": "1340-05-01"}',
        "ada.memory.unreflected=3",
        'ada.relationships={"bram": {"trust": 1, "kind": "friend"}}',
    ):
        result = CliRunner().invoke(main, ["set", "--world", str(world), assignment])
        assert result.exit_code == 0, result.output
        assert not_normal(world) == [], assignment
        storage = Storage(world)
        assert storage.changed_files(storage.load()) == {}, assignment
    ada = orjson.loads((world / "characters" / "ada.json").read_bytes())
    assert list(ada["memory"])[-2:] == ["unreflected", "plan"]
    assert ada["relationships"] == {"bram": {"kind": "friend", "trust": 1.0}}
    assert list(ada)[-1] == "_openai"


def test_ticks_an_earlier_sim_wrote_out_of_order_replay_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logs of an earlier sim, whose commits left keys out of order: their replay writes
    the same state in normal form, and says so; ``identical``, the world's last tick too
    (its files compared with the live world's)."""
    world = tmp_path / "minds"
    shutil.copytree(WORLDS / "minds", world)
    with monkeypatch.context() as earlier:  # the commit as it was: entities dumped as held
        earlier.setattr(store, "normal_order", lambda model, data: False)
        result = CliRunner().invoke(main, ["tick", "--world", str(world), "--ticks", "5"])
        assert result.exit_code == 0, result.output
    assert not_normal(world) == ["characters/ada.json"]  # tick 5 appended her archive
    result = CliRunner().invoke(
        main, ["replay", "--world", str(world), "--tick", "1", "--to", "5", "--json"]
    )
    assert result.exit_code == 0, result.output
    ticks = {t["tick"]: t for t in orjson.loads(result.output)["ticks"]}
    assert all(t["identical"] and t["state_matches"] for t in ticks.values())
    assert ticks[1]["reordered_files"] == sorted(
        f"characters/{p.name}" for p in (world / "characters").glob("*.json")
    )
    assert ticks[5]["reordered_files"] == ["characters/ada.json"]
    assert ticks[2]["reordered_files"] == []
    text = CliRunner().invoke(main, ["replay", "--world", str(world), "--tick", "5"]).output
    assert "the same state in normal key order" in text and text.endswith("identical\n")

    # an edit since is not taken for a reordering: the live world is not what the tick
    # committed, so nothing vouches for the logged files' state
    ada = world / "characters" / "ada.json"
    edited = orjson.loads(ada.read_bytes())
    edited["state"]["mood"] = "elated"
    ada.write_bytes(orjson.dumps(edited, option=orjson.OPT_INDENT_2))
    result = CliRunner().invoke(main, ["replay", "--world", str(world), "--tick", "5", "--json"])
    assert result.exit_code == 1
    (tick,) = orjson.loads(result.output)["ticks"]
    assert not tick["state_matches"] and tick["reordered_files"] == []
