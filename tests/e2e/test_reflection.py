"""The ``reflection`` phase: off unless named; runs for a character whose unreflected
importance passes ``[reflection] threshold``; stores insights as cells citing their
sources; logged, replayed byte for byte, resumed without paying twice."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from conftest import tree

from sim.cli import main
from sim.config import load_config
from sim.engine.runner import Runner
from sim.llm.types import AdapterResponse, ModelRequest
from sim.offline.adapter import OfflineAdapter
from sim.storage import Storage
from sim.testing import CountingAdapter, call_digest
from sim.ticklog.format import log_path
from sim.ticklog.reader import TickLog, read_log

ORDER = '["intentions", "resolution", "narrative", "apply", "reflection", "memory"]'
CHORES = (
    "Ada Marsh waited for the ferry by the jetty with Cora Vell.",
    "Cora Vell told Ada Marsh the ferryman owes money at the inn.",
    "Ada Marsh found a torn ferry ticket in the square.",
    "Ada Marsh asked Bram Oakes about the ferry; he shrugged.",
)


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def character(world: Path, cid: str) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads((world / "characters" / f"{cid}.json").read_bytes())
    return data


def prime(world: Path, unreflected: dict[str, int]) -> None:
    """Give each character four rated cells and this much importance awaiting reflection."""
    for cid, owed in unreflected.items():
        path = world / "characters" / f"{cid}.json"
        char = orjson.loads(path.read_bytes())
        cells = [
            {"tick": t + 1, "text": text, "importance": 5, "mentions": ["ada", "cora"]}
            for t, text in enumerate(CHORES)
        ]
        char["memory"].update(cells=cells, unreflected=owed, capacity=10)
        path.write_bytes(orjson.dumps(char, option=orjson.OPT_INDENT_2))
    meta = orjson.loads((world / "world.json").read_bytes())
    meta["tick"] = 4
    (world / "world.json").write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))


@pytest.fixture
def town(tmp_path: Path) -> Path:
    world = tmp_path / "w"
    assert run("init", str(world)).exit_code == 0
    (world / "config.toml").write_text(
        f'[llm]\nprovider = "offline"\n\n[tick]\nphases = {ORDER}\n\n[reflection]\nthreshold = 40\n'
    )
    prime(world, {"ada": 39, "bram": 0, "cora": 0})
    return world


def reflection_calls(world: Path, tick: int) -> dict[str, Any]:
    log = read_log(log_path(world, tick))
    return {str(c.entity_key): c for c in log.calls.values() if c.phase == "reflection"}


def test_off_unless_named(tmp_path: Path) -> None:
    world = tmp_path / "w"
    assert run("init", str(world)).exit_code == 0
    prime(world, {"ada": 500})
    assert run("tick", "--world", str(world)).exit_code == 0
    assert reflection_calls(world, 5) == {}
    assert not any("sources" in c for c in character(world, "ada")["memory"]["cells"])


def test_a_character_past_the_threshold_reflects_and_cites_its_sources(town: Path) -> None:
    result = run("tick", "--world", str(town))
    assert result.exit_code == 0, result.output
    calls = reflection_calls(town, 5)
    assert set(calls) == {"reflection:ada"}  # bram and cora are far from the threshold
    doc = orjson.loads(calls["reflection:ada"].input)
    assert [m["n"] for m in doc["memories"]] == [1, 2, 3, 4, 5]
    assert "Cora Vell" in doc["people"]
    memory = character(town, "ada")["memory"]
    insights = [c for c in memory["cells"] if "sources" in c]
    assert 1 <= len(insights) <= 3
    ticks = {c["tick"] for c in memory["cells"] if "sources" not in c}
    for cell in insights:
        assert cell["tick"] == 5
        assert 1 <= cell["importance"] <= 10
        assert cell["sources"] and set(cell["sources"]) <= ticks
    # drawn from the cells' contents: the ferry and Cora come up in most of them
    text = " ".join(c["text"] for c in insights)
    assert "Cora Vell" in text or "ferry" in text
    assert memory["unreflected"] == 0
    assert character(town, "bram")["memory"]["unreflected"] > 0  # not reset: not reflected

    # the log names the phase and its schema; replay reproduces it byte for byte
    log = read_log(log_path(town, 5))
    assert "reflection" in log.phases
    replay = run("replay", "--world", str(town), "--tick", "5")
    assert replay.exit_code == 0, replay.output


def test_sim_check_renders_the_reflection_templates(town: Path) -> None:
    (town / "prompts" / "reflection.md").write_text("Reflect as {{ character.nope.deeper }}.")
    result = run("check", "--world", str(town))
    assert result.exit_code != 0
    assert "reflection.md" in result.output


class Crash(BaseException):
    """Stands in for the process dying mid-tick."""


class CrashAt:
    name = "offline"

    def __init__(self, at: int, seed: int) -> None:
        self.inner = CountingAdapter(OfflineAdapter(seed=seed))
        self.at = at
        self.started = 0

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        self.started += 1
        if self.started == self.at:
            raise Crash
        return await self.inner.execute(request)

    async def delete_response(self, response_id: str) -> None:
        await self.inner.delete_response(response_id)


def logged(log: TickLog) -> set[str]:
    return {
        call_digest(log.instructions[c.instructions_digest], c.input) for c in log.calls.values()
    }


def test_a_crash_in_reflection_resumes_without_paying_twice(town: Path, tmp_path: Path) -> None:
    prime(town, {"ada": 39, "bram": 39, "cora": 39})
    reference = tmp_path / "ref" / "w"
    shutil.copytree(town, reference)
    config = load_config(
        world_dir=reference, cwd=reference, overrides={"llm": {"max_concurrency": 1}}
    )
    Runner(reference, config).run(1)
    ref_log = read_log(log_path(reference, 5))
    before = [c for c in ref_log.calls.values() if c.phase not in ("reflection", "memory")]
    assert len(reflection_calls(reference, 5)) == 3

    seed = Storage(town).load().seed  # the offline model a plain tick uses
    crashing = CrashAt(at=len(before) + 2, seed=seed)  # the second reflection call
    config = load_config(world_dir=town, cwd=town, overrides={"llm": {"max_concurrency": 1}})
    with pytest.raises(BaseException) as caught:
        Runner(town, config, adapter=crashing).run(1)
    assert (
        caught.group_contains(Crash)
        if isinstance(caught.value, BaseExceptionGroup)
        else isinstance(caught.value, Crash)
    )
    assert Storage(town).load().tick == 4
    partial = read_log(log_path(town, 5))
    assert [c.phase for c in partial.calls.values()].count("reflection") == 1

    again = CountingAdapter(OfflineAdapter(seed=seed))
    Runner(town, config, adapter=again).run(1)
    assert not set(again.answered) & logged(partial)  # nothing paid twice
    assert len(again.answered) + len(partial.calls) == len(ref_log.calls)
    assert tree(town) == tree(reference)
