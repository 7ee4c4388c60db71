"""Typed relationships between characters (issue 27): checked references, declared in the
editor schema, shown to the model, updated by a declared phase. Through the CLI."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner

from sim.cli import main
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log


def invoke(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def _edit(path: Path, **top: Any) -> None:
    data = orjson.loads(path.read_bytes())
    data.update(top)
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))


def new_world(tmp_path: Path, *args: str) -> Path:
    world = tmp_path / "w"
    result = invoke("init", str(world), *args)
    assert result.exit_code == 0, result.output
    return world


def test_check_names_each_broken_relationship_by_file_and_field(tmp_path: Path) -> None:
    world = new_world(tmp_path)  # ada, bram, cora
    chars = world / "characters"
    _edit(chars / "ada.json", relationships={"bram": {"kind": "friend"}, "zed": {"kind": "x"}})
    _edit(chars / "bram.json", relationships={"bram": {"kind": "self"}})
    _edit(chars / "cora.json", relationships={"ada": {"kind": "", "trust": 2}})
    before = {p.name: p.read_bytes() for p in chars.iterdir()}
    result = invoke("check", "--world", str(world))
    assert result.exit_code != 0
    out = result.output
    assert "ada.json" in out and "relationships.zed" in out and "unknown character 'zed'" in out
    assert "bram.json" in out and "relationships.bram" in out and "itself" in out
    assert "cora.json" in out and "relationships.ada.kind" in out
    assert "relationships.ada.trust" in out
    assert "relationships.bram:" not in out.split("ada.json", 1)[1].split("\n", 1)[0]
    assert invoke("tick", "--world", str(world)).exit_code != 0  # nothing runs
    assert {p.name: p.read_bytes() for p in chars.iterdir()} == before


def test_a_deleted_character_leaves_a_broken_reference(tmp_path: Path) -> None:
    world = new_world(tmp_path)
    _edit(world / "characters" / "ada.json", relationships={"cora": {"kind": "sister"}})
    assert invoke("check", "--world", str(world)).exit_code == 0
    (world / "characters" / "cora.json").unlink()
    result = invoke("check", "--world", str(world))
    assert result.exit_code != 0
    assert "relationships.cora" in result.output and "unknown character 'cora'" in result.output


def test_the_editor_schema_declares_relationships(tmp_path: Path) -> None:
    assert invoke("schema", "--out", str(tmp_path / "s")).exit_code == 0
    schema = orjson.loads((tmp_path / "s" / "character.schema.json").read_bytes())
    ties = next(s for s in schema["properties"]["relationships"]["anyOf"] if s["type"] == "object")
    assert list(ties["patternProperties"].values()) == [{"$ref": "#/$defs/Relationship"}]
    rel = schema["$defs"]["Relationship"]
    assert rel["required"] == ["kind"]
    assert rel["properties"]["trust"]["minimum"] == 0
    assert rel["properties"]["trust"]["maximum"] == 1


def test_relationships_reach_the_intentions_input_and_files_keep_them(tmp_path: Path) -> None:
    world = new_world(tmp_path)
    tie = {"kind": "rival", "trust": 0.2, "since": "the flood"}
    _edit(world / "characters" / "ada.json", relationships={"bram": tie})
    bram_before = (world / "characters" / "bram.json").read_bytes()
    result = invoke("tick", "--world", str(world))
    assert result.exit_code == 0, result.output
    log = read_log(log_path(world, 1))
    inputs = {c.entity_key: orjson.loads(c.input) for c in log.calls.values()}
    ada = inputs["intention:ada"]
    assert ada["relationships"] == [{"id": "bram", "name": "Bram Oakes", **tie}]
    assert "relationships" not in inputs["intention:bram"]  # nothing added where none
    saved = orjson.loads((world / "characters" / "ada.json").read_bytes())
    assert saved["relationships"] == {"bram": tie}
    # a file without relationships gets no empty field on save
    assert b"relationships" not in (world / "characters" / "bram.json").read_bytes()
    assert b"relationships" not in bram_before


BOND_CONFIG = """
[tick]
phases = ["intentions", "resolution", "narrative", "apply", "bond", "memory"]

[phases.bond]
per = "character"
instructions = "prompts/bond.md"
schema = "schemas/bond.json"
writes = { "relationships" = "updates", "state.mood" = "mood" }
"""


def bond_schema(ids: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "mood": {"type": "string", "maxLength": 40},
            "updates": {
                "type": "array",
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {
                        "to": {"type": "string", "enum": ids},
                        "kind": {"type": "string", "enum": ["friend", "rival"]},
                        "trust": {"type": "number", "minimum": 0, "maximum": 1},
                    },
                    "required": ["to", "trust"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["mood", "updates"],
        "additionalProperties": False,
    }


def bond_world(tmp_path: Path) -> Path:
    world = new_world(tmp_path, "--characters", "4")
    (world / "config.toml").write_text('[llm]\nprovider = "offline"\n' + BOND_CONFIG)
    (world / "schemas").mkdir()
    ids = sorted(p.stem for p in (world / "characters").glob("*.json"))
    (world / "schemas" / "bond.json").write_bytes(orjson.dumps(bond_schema(ids)))
    (world / "prompts" / "bond.md").write_text("How do you feel about the others now?\n")
    for cid in ids:  # everyone starts as an acquaintance of the next
        other = ids[(ids.index(cid) + 1) % len(ids)]
        _edit(world / "characters" / f"{cid}.json", relationships={other: {"kind": "friend"}})
    return world


def test_a_declared_phase_updates_relationships(tmp_path: Path) -> None:
    world = bond_world(tmp_path)
    check = invoke("check", "--world", str(world))
    assert check.exit_code == 0, check.output
    ids = sorted(p.stem for p in (world / "characters").glob("*.json"))
    expected = {
        cid: orjson.loads((world / "characters" / f"{cid}.json").read_bytes())["relationships"]
        for cid in ids
    }
    for ties in expected.values():
        for tie in ties.values():
            tie.setdefault("trust", 0.5)
    result = invoke("tick", "--world", str(world), "--ticks", "3")
    assert result.exit_code == 0, result.output
    refused = merged = 0
    for tick in (1, 2, 3):  # what the answers say, merged as documented
        answers = read_log(log_path(world, tick)).phase_results("bond")
        assert set(answers) == set(ids)
        for cid in ids:
            ties = copy.deepcopy(expected[cid])
            for update in answers[cid]["updates"]:
                fields = {k: v for k, v in update.items() if k != "to" and v is not None}
                ties[update["to"]] = {**ties.get(update["to"], {}), **fields}
            # naming itself, or a new relationship without a kind: the whole write is undone
            if cid in ties or not all("kind" in tie for tie in ties.values()):
                refused += 1
                continue
            merged += ties != expected[cid]
            expected[cid] = ties
    assert merged and refused  # both paths taken with this seed
    for cid in ids:
        saved = orjson.loads((world / "characters" / f"{cid}.json").read_bytes())
        assert saved["relationships"] == expected[cid]
    assert invoke("check", "--world", str(world)).exit_code == 0


def test_a_relationships_write_must_take_a_list_of_updates(tmp_path: Path) -> None:
    world = bond_world(tmp_path)
    config = (
        (world / "config.toml")
        .read_text()
        .replace('"relationships" = "updates"', '"relationships" = "mood"')
    )
    (world / "config.toml").write_text(config)
    result = invoke("check", "--world", str(world))
    assert result.exit_code != 0
    assert "phases.bond.writes.relationships" in result.output
    assert "array of objects" in result.output
