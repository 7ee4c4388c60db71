"""The ``conversation`` phase: a character who means to speak to someone present opens a
conversation of up to ``max_turns`` utterances, one call each seeing the dialogue so far;
the resolution and the narrative see it, the export lists each utterance; replayed byte
for byte and resumed without paying twice."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import DEMO, tree
from test_reflection import CrashAt, logged

from sim.cli import main
from sim.config import load_config
from sim.engine.runner import Runner
from sim.offline.adapter import OfflineAdapter
from sim.sections import loads as read_sections
from sim.storage import Storage
from sim.testing import CountingAdapter
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

ORDER = '["intentions", "conversation", "resolution", "narrative", "apply", "memory"]'


def read_input(text: str) -> dict[str, Any]:
    """A call's input as its phase wrote it (labelled sections, or JSON)."""
    doc = read_sections(text)
    assert doc is not None, text
    return doc


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def demo(tmp_path: Path, extra: str = "") -> Path:
    world = tmp_path / "demo"
    shutil.copytree(DEMO, world, ignore=shutil.ignore_patterns(".sim"))
    (world / "config.toml").write_text(
        f'[llm]\nprovider = "offline"\n\n[tick]\nphases = {ORDER}\n\n[conversation]\n{extra}\n'
    )
    return world


def talks(world: Path, tick: int) -> dict[str, Any]:
    return read_log(log_path(world, tick)).phase_results("conversation")


def test_conversations_take_turns_and_reach_the_game_master(tmp_path: Path) -> None:
    world = demo(tmp_path, "max_turns = 4")
    result = run("tick", "--world", str(world))
    assert result.exit_code == 0, result.output
    held = talks(world, 1)
    assert held, "the demo's first tick has characters speaking to someone present"
    log = read_log(log_path(world, 1))
    calls = [c for c in log.calls.values() if c.phase == "conversation"]
    assert len(calls) == sum(len(t["lines"]) for t in held.values())
    for opener, talk in held.items():
        lines = talk["lines"]
        assert 1 <= len(lines) <= 4
        a, b = talk["participants"]
        assert a == opener
        assert [line["speaker"] for line in lines] == [a, b, a, b][: len(lines)]
        assert talk["ended"] in ("said", "cap")
        # each utterance was one call that saw the dialogue so far
        mine = [read_input(c.input) for c in calls if c.entity_key == f"conversation:{opener}"]
        assert [len(doc["dialogue"]) for doc in mine] == list(range(len(lines)))
        # the game master and the narrative saw the whole dialogue
        where = talk["location"]
        (gm,) = [c for c in log.calls.values() if c.entity_key == f"resolution:{where}"]
        said = [d["says"] for d in read_input(gm.input)["conversations"][0]["dialogue"]]
        assert said == [line["says"] for line in lines]
        (story,) = [c for c in log.calls.values() if c.entity_key == f"narrative:{where}"]
        assert "conversations" in read_input(story.input)
    replay = run("replay", "--world", str(world), "--tick", "1")
    assert replay.exit_code == 0, replay.output
    shown = run("log", "--world", str(world), "--tick", "1")
    assert "[conversation at " in shown.output
    first_line = next(iter(held.values()))["lines"][0]["says"]
    assert f": {first_line}" in shown.output

    out = tmp_path / "tables"
    assert (
        run("export", "--world", str(world), "--out", str(out), "--format", "jsonl").exit_code == 0
    )
    rows = [json.loads(line) for line in (out / "interactions.jsonl").read_text().splitlines()]
    utterances = [r for r in rows if r["kind"] == "utterance"]
    assert len(utterances) == len(calls)
    first = next(iter(held.values()))
    assert {"from": first["participants"][0], "to": first["participants"][1]}.items() <= (
        next(r for r in utterances if r["content"] == first["lines"][0]["says"]).items()
    )


def test_costs_are_capped(tmp_path: Path) -> None:
    world = demo(tmp_path, "max_turns = 1\nmax_conversations_per_tick = 1")
    assert run("tick", "--world", str(world)).exit_code == 0
    held = talks(world, 1)
    assert len(held) == 1
    assert [len(t["lines"]) for t in held.values()] == [1]


def test_off_unless_named(tmp_path: Path) -> None:
    world = demo(tmp_path)
    (world / "config.toml").write_text('[llm]\nprovider = "offline"\n')
    assert run("tick", "--world", str(world)).exit_code == 0
    log = read_log(log_path(world, 1))
    assert not any(c.phase == "conversation" for c in log.calls.values())


def test_a_crash_mid_conversation_resumes_without_paying_twice(tmp_path: Path) -> None:
    world = demo(tmp_path, "max_turns = 4")
    reference = tmp_path / "ref" / "demo"
    shutil.copytree(world, reference)
    overrides = {"llm": {"max_concurrency": 1}}
    Runner(reference, load_config(world_dir=reference, cwd=reference, overrides=overrides)).run(1)
    ref_log = read_log(log_path(reference, 1))
    first = [c for c in ref_log.calls.values() if c.phase == "intentions"]
    seed = Storage(world).load().seed
    crashing = CrashAt(at=len(first) + 3, seed=seed)  # the third utterance
    config = load_config(world_dir=world, cwd=world, overrides=overrides)
    with pytest.raises(BaseException):  # noqa: B017 - CrashAt's Crash, maybe in a group
        Runner(world, config, adapter=crashing).run(1)
    partial = read_log(log_path(world, 1))
    assert [c.phase for c in partial.calls.values()].count("conversation") == 2
    again = CountingAdapter(OfflineAdapter(seed=seed))
    Runner(world, config, adapter=again).run(1)
    assert not set(again.answered) & logged(partial)
    assert len(again.answered) + len(partial.calls) == len(ref_log.calls)
    assert tree(world) == tree(reference)


def test_the_cost_estimate_counts_the_mind_phases(tmp_path: Path) -> None:
    from sim.phases import resolve_phases
    from sim.policy.forecast import plan_tick

    world = demo(tmp_path, "max_turns = 3\nmax_conversations_per_tick = 2")
    order = ORDER.replace('"memory"]', '"reflection", "memory"]')
    (world / "config.toml").write_text((world / "config.toml").read_text().replace(ORDER, order))
    config = load_config(world_dir=world, cwd=world)
    loaded = Storage(world).load()
    plan = plan_tick(loaded, config, resolve_phases(config, world))
    calls = {p.name: p.calls for p in plan.phases}
    assert calls["conversation"] == 2 * 3
    assert calls["reflection"] == len(loaded.characters)
    assert plan.unplanned == ()
