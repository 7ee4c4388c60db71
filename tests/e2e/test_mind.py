"""The mind (``[memory] mode = "retrieve"``): rated cells, the long-term store, retrieval
by recency, importance and relevance, through the CLI; replayed byte for byte."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from conftest import WORLDS, tree

from sim.cli import main
from sim.sections import loads as read_sections
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

KEY = "the smuggler hid the key under the bell"
BELL = "The church bell rings out over the square."
#: what fills the 100 ticks after the key cell: nothing about bells or keys
CHORES = (
    "Ada Marsh counted the coins in her purse.",
    "Ada Marsh watched the river for a while.",
    "Ada Marsh mended a torn sleeve.",
    "Ada Marsh ate bread and cheese.",
    "Ada Marsh listened to gulls on the roof.",
    "Ada Marsh swept dust from a doorstep.",
    "Ada Marsh hummed an old tune.",
)


def read_input(text: str) -> dict[str, Any]:
    """A call's input as its phase wrote it (labelled sections, or JSON)."""
    doc = read_sections(text)
    assert doc is not None, text
    return doc


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def intention_input(world: Path, tick: int, cid: str = "ada") -> dict[str, Any]:
    log = read_log(log_path(world, tick))
    (call,) = [c for c in log.calls.values() if c.entity_key == f"intention:{cid}"]
    doc: dict[str, Any] = read_input(call.input)
    return doc


def memory_lines(doc: dict[str, Any]) -> list[str]:
    memory = doc["memory"]
    return list(memory.get("recall", memory.get("recent", [])))


def write_config(world: Path, memory: str) -> None:
    (world / "config.toml").write_text(f'[llm]\nprovider = "offline"\n\n[memory]\n{memory}\n')


def long_memory(world: Path, *, tick: int = 199) -> None:
    """Ada at tick ``tick``: the key cell at tick 5 (importance 9) under 100 later cells of
    importance 4, the last five in her window, the rest in her long-term store."""
    path = world / "characters" / "ada.json"
    ada = orjson.loads(path.read_bytes())
    cells = [{"tick": 5, "text": KEY, "importance": 9, "mentions": []}]
    for i, t in enumerate(range(tick - 99, tick + 1)):
        cells.append({"tick": t, "text": CHORES[i % len(CHORES)], "importance": 4})
        cells[-1]["mentions"] = ["ada"]
    ada["memory"] = {"capacity": 5, "cells": cells[-5:], "summary": "", "archive": cells[:-5]}
    path.write_bytes(orjson.dumps(ada, option=orjson.OPT_INDENT_2))
    meta = orjson.loads((world / "world.json").read_bytes())
    meta["tick"] = tick
    (world / "world.json").write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))


@pytest.fixture
def town(tmp_path: Path) -> Path:
    world = tmp_path / "w"
    assert run("init", str(world)).exit_code == 0  # ada at the square
    long_memory(world)
    return world


RETRIEVE = 'mode = "retrieve"\nk = 3'


@pytest.mark.parametrize("embeddings", ["none", "provider"])
def test_the_important_cell_comes_back_when_the_bell_comes_up(town: Path, embeddings: str) -> None:
    write_config(town, f'{RETRIEVE}\nembeddings = "{embeddings}"')
    assert run("inject", "--world", str(town), "--at", "square", BELL).exit_code == 0
    result = run("tick", "--world", str(town))
    assert result.exit_code == 0, result.output
    lines = memory_lines(intention_input(town, 200))
    assert len(lines) == 3
    assert f"tick 5: {KEY}" in lines
    if embeddings == "none":  # no other cell shares a word with the situation: recency
        assert lines[-1] == f"tick 199: {CHORES[99 % len(CHORES)]}"
    # replayed byte for byte
    replay = run("replay", "--world", str(town), "--tick", "200")
    assert replay.exit_code == 0, replay.output


@pytest.mark.parametrize("embeddings", ["none", "provider"])
def test_without_the_bell_recency_wins(town: Path, embeddings: str) -> None:
    """Relevance is what brings the key cell back: with no bell, the recent cells win."""
    write_config(town, f'{RETRIEVE}\nembeddings = "{embeddings}"')
    assert run("tick", "--world", str(town)).exit_code == 0
    lines = memory_lines(intention_input(town, 200))
    assert len(lines) == 3
    assert all(KEY not in line for line in lines)
    if embeddings == "none":
        assert [line.split(":")[0] for line in lines] == ["tick 197", "tick 198", "tick 199"]


def test_a_window_of_the_same_size_does_not_have_it(town: Path) -> None:
    write_config(town, 'mode = "window"\nk = 3')
    assert run("inject", "--world", str(town), "--at", "square", BELL).exit_code == 0
    assert run("tick", "--world", str(town)).exit_code == 0
    doc = intention_input(town, 200)
    lines = memory_lines(doc)
    assert "recall" not in doc["memory"]
    assert len(lines) == 3
    assert all(KEY not in line for line in lines)


def test_retrieved_cells_cost_no_more_than_the_window(town: Path, tmp_path: Path) -> None:
    """Same k, same cells' length: the retrieved input is no longer than the window's."""
    sizes = {}
    for mode in ("window", "retrieve"):
        world = tmp_path / mode / "w"  # same name: same world view
        assert run("init", str(world)).exit_code == 0
        long_memory(world)
        # every cell the same length: what differs is only which cells are shown
        path = world / "characters" / "ada.json"
        ada = orjson.loads(path.read_bytes())
        for cell in (*ada["memory"]["archive"], *ada["memory"]["cells"]):
            cell["text"] = cell["text"][:40].ljust(40, ".")
        path.write_bytes(orjson.dumps(ada))
        write_config(world, f'mode = "{mode}"\nk = 3')
        assert run("inject", "--world", str(world), "--at", "square", BELL).exit_code == 0
        assert run("tick", "--world", str(world)).exit_code == 0
        log = read_log(log_path(world, 200))
        (call,) = [c for c in log.calls.values() if c.entity_key == "intention:ada"]
        sizes[mode] = (len(call.input), call.usage.input_tokens)
        assert (KEY in call.input) == (mode == "retrieve")
    assert sizes["retrieve"][0] <= sizes["window"][0]
    assert sizes["retrieve"][1] <= sizes["window"][1]


def test_cells_are_rated_and_evicted_cells_kept(town: Path) -> None:
    write_config(town, RETRIEVE)
    assert run("tick", "--world", str(town)).exit_code == 0
    ada = orjson.loads((town / "characters" / "ada.json").read_bytes())
    memory = ada["memory"]
    new = memory["cells"][-1]
    assert new["tick"] == 200
    assert 1 <= new["importance"] <= 10  # the offline resolution rated it
    assert "ada" in new["mentions"]
    assert len(memory["cells"]) == 5  # the memory phase evicted the oldest ...
    assert len(memory["archive"]) == 97  # ... into the long-term store
    assert memory["archive"][0]["text"] == KEY
    # the resolution asked for ratings
    log = read_log(log_path(town, 200))
    schema = next(c for c in log.calls.values() if c.phase == "resolution").schema_name
    assert schema is not None


def test_retrieval_is_deterministic(tmp_path: Path) -> None:
    trees = []
    for name in ("a", "b"):
        world = tmp_path / name / "w"
        assert run("init", str(world)).exit_code == 0
        long_memory(world)
        write_config(world, f'{RETRIEVE}\nembeddings = "provider"')
        assert run("inject", "--world", str(world), "--at", "square", BELL).exit_code == 0
        assert run("tick", "--world", str(world), "--ticks", "3").exit_code == 0
        trees.append({k: v for k, v in tree(world).items() if k != "README.md"})
    assert trees[0] == trees[1]


def test_window_worlds_keep_their_bytes(tmp_path: Path) -> None:
    """Without the mind, cells stay {tick, text}: older worlds' files do not change shape."""
    world = tmp_path / "w"
    assert run("init", str(world)).exit_code == 0
    assert run("tick", "--world", str(world)).exit_code == 0
    ada = orjson.loads((world / "characters" / "ada.json").read_bytes())
    assert set(ada["memory"]) == {"capacity", "cells", "summary"}
    assert set(ada["memory"]["cells"][0]) == {"tick", "text"}


def test_a_bad_importance_is_refused_by_name(town: Path) -> None:
    path = town / "characters" / "ada.json"
    ada = orjson.loads(path.read_bytes())
    ada["memory"]["archive"][0]["importance"] = 11
    path.write_bytes(orjson.dumps(ada))
    before = tree(town)
    result = run("tick", "--world", str(town))
    assert result.exit_code == 2
    assert "memory.archive.0.importance" in result.output
    assert tree(town) == before


def test_provider_embeddings_without_an_embedding_model_are_refused(
    town: Path, tmp_path: Path
) -> None:
    """A remote provider's embeddings need ``[memory] embedding_model``: without one, the
    run stops on a named config error (nothing written), not a silent fallback."""
    config = tmp_path / "mine.toml"
    config.write_text(
        '[llm]\nprovider = "openai"\n\n[memory]\nmode = "retrieve"\nembeddings = "provider"\n'
    )
    (town / "config.toml").unlink()
    before = tree(town)
    result = run("tick", "--world", str(town), "--config", str(config))
    assert result.exit_code == 2, result.output
    assert "memory.embeddings" in result.output
    assert "'openai'" in result.output
    assert tree(town) == before


def test_the_minds_example_world_runs_and_replays(tmp_path: Path) -> None:
    """worlds/minds: retrieval, reflection and time together, replayed byte for byte."""
    world = tmp_path / "minds"
    shutil.copytree(WORLDS / "minds", world, ignore=shutil.ignore_patterns(".sim"))
    assert run("check", "--world", str(world)).exit_code == 0
    result = run("tick", "--world", str(world), "--ticks", "6")
    assert result.exit_code == 0, result.output
    reflected = [
        t
        for t in range(1, 7)
        if any(c.phase == "reflection" for c in read_log(log_path(world, t)).calls.values())
    ]
    assert reflected
    for tick in (reflected[0], 6):
        replay = run("replay", "--world", str(world), "--tick", str(tick))
        assert replay.exit_code == 0, replay.output


OPINION = """
[tick]
phases = ["intentions", "resolution", "narrative", "apply", "opinion", "memory"]

[phases.opinion]
per = "character"
instructions = "prompts/opinion.md"
schema = "schemas/opinion.json"
"""


def test_one_phase_may_retrieve_while_the_others_keep_the_window(town: Path) -> None:
    (town / "schemas").mkdir()
    (town / "schemas" / "opinion.json").write_text(
        '{"type": "object", "title": "Opinion", "properties": {"view": {"type": "string"}},'
        ' "required": ["view"]}'
    )
    (town / "prompts" / "opinion.md").write_text("Say what you think.")
    write_config(town, 'mode = "window"\nk = 3\n\n[memory.phases.opinion]\nmode = "retrieve"')
    (town / "config.toml").write_text((town / "config.toml").read_text() + OPINION)
    assert run("inject", "--world", str(town), "--at", "square", BELL).exit_code == 0
    result = run("tick", "--world", str(town))
    assert result.exit_code == 0, result.output
    assert all(KEY not in line for line in memory_lines(intention_input(town, 200)))
    log = read_log(log_path(town, 200))
    (opinion,) = [c for c in log.calls.values() if c.entity_key == "opinion:ada"]
    assert f"tick 5: {KEY}" in read_input(opinion.input)["memory"]["recall"]
    # retrieval in one phase keeps evicted cells for all
    assert (
        len(orjson.loads((town / "characters" / "ada.json").read_bytes())["memory"]["archive"])
        == 97
    )


def test_memory_settings_for_a_phase_not_run_are_refused(town: Path) -> None:
    write_config(town, 'mode = "retrieve"\n\n[memory.phases.vote]\nk = 5')
    before = tree(town)
    result = run("tick", "--world", str(town))
    assert result.exit_code == 2
    assert "memory.phases.vote" in result.output
    assert tree(town) == before


def test_a_crash_mid_tick_resumes_to_the_same_retrieval(town: Path, tmp_path: Path) -> None:
    """Retrieval is a function of the state a tick starts from: a resumed tick builds the
    same inputs, pays nothing twice and ends where an uninterrupted one does."""
    from test_reflection import CrashAt, logged

    from sim.config import load_config
    from sim.engine.runner import Runner
    from sim.offline.adapter import OfflineAdapter
    from sim.storage import Storage
    from sim.testing import CountingAdapter

    write_config(town, RETRIEVE)
    assert run("inject", "--world", str(town), "--at", "square", BELL).exit_code == 0
    reference = tmp_path / "ref" / "w"
    shutil.copytree(town, reference)
    overrides = {"llm": {"max_concurrency": 1}}
    Runner(reference, load_config(world_dir=reference, cwd=reference, overrides=overrides)).run(1)
    ref_log = read_log(log_path(reference, 200))
    seed = Storage(town).load().seed
    config = load_config(world_dir=town, cwd=town, overrides=overrides)
    with pytest.raises(BaseException):  # noqa: B017 - CrashAt's Crash, maybe in a group
        Runner(town, config, adapter=CrashAt(at=3, seed=seed)).run(1)
    partial = read_log(log_path(town, 200))
    again = CountingAdapter(OfflineAdapter(seed=seed))
    Runner(town, config, adapter=again).run(1)
    assert not set(again.answered) & logged(partial)
    assert len(again.answered) + len(partial.calls) == len(ref_log.calls)
    assert tree(town) == tree(reference)
    assert f"tick 5: {KEY}" in memory_lines(intention_input(town, 200))
