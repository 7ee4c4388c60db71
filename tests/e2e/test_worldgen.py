"""`sim init` and `sim schema`, through the CLI."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import DEMO, tree

from sim.cli import main


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_a_new_world_passes_check_and_ticks_at_once(tmp_path: Path) -> None:
    world = tmp_path / "river-town"
    result = invoke("init", str(world))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in world.iterdir()) == [
        "README.md",
        "characters",
        "config.toml",
        "locations",
        "prompts",
        "world.json",
    ]
    assert len(list((world / "characters").glob("*.json"))) == 3
    assert len(list((world / "locations").glob("*.json"))) == 2
    assert (world / "prompts" / "intentions.md").is_file()
    assert "River Town" in (world / "README.md").read_text()
    check = invoke("check", "--world", str(world))
    assert check.exit_code == 0, check.output
    assert "3 characters, 2 locations; provider offline" in check.output
    ticked = invoke("tick", "--world", str(world), "--ticks", "2")
    assert ticked.exit_code == 0, ticked.output
    assert orjson.loads((world / "world.json").read_bytes())["tick"] == 2


@pytest.mark.parametrize(("characters", "locations"), [(1, 1), (10, 7)])
def test_any_size_is_valid(tmp_path: Path, characters: int, locations: int) -> None:
    world = tmp_path / "w"
    args = ["--characters", str(characters), "--locations", str(locations)]
    assert invoke("init", str(world), *args).exit_code == 0
    check = invoke("check", "--world", str(world))
    assert check.exit_code == 0, check.output
    assert f"{characters} characters, {locations} locations" in check.output
    assert invoke("tick", "--world", str(world)).exit_code == 0


def test_init_is_deterministic_and_takes_an_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "b" / "w").mkdir(parents=True)
    assert invoke("init", str(tmp_path / "a" / "w")).exit_code == 0
    assert invoke("init", str(tmp_path / "b" / "w")).exit_code == 0
    first, second = tree(tmp_path / "a" / "w"), tree(tmp_path / "b" / "w")
    assert first.pop("README.md") != second.pop("README.md")  # names its folder's path
    assert first == second


def test_init_refuses_a_folder_that_is_not_empty(tmp_path: Path) -> None:
    world = tmp_path / "w"
    world.mkdir()
    (world / "notes.txt").write_text("mine")
    result = invoke("init", str(world))
    assert result.exit_code == 2
    assert "is not empty" in result.output
    assert tree(world) == {"notes.txt": b"mine"}
    (tmp_path / "file").write_text("x")
    assert invoke("init", str(tmp_path / "file")).exit_code == 2
    # nothing left behind beside it either
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "w"]


def load_schemas(tmp_path: Path) -> dict[str, dict]:
    out = tmp_path / "schemas"
    result = invoke("schema", "--out", str(out))
    assert result.exit_code == 0, result.output
    return {p.name: orjson.loads(p.read_bytes()) for p in sorted(out.glob("*.json"))}


def test_schemas_accept_valid_worlds_and_refuse_what_check_refuses(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (dev extra) not installed")
    schemas = load_schemas(tmp_path)
    assert set(schemas) == {
        "world.schema.json",
        "character.schema.json",
        "location.schema.json",
        "study.schema.json",
    }
    validators = {name: jsonschema.Draft202012Validator(s) for name, s in schemas.items()}
    for validator in validators.values():
        validator.check_schema(validator.schema)
    made = tmp_path / "made"
    assert invoke("init", str(made), "--characters", "4").exit_code == 0
    for root in (DEMO, made):
        validators["world.schema.json"].validate(orjson.loads((root / "world.json").read_bytes()))
        for kind, name in (("characters", "character"), ("locations", "location")):
            for path in sorted((root / kind).glob("*.json")):
                validators[f"{name}.schema.json"].validate(orjson.loads(path.read_bytes()))

    char = orjson.loads((DEMO / "characters" / "ada.json").read_bytes())
    bad_id = {**char, "identity": {**char["identity"], "id": "Ada Strand"}}
    no_place = {**char, "state": {"mood": "calm"}}
    assert not validators["character.schema.json"].is_valid(bad_id)
    assert not validators["character.schema.json"].is_valid(no_place)
    assert not validators["world.schema.json"].is_valid({"name": "x", "tick": "3"})
    assert not validators["world.schema.json"].is_valid({"tick": 0})
    # unknown fields are allowed, as the engine keeps them
    assert validators["character.schema.json"].is_valid({**char, "notes": {"any": 1}})
    # and sim check agrees on the bad id
    world = tmp_path / "bad"
    assert invoke("init", str(world)).exit_code == 0
    path = world / "characters" / "ada.json"
    data = orjson.loads(path.read_bytes())
    data["identity"]["id"] = "Ada Strand"
    path.write_bytes(orjson.dumps(data))
    assert invoke("check", "--world", str(world)).exit_code == 2
