"""A declared phase's references (``"x-sim-ref"`` in its schema, issue 25): the ids valid
for each subject go out as the field's enum (schema mode) and every answer is checked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import HARVEST, tree
from pydantic import ValidationError

from sim.cli import main
from sim.errors import InputError
from sim.phases.refs import DeclaredRefs
from sim.phases.schema import MAX_STRING, model_from_schema, ref_fields, without_refs
from sim.storage import Storage
from sim.testing.stub_server import StubServer
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

EXTRA = {
    "ally": {"type": "string", "x-sim-ref": "character", "description": "who you side with"},
    "places": {
        "type": "array",
        "items": {"type": "string", "x-sim-ref": "location"},
        "maxItems": 2,
        "description": "where you will campaign",
    },
}


def harvest(dest: Path, mode: str) -> Path:
    shutil.copytree(HARVEST, dest, ignore=shutil.ignore_patterns(".sim"))
    schema_file = dest / "schemas" / "vote.json"
    schema = json.loads(schema_file.read_text())
    schema["properties"].update(EXTRA)
    schema["required"] += list(EXTRA)
    schema_file.write_text(json.dumps(schema))
    config = dest / "config.toml"
    config.write_text(
        config.read_text()
        + f'\n[llm]\ntimeout_seconds = 5\nconstrain_refs = "{mode}"\nbackoff_base_seconds = 0.01\n'
    )
    return dest


def tick(world: Path, base_url: str) -> Result:
    return CliRunner().invoke(
        main,
        ["tick", "--world", str(world), "--provider", "chat", "--base-url", base_url],
        env={"OPENAI_API_KEY": "sk-test"},
        catch_exceptions=False,
    )


def test_marked_fields_go_out_as_enums_and_answers_use_them(
    tmp_path: Path, stub_server: StubServer
) -> None:
    world = harvest(tmp_path / "hv", "schema")
    result = tick(world, stub_server.base_url)
    assert result.exit_code == 0, result.output
    loaded = Storage(world).load()
    votes = [b for b in stub_server.log if "VoteIntention" in json.dumps(b["response_format"])]
    assert votes
    sent = votes[0]["response_format"]["json_schema"]["schema"]["properties"]
    assert sent["ally"]["enum"] == list(loaded.characters)
    assert sent["places"]["items"]["enum"] == list(loaded.locations)
    assert "x-sim-ref" not in json.dumps(votes[0])  # sim's keyword stays home
    results = read_log(log_path(world, 1)).phase_results("vote")
    assert results
    for answer in results.values():
        assert answer["ally"] in loaded.characters
        assert set(answer["places"]) <= set(loaded.locations)


def test_validate_mode_rejects_made_up_ids(tmp_path: Path, stub_server: StubServer) -> None:
    """Without the enum the stub model writes any string: each answer is re-asked with the
    valid ids, still wrong, falls back; the phase is not committed."""
    world = harvest(tmp_path / "hv", "validate")
    before = tree(world)
    result = tick(world, stub_server.base_url)
    assert result.exit_code == 1, result.output
    assert "phase vote: the endpoint is not answering in the expected form" in result.output
    assert " id here: use one of " in result.output
    feedback = [
        m["content"]
        for b in stub_server.log
        for m in b["messages"]
        if m["role"] == "system" and "is not a character id here: use one of" in m["content"]
    ]
    assert feedback  # re-asked with the valid ids
    assert tree(world) == before


def test_the_keyword_is_checked_and_kept_out_of_what_is_sent() -> None:
    schema = {
        "type": "object",
        "properties": {"who": {"type": "string", "x-sim-ref": "present"}},
        "required": ["who"],
    }
    model_from_schema(schema, "p", Path("s.json"))
    assert ref_fields(schema) == ((("who",), "present"),)
    assert without_refs(schema)["properties"]["who"] == {"type": "string"}
    bad = {**schema, "properties": {"who": {"type": "string", "x-sim-ref": "someone"}}}
    with pytest.raises(InputError, match=r"x-sim-ref.*expected one of character, location"):
        model_from_schema(bad, "p", Path("s.json"))
    refs = DeclaredRefs(ref_fields(schema), {"present": ("ann",)})
    model = model_from_schema(schema, "p", Path("s.json"))
    assert refs.problem(model(who="ann")) is None
    problem = refs.problem(model(who="bob"))
    assert problem is not None and '"ann"' in problem


def test_a_string_without_a_cap_gets_one() -> None:
    schema = {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}
    model = model_from_schema(schema, "p", Path("s.json"))
    assert model.model_json_schema()["properties"]["note"]["maxLength"] == MAX_STRING
    with pytest.raises(ValidationError):
        model(note="x" * (MAX_STRING + 1))
    capped = {**schema, "properties": {"note": {"type": "string", "maxLength": 5}}}
    assert (
        model_from_schema(capped, "p", Path("s.json")).model_json_schema()["properties"]["note"][
            "maxLength"
        ]
        == 5
    )
