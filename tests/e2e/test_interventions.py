"""``sim inject`` and ``sim set``: interventions between ticks, shown in the next tick's
inputs, recorded in its log, reproduced by replay; bad edits write nothing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from conftest import HARVEST, tree

from sim import sections
from sim.cli import main
from sim.interventions import PENDING
from sim.storage import Storage
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log
from sim.ticklog.records import InterventionRecord

STORM = "A storm breaks over the square."


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def calls_by_phase(world: Path, tick: int, phase: str) -> dict[str, dict[str, Any]]:
    """Entity key -> the logged input document of each call of ``phase``."""
    log = read_log(log_path(world, tick))
    return {
        str(c.entity_key): sections.loads(c.input) or {}
        for c in log.calls.values()
        if c.phase == phase
    }


@pytest.fixture
def small(tmp_path: Path) -> Path:
    world = tmp_path / "w"
    assert run("init", str(world)).exit_code == 0  # ada, bram, cora; inn, square
    return world


def where(world: Path) -> dict[str, str]:
    loaded = Storage(world).load()
    return {cid: c["state"]["location"] for cid, c in loaded.characters.items()}


def test_inject_reaches_everyone_there_is_logged_and_replays_identically(small: Path) -> None:
    before = tree(small)
    result = run("inject", "--world", str(small), "--at", "square", STORM)
    assert result.exit_code == 0, result.output
    assert 'inject at square: "A storm breaks over the square."' in result.stdout
    # only the pending file was written
    after = tree(small)
    assert set(after) - set(before) == {PENDING}
    assert {k: v for k, v in after.items() if k != PENDING} == before

    assert run("tick", "--world", str(small)).exit_code == 0
    assert not (small / PENDING).exists()  # consumed by the tick that committed it
    intentions = calls_by_phase(small, 1, "intentions")
    # where each character was when the tick started, as its input says
    start = {key.split(":")[1]: doc["location"]["id"] for key, doc in intentions.items()}
    assert set(start) == set(where(small))
    for doc in intentions.values():
        if doc["location"]["id"] == "square":
            assert doc["happenings"] == [STORM]
        else:
            assert "happenings" not in doc  # other places' inputs are as without it
    assert "square" in start.values() and "inn" in start.values()
    resolution = calls_by_phase(small, 1, "resolution")
    narrative = calls_by_phase(small, 1, "narrative")
    assert resolution["resolution:square"]["happenings"] == [STORM]
    assert narrative["narrative:square"]["happenings"] == [STORM]
    assert "happenings" not in resolution["resolution:inn"]
    # the offline narrator tells it
    log = read_log(log_path(small, 1))
    assert STORM in log.phase_results("narrative")["square"]
    [record] = [r for r in log.records if isinstance(r, InterventionRecord)]
    assert (record.kind, record.location, record.text, record.n) == ("inject", "square", STORM, 1)
    shown = run("log", "--world", str(small), "--tick", "1")
    assert 'intervention 1: inject at square: "A storm breaks over the square."' in shown.output
    replay = run("replay", "--world", str(small), "--tick", "1")
    assert replay.exit_code == 0, replay.output
    assert "tick 1: identical" in replay.output
    # the next tick has no happenings left
    assert run("tick", "--world", str(small)).exit_code == 0
    assert all("happenings" not in d for d in calls_by_phase(small, 2, "intentions").values())
    assert not [r for r in read_log(log_path(small, 2)).records if r.type == "intervention"]


def test_inject_everywhere_and_without_it_the_run_is_unchanged(small: Path, tmp_path: Path) -> None:
    control = tmp_path / "control"
    shutil.copytree(small, control)
    assert run("inject", "--world", str(small), "--everywhere", "The bells ring.").exit_code == 0
    assert run("tick", "--world", str(small)).exit_code == 0
    assert run("tick", "--world", str(control)).exit_code == 0
    for doc in calls_by_phase(small, 1, "intentions").values():
        assert doc["happenings"] == ["The bells ring."]
    for doc in calls_by_phase(small, 1, "narrative").values():
        assert doc["happenings"] == ["The bells ring."]
    # a world without the event ran exactly as before this feature (no key, same inputs)
    for doc in calls_by_phase(control, 1, "intentions").values():
        assert "happenings" not in doc


def test_inject_needs_one_place_and_a_known_location(small: Path) -> None:
    before = tree(small, logs=True)
    for args in (
        ["--at", "moon", STORM],
        ["--at", "square", "--everywhere", STORM],
        [STORM],
        ["--at", "square", "   "],
    ):
        result = run("inject", "--world", str(small), *args)
        assert result.exit_code == 2, (args, result.output)
    assert (
        "unknown location 'moon'; expected one of: inn, square"
        in run("inject", "--world", str(small), "--at", "moon", STORM).output
    )
    assert tree(small, logs=True) == before


def test_set_edits_now_logs_who_what_before_after_and_replays(small: Path) -> None:
    ada = small / "characters" / "ada.json"
    old_mood = orjson.loads(ada.read_bytes())["state"]["mood"]
    before = tree(small)
    result = run("set", "--world", str(small), 'ada.state.mood="furious"', "--json")
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.stdout)
    assert doc["command"] == "set" and doc["ok"] and doc["applies_at_tick"] == 1
    assert doc["intervention"] == {
        "type": "intervention",
        "kind": "set",
        "n": 1,
        "target": "characters/ada",
        "path": "state.mood",
        "before": old_mood,
        "after": "furious",
    }
    # applied at once: the entity file and the pending file, nothing else
    after = tree(small)
    assert orjson.loads(after["characters/ada.json"])["state"]["mood"] == "furious"
    assert {k for k in after if after[k] != before.get(k)} == {"characters/ada.json", PENDING}
    # a new custom field, and a list item
    assert run("set", "--world", str(small), "bram.state.health=7").exit_code == 0
    assert run("set", "--world", str(small), 'square.state.objects.0="fountain"').exit_code == 0
    assert orjson.loads((small / "characters" / "bram.json").read_bytes())["state"]["health"] == 7

    assert run("tick", "--world", str(small)).exit_code == 0
    log = read_log(log_path(small, 1))
    records = [r for r in log.records if isinstance(r, InterventionRecord)]
    assert [(r.n, r.target, r.path, r.after) for r in records] == [
        (1, "characters/ada", "state.mood", "furious"),
        (2, "characters/bram", "state.health", 7),
        (3, "locations/square", "state.objects.0", "fountain"),
    ]
    assert records[1].before is None
    intentions = calls_by_phase(small, 1, "intentions")
    assert intentions["intention:ada"]["character"]["mood"] == "furious"
    shown = run("log", "--world", str(small), "--tick", "1").output
    assert f'intervention 1: set characters/ada state.mood: "{old_mood}" -> "furious"' in shown
    assert "intervention 2: set characters/bram state.health: null -> 7" in shown
    replay = run("replay", "--world", str(small), "--tick", "1", "--json")
    assert replay.exit_code == 0, replay.output
    assert orjson.loads(replay.stdout)["identical"] is True


@pytest.mark.parametrize(
    ("assignment", "expected"),
    [
        ("ada.state.mood=furious", "is not JSON; a string needs quotes"),
        ("ada.state.mood=", "expected a JSON value after '='"),
        ("ada", "expected ENTITY.field.path=JSON"),
        ("nobody.state.mood=1", "no character or location 'nobody'"),
        ('ada.identity.id="eve"', "identity.id is the engine's"),
        ('ada._openai.x="y"', "_openai is the engine's"),
        ("ada.state.mood=3", "field 'state.mood': expected a valid string (got 3)"),
        ('ada.state.inventory="key"', "field 'state.inventory': expected a valid list"),
        ('ada.state.location="moon"', "unknown location 'moon'"),
        ('square.state.connections=["moon"]', "connection to missing location 'moon'"),
        ('ada.state.mood.deep="x"', "state.mood is not an object"),
        ('ada.state.inventory.9="x"', "expected an index below"),
        ("ada.state.mood=NaN", "is not JSON"),
        ('ada.identity={"id": "eve", "name": "Eve"}', "must stay 'ada': the id is the file's"),
        ("ada.state.n=99999999999999999999999", "outside the 64-bit range"),
    ],
)
def test_a_bad_set_names_file_field_and_expectation_and_writes_nothing(
    small: Path, assignment: str, expected: str
) -> None:
    before = tree(small, logs=True)
    result = run("set", "--world", str(small), assignment)
    assert result.exit_code == 2, result.output
    assert expected in result.output
    assert tree(small, logs=True) == before
    as_json = run("set", "--world", str(small), assignment, "--json")
    doc = orjson.loads(as_json.stdout)
    assert (doc["command"], doc["ok"], doc["exit_code"]) == ("set", False, 2)
    assert doc["error"]["type"] == "InputError"


def test_set_checks_a_field_a_declared_phase_writes_against_its_schema(tmp_path: Path) -> None:
    world = tmp_path / "hv"
    shutil.copytree(HARVEST, world, ignore=shutil.ignore_patterns(".sim"))
    before = tree(world)
    bad = run("set", "--world", str(world), 'ana.state.stance="maybe"')
    assert bad.exit_code == 2
    assert "characters/ana.json: field 'state.stance': phase 'vote' writes this field" in bad.output
    assert "'sell', 'keep' or 'undecided'" in bad.output
    assert tree(world) == before
    assert run("set", "--world", str(world), 'ana.state.stance="keep"').exit_code == 0


def test_a_tick_that_does_not_commit_keeps_the_interventions_pending(small: Path) -> None:
    assert run("inject", "--world", str(small), "--at", "square", STORM).exit_code == 0
    stopped = run("tick", "--world", str(small), "--budget-tokens", "50")
    assert stopped.exit_code == 1, stopped.output
    assert (small / PENDING).is_file()  # still waiting
    assert run("tick", "--world", str(small)).exit_code == 0  # resumes the tick
    assert not (small / PENDING).exists()
    log = read_log(log_path(small, 1))
    assert log.resumes == 1
    assert [r.text for r in log.records if isinstance(r, InterventionRecord)] == [STORM]
    assert calls_by_phase(small, 1, "narrative")["narrative:square"]["happenings"] == [STORM]
    assert run("replay", "--world", str(small), "--tick", "1").exit_code == 0


def test_rewind_and_fork_bring_back_the_pending_events(small: Path, tmp_path: Path) -> None:
    assert run("inject", "--world", str(small), "--everywhere", "Snow falls.").exit_code == 0
    pending = (small / PENDING).read_bytes()
    assert run("tick", "--world", str(small), "--ticks", "2").exit_code == 0
    fork = tmp_path / "fork"
    assert run("fork", "--world", str(small), "--tick", "1", "--to", str(fork)).exit_code == 0
    assert (fork / PENDING).read_bytes() == pending
    assert run("rewind", "--world", str(small), "--tick", "1").exit_code == 0
    assert (small / PENDING).read_bytes() == pending
    assert run("tick", "--world", str(small)).exit_code == 0
    assert "happenings" in next(iter(calls_by_phase(small, 1, "intentions").values()))


def test_a_damaged_pending_file_stops_the_tick_before_any_call(small: Path) -> None:
    (small / ".sim").mkdir(exist_ok=True)
    (small / PENDING).write_text('{"version": 1, "interventions": [{"kind": "fly"}]}')
    before = tree(small, logs=True)
    result = run("tick", "--world", str(small))
    assert result.exit_code == 2, result.output
    assert f"{PENDING}: field 'interventions.0." in result.output
    assert tree(small, logs=True) == before


def test_an_overlong_pending_event_is_refused(small: Path) -> None:
    (small / ".sim").mkdir(exist_ok=True)
    record = {"type": "intervention", "kind": "inject", "n": 1, "text": "x" * 5000}
    (small / PENDING).write_bytes(orjson.dumps({"version": 1, "interventions": [record]}))
    result = run("tick", "--world", str(small))
    assert result.exit_code == 2
    assert "interventions.0.text': at most 4000 characters" in result.output


def test_a_linked_pending_file_is_never_read_or_written(small: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text('{"version": 1, "interventions": []}')
    (small / ".sim").mkdir(exist_ok=True)
    os.symlink(outside, small / PENDING)
    result = run("inject", "--world", str(small), "--everywhere", STORM)
    assert result.exit_code == 2, result.output
    assert outside.read_text() == '{"version": 1, "interventions": []}'
    assert run("tick", "--world", str(small)).exit_code == 2


def test_check_lists_what_waits_for_the_next_tick(small: Path) -> None:
    assert run("inject", "--world", str(small), "--at", "inn", "The fire goes out.").exit_code == 0
    assert run("set", "--world", str(small), 'cora.state.mood="wary"').exit_code == 0
    shown = run("check", "--world", str(small))
    assert shown.exit_code == 0, shown.output
    assert 'pending for tick 1: inject at inn: "The fire goes out."' in shown.output
    assert "pending for tick 1: set characters/cora state.mood:" in shown.output
    doc = orjson.loads(run("check", "--world", str(small), "--json").stdout)
    assert [r["kind"] for r in doc["pending_interventions"]] == ["inject", "set"]
    inject = run("inject", "--world", str(small), "--everywhere", "Dusk.", "--json")
    made = orjson.loads(inject.stdout)
    assert (made["command"], made["ok"], made["pending"], made["tick"]) == ("inject", True, 3, 0)
    assert made["intervention"]["location"] is None
