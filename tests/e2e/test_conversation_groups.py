"""``[conversation] max_participants``: beyond two, others at the place join a conversation
who mean to speak to someone in it or whom someone in it addresses; turns go round in
order; each utterance is a row of the export's interactions table; replayed byte for byte
and resumed without paying twice. The default (two) keeps the pairs as they were."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import tree
from test_conversation import demo, read_input, run, talks
from test_reflection import CrashAt, logged

from sim.config import load_config
from sim.engine.runner import Runner
from sim.offline.adapter import OfflineAdapter
from sim.storage import Storage
from sim.testing import CountingAdapter
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

#: the demo's second tick, offline, holds a conversation that a third character joins
TICK = 2


def groups(world: Path, tick: int) -> dict[str, Any]:
    return {o: t for o, t in talks(world, tick).items() if len(t["participants"]) > 2}


def test_a_third_character_joins_and_turns_go_round(tmp_path: Path) -> None:
    world = demo(tmp_path, "max_turns = 5\nmax_participants = 3")
    result = run("tick", "--world", str(world), "--ticks", str(TICK))
    assert result.exit_code == 0, result.output
    held = groups(world, TICK)
    assert held, "the demo's second tick has a character joining a conversation"
    log = read_log(log_path(world, TICK))
    intentions = log.phase_results("intentions")
    calls = [c for c in log.calls.values() if c.phase == "conversation"]
    for opener, talk in held.items():
        people = talk["participants"]
        assert people[0] == opener and len(people) == 3 and len(set(people)) == 3
        a, b, joiner = people
        # the joiner means to speak to someone in it, or someone in it speaks to the joiner
        mine = intentions[joiner]
        addressed = {
            intentions[p].get("target") for p in (a, b) if intentions[p]["action"] == "speak"
        }
        assert (mine["action"] == "speak" and mine.get("target") in (a, b)) or joiner in addressed
        lines = talk["lines"]
        assert len(lines) >= 3, "the joiner had a turn"
        assert [line["speaker"] for line in lines] == [a, b, joiner, a, b][: len(lines)]
        # each turn saw the dialogue so far, and everyone else in it
        asked = [read_input(c.input) for c in calls if c.entity_key == f"conversation:{opener}"]
        assert [len(doc["dialogue"]) for doc in asked] == list(range(len(lines)))
        third = asked[2]
        assert third["speaker"]["id"] == joiner
        assert sorted(w["id"] for w in third["with"]) == sorted([a, b])
        # the game master saw all three
        (gm,) = [c for c in log.calls.values() if c.entity_key == f"resolution:{talk['location']}"]
        seen = read_input(gm.input)["conversations"]
        assert any(len(d["participants"]) == 3 for d in seen)

    # each utterance is a row, to the other two
    out = tmp_path / "tables"
    done = run("export", "--world", str(world), "--out", str(out), "--format", "jsonl")
    assert done.exit_code == 0, done.output
    rows = [json.loads(line) for line in (out / "interactions.jsonl").read_text().splitlines()]
    mine_rows = [r for r in rows if r["kind"] == "utterance" and r["tick"] == TICK]
    assert len(mine_rows) == len(calls)
    for talk in held.values():
        for line in talk["lines"]:
            others = ", ".join(p for p in talk["participants"] if p != line["speaker"])
            assert {"from": line["speaker"], "to": others, "content": line["says"]}.items() <= (
                next(r for r in mine_rows if r["content"] == line["says"]).items()
            )

    replay = run("replay", "--world", str(world), "--tick", str(TICK))
    assert replay.exit_code == 0, replay.output


def test_two_is_the_pairs_as_before(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    default = demo(tmp_path / "a", "max_turns = 5")
    two = demo(tmp_path / "b", "max_turns = 5\nmax_participants = 2")
    for world in (default, two):
        assert run("tick", "--world", str(world), "--ticks", str(TICK)).exit_code == 0
    assert not groups(default, TICK)
    assert talks(default, TICK) == talks(two, TICK)
    # the world as it stands after (its logs hold latencies, its config the setting)
    a, b = tree(default), tree(two)
    assert a.pop("config.toml") != b.pop("config.toml")
    assert a == b


def test_the_cap_on_participants_holds(tmp_path: Path) -> None:
    world = demo(tmp_path, "max_turns = 5\nmax_participants = 10")
    assert run("tick", "--world", str(world), "--ticks", str(TICK)).exit_code == 0
    everyone = [p for t in talks(world, TICK).values() for p in t["participants"]]
    assert len(everyone) == len(set(everyone)), "no one is in two conversations"


def test_a_bad_max_participants_is_refused(tmp_path: Path) -> None:
    world = demo(tmp_path, "max_participants = 1")
    result = run("tick", "--world", str(world))
    assert result.exit_code != 0
    assert "max_participants" in result.output
    assert not (world / ".sim" / "log").exists() or not any((world / ".sim" / "log").iterdir())


def test_a_crash_in_a_joiners_turn_resumes_without_paying_twice(tmp_path: Path) -> None:
    world = demo(tmp_path, "max_turns = 5\nmax_participants = 3")
    overrides = {"llm": {"max_concurrency": 1}}
    config = load_config(world_dir=world, cwd=world, overrides=overrides)
    Runner(world, config).run(TICK - 1)
    reference = tmp_path / "ref" / "demo"
    shutil.copytree(world, reference)
    ref_config = load_config(world_dir=reference, cwd=reference, overrides=overrides)
    Runner(reference, ref_config).run(1)
    ref_log = read_log(log_path(reference, TICK))
    calls = list(ref_log.calls.values())
    (opener, talk), *_ = groups(reference, TICK).items()
    joiner_turn = [c for c in calls if c.entity_key == f"conversation:{opener}"][2]
    at = calls.index(joiner_turn) + 1  # calls go one at a time, in this order
    seed = Storage(world).load().seed
    with pytest.raises(BaseException):  # noqa: B017 - CrashAt's Crash, maybe in a group
        Runner(world, config, adapter=CrashAt(at=at, seed=seed)).run(1)
    partial = read_log(log_path(world, TICK))
    assert len(partial.calls) == at - 1
    again = CountingAdapter(OfflineAdapter(seed=seed))
    Runner(world, config, adapter=again).run(1)
    assert not set(again.answered) & logged(partial)
    assert len(again.answered) + len(partial.calls) == len(ref_log.calls)
    assert tree(world) == tree(reference)
    assert groups(world, TICK)[opener]["participants"] == talk["participants"]
