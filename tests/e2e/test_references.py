"""References the model cannot get wrong (issue 25), through real HTTP against the stub
server: a model naming ids that are not there is re-asked with the valid ids fed back; one
still wrong falls back; nothing invalid reaches the world or the log's results."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import tree

from sim import sections
from sim.cli import main
from sim.storage import Storage
from sim.testing.stub_server import StubServer
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

CONFIG = """
[llm]
timeout_seconds = 5
max_concurrency = 1
backoff_base_seconds = 0.01
backoff_cap_seconds = 0.05
{extra}
"""


def setup(world: Path, extra: str = "") -> None:
    (world / "config.toml").write_text(CONFIG.format(extra=extra))


def tick(world: Path, base_url: str, provider: str = "chat") -> Result:
    return CliRunner().invoke(
        main,
        ["tick", "--world", str(world), "--provider", provider, "--base-url", base_url],
        env={"OPENAI_API_KEY": "sk-test"},
        catch_exceptions=False,
    )


def _instructions(body: dict[str, Any]) -> str:
    if "instructions" in body:  # the Responses API
        return str(body["instructions"])
    return "\n".join(
        str(m.get("content")) for m in body.get("messages", []) if m.get("role") == "system"
    )


def _schema(body: dict[str, Any]) -> dict[str, Any]:
    fmt = body.get("response_format") or {}
    schema: dict[str, Any] = (fmt.get("json_schema") or {}).get("schema") or {}
    return schema


def _targets(body: dict[str, Any]) -> dict[str, list[str] | None]:
    """Per action, the target ids the intention schema sent allows (a local server gets
    one root branch per action)."""
    return {
        branch["properties"]["action"]["enum"][0]: branch["properties"]["target"].get("enum")
        for branch in _schema(body).get("anyOf", [])
    }


def _target_enum(body: dict[str, Any]) -> list[str] | None:
    """Every target id the intention schema sent allows, whatever the action."""
    per_action = _targets(body)
    if per_action:
        named = [i for ids in per_action.values() for i in ids or ()]
        return list(dict.fromkeys(named)) if named else None
    branches = _schema(body).get("properties", {}).get("target", {}).get("anyOf", [])
    for branch in branches:
        if branch.get("type") == "string":
            return branch.get("enum")
    return None


@pytest.mark.parametrize("provider", ["chat", "openai"])
def test_a_wrong_target_is_reasked_with_the_valid_ids(
    demo_world: Path, stub_server: StubServer, provider: str
) -> None:
    setup(demo_world)
    stub_server.enqueue("wrong_ids")  # the first character's first answer only
    result = tick(demo_world, stub_server.base_url, provider)
    assert result.exit_code == 0, result.output
    assert "fallback:" not in result.output
    first, again = stub_server.log[0], stub_server.log[1]
    feedback = _instructions(again)
    assert "Your previous answer was rejected" not in _instructions(first)
    assert "target 'place' is not " in feedback and "set target to one of " in feedback
    log = read_log(log_path(demo_world, 1))
    call = next(c for c in log.calls.values() if len(c.attempts) == 2 and c.phase == "intentions")
    assert [a.error_code for a in call.attempts] == ["schema_error", None]
    cid = str(call.entity_key).split(":", 1)[1]
    # the ids named are the valid ones for this character: exits, others here, objects
    before = {rel: json.loads(data) for rel, data in log.state().items() if rel.endswith(".json")}
    char = before[f"characters/{cid}.json"]
    loc = before[f"locations/{char['state']['location']}.json"]
    here = [
        c["identity"]["id"]
        for rel, c in before.items()
        if rel.startswith("characters/") and c["state"]["location"] == loc["identity"]["id"]
    ]
    valid = {
        *loc["state"]["connections"],
        *loc["state"]["objects"],
        *char["state"]["inventory"],
        *(c for c in here if c != cid),
    }
    named = re.findall(r'"([^"]+)"', feedback.split("set target to one of ", 1)[1].split("\n")[0])
    assert named and set(named) <= valid
    assert log.phase_results("intentions")[cid]["target"] != "place"


def test_the_chat_schema_carries_the_ids_as_an_enum(
    demo_world: Path, stub_server: StubServer
) -> None:
    setup(demo_world)
    assert tick(demo_world, stub_server.base_url).exit_code == 0
    body = stub_server.log[0]
    data = sections.loads(body["messages"][-1]["content"])
    assert data is not None
    loc = data["location"]["id"]
    world = Storage(demo_world).load()
    before = world.locations[loc]["state"]
    enum = _target_enum(body)
    assert enum is not None
    assert set(before["connections"]) <= set(enum)
    assert data["character"]["id"] not in enum  # no one speaks to themselves
    # each action allows only its own ids: a grammar cannot pair a move with a person
    targets = _targets(body)
    assert targets["move"] == before["connections"]
    assert targets["wait"] is None
    assert not set(targets.get("speak") or ()) & set(before["connections"])


def test_validate_mode_sends_the_schema_as_it_is(demo_world: Path, stub_server: StubServer) -> None:
    setup(demo_world, 'constrain_refs = "validate"')
    assert tick(demo_world, stub_server.base_url).exit_code == 0
    assert _target_enum(stub_server.log[0]) is None


def test_answers_still_wrong_fall_back_and_touch_nothing(
    demo_world: Path, stub_server: StubServer
) -> None:
    setup(demo_world)
    # the first character's three attempts (json_max_retries = 2), then, after the other
    # nine intentions, the first location's three resolution attempts
    stub_server.enqueue(*["wrong_ids"] * 3, *[None] * 9, *["wrong_ids"] * 3)
    result = tick(demo_world, stub_server.base_url)
    assert result.exit_code == 0, result.output
    assert result.output.count("fallback:") == 2, result.output
    log = read_log(log_path(demo_world, 1))
    failed = [c for c in log.calls.values() if c.error_code]
    assert sorted(c.phase for c in failed) == ["intentions", "resolution"]
    for call in failed:
        assert call.error_code == "schema_error" and len(call.attempts) == 3
    world = Storage(demo_world).load()
    # the fallback: an idle intention; no outcome for "1", no move to "nowhere", no ghost
    results = json.dumps(log.phase_results("intentions")) + json.dumps(
        log.phase_results("resolution")
    )
    assert '"place"' not in results and '"nowhere"' not in results
    assert "a ghost" not in results
    for char in world.characters.values():
        assert char["state"]["location"] in world.locations
    for loc in world.locations.values():
        assert "a ghost" not in loc["state"]["objects"]


def test_a_model_that_never_names_a_valid_id_commits_nothing(
    demo_world: Path, stub_server: StubServer
) -> None:
    setup(demo_world)
    before = tree(demo_world)
    stub_server.model_faults["gpt-4.1-mini"] = "wrong_ids"
    result = tick(demo_world, stub_server.base_url)
    assert result.exit_code == 1, result.output
    assert "not answering in the expected form" in result.output
    assert re.search(r"is not (an exit from here|someone here|an object here)", result.output)
    assert tree(demo_world) == before


def test_constrain_refs_per_phase(demo_world: Path, stub_server: StubServer) -> None:
    setup(demo_world, '\n[phase1]\nconstrain_refs = "validate"\n')
    assert tick(demo_world, stub_server.base_url).exit_code == 0
    bodies = list(stub_server.log)
    intentions = [b for b in bodies if '"Intention"' in json.dumps(b["response_format"])]
    resolutions = [b for b in bodies if '"Resolution"' in json.dumps(b["response_format"])]
    assert intentions and resolutions
    assert all(_target_enum(b) is None for b in intentions)
    schema = resolutions[0]["response_format"]["json_schema"]["schema"]
    assert schema["$defs"]["Outcome"]["properties"]["character_id"]["enum"]
