"""Intentions in ``mode = "tools"`` over several turns: look / recall / inventory steps
answered by the engine, bounded by ``[phase1] max_tool_steps``, each step a logged call
that replay serves again."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import Counted, copy_demo, tree

from sim.cli import main
from sim.config import Config, load_config
from sim.engine.runner import Runner
from sim.errors import RunFailed
from sim.llm.errors import LLMTimeoutError
from sim.llm.tools import FunctionCall, ToolCalls
from sim.llm.types import AdapterResponse, ModelRequest, Usage
from sim.phases.intention_steps import QUERY_NAMES, answer_query, look, recall
from sim.storage import Storage
from sim.testing import default_instance
from sim.testing.gemini_stub import GeminiStubServer
from sim.ticklog.reader import read_log
from sim.ticklog.records import record_data

TOOLS_MODE = '[phase1]\nmode = "tools"\n'


def run(args: list[str], env: dict[str, Any] | None = None) -> Any:
    return CliRunner().invoke(main, args, env=env, catch_exceptions=False)


def called_tools(world: Path, tick: int) -> list[tuple[str, str]]:
    """(request id, tools called) of each intentions call of a tick, from ``sim log``."""
    out = run(["log", "--world", str(world), "--tick", str(tick), "--calls"]).output
    return [
        (m.group(1), m.group(2))
        for m in re.finditer(r"^(\d+:intentions:\S+)\s.*tools: (.+)$", out, re.MULTILINE)
    ]


def test_offline_characters_look_before_acting_and_replay_identically(
    demo_world: Path, tmp_path: Path
) -> None:
    (demo_world / "config.toml").write_text(TOOLS_MODE)
    result = run(["tick", "--world", str(demo_world), "--ticks", "2"])
    assert result.exit_code == 0, result.output
    characters = len(Storage(demo_world).load().characters)
    calls = called_tools(demo_world, 1)
    assert len(calls) == 2 * characters  # one query step, then one action, each
    steps = {rid: tools for rid, tools in calls}
    firsts = [tools for rid, tools in steps.items() if rid.endswith(":0")]
    seconds = [tools for rid, tools in steps.items() if rid.endswith(":1")]
    assert set(firsts) <= QUERY_NAMES and len(set(firsts)) >= 2
    assert set(seconds) <= {"move_to", "say", "act", "wait"}
    # replay serves every step from the log and gets the same world
    replay = run(["replay", "--world", str(demo_world), "--tick", "1", "--to", "2"])
    assert replay.exit_code == 0, replay.output
    assert "identical (" in replay.output and "drift" not in replay.output.lower()
    # and the whole run is deterministic
    other = copy_demo(tmp_path / "other")
    (other / "config.toml").write_text(TOOLS_MODE)
    assert run(["tick", "--world", str(other), "--ticks", "2"]).exit_code == 0
    assert tree(other) == tree(demo_world)


def test_no_steps_when_max_tool_steps_is_zero(demo_world: Path) -> None:
    (demo_world / "config.toml").write_text(TOOLS_MODE + "max_tool_steps = 0\n")
    assert run(["tick", "--world", str(demo_world)]).exit_code == 0
    calls = called_tools(demo_world, 1)
    assert len(calls) == len(Storage(demo_world).load().characters)
    assert not {tools for _, tools in calls} & QUERY_NAMES


class Curious:
    """A model that only ever looks (a fake, recording what it was offered)."""

    name = "curious"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        self.requests.append(request)
        if request.schema is not None:  # the other phases
            instance = default_instance(request.schema)
            return AdapterResponse(instance, "r", Usage(10, 2), "curious")
        call = FunctionCall(name="look", arguments={"target": "lamp"}, call_id="c1")
        parsed = ToolCalls(calls=[call])
        return AdapterResponse(parsed, "r", Usage(10, 2), "curious", raw=parsed.dump())

    async def delete_response(self, response_id: str) -> None:
        return None


def test_steps_are_bounded_then_only_actions_are_offered(demo_world: Path) -> None:
    config = Config.model_validate(
        {
            "phase1": {"mode": "tools", "max_tool_steps": 2},
            "llm": {"max_failed_fraction": 1.0, "max_content_failed_fraction": 1.0},
        }
    )
    model = Curious()
    result = Runner(demo_world, config, adapter=model).run()[0]
    intentions = [r for r in model.requests if r.tools is not None]
    characters = len(Storage(demo_world).load().characters)
    assert len(intentions) == 3 * characters  # two query steps, then the last chance
    by_step = [intentions[i * characters : (i + 1) * characters] for i in range(3)]
    assert [len(b[0].tools or ()) for b in by_step] == [7, 7, 4]
    assert [len(b[0].messages) for b in by_step] == [0, 2, 4]  # each call and its answer
    answer = by_step[1][0].messages[1].function_response
    assert answer is not None and answer.name == "look" and answer.call_id == "c1"
    # still looking when only actions were offered: the fallback intention, reported
    report = next(r for r in result.reports if r.name == "intentions")
    assert report.calls == 3 * characters and report.failures == characters
    assert report.entities == characters
    assert all("unknown_tool" in e for e in report.errors.values())


class Stalling(Curious):
    """Looks, then times out when only actions are offered (an infrastructure failure)."""

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        if request.tools is not None and len(request.tools) == 4:  # the last chance
            self.requests.append(request)
            raise LLMTimeoutError("no answer in time")
        return await super().execute(request)


def test_the_failure_fraction_is_per_character(demo_world: Path) -> None:
    # every character ends on the fallback after 3 calls each: 1 in 3 calls failed, but
    # every character did, so the tick is not committed
    config = Config.model_validate({"phase1": {"mode": "tools", "max_tool_steps": 2}})
    with pytest.raises(RunFailed, match=r"intentions: (\d+) of \1 entities failed"):
        Runner(demo_world, config, adapter=Stalling()).run()
    assert Storage(demo_world).load().tick == 0


def test_a_model_that_never_acts_leaves_the_tick_uncommitted(demo_world: Path) -> None:
    # content failures (an undeclared tool) fall back per character, but not all of them:
    # past max_content_failed_fraction the endpoint is not answering in the expected form
    config = Config.model_validate({"phase1": {"mode": "tools", "max_tool_steps": 2}})
    before = tree(demo_world)
    with pytest.raises(RunFailed, match=r"10 of 10 entities came back unusable \(10 unknown_tool"):
        Runner(demo_world, config, adapter=Curious()).run()
    assert tree(demo_world) == before


def test_query_answers_come_from_the_world(demo_world: Path) -> None:
    world = Storage(demo_world).load()
    char = next(iter(world.characters.values()))
    loc = world.locations[char["state"]["location"]]
    here = [
        c for c, o in world.characters.items() if o["state"]["location"] == loc["identity"]["id"]
    ]
    if loc["state"]["objects"]:
        item = loc["state"]["objects"][0]
        assert look(world, char, here, item.upper()) == {
            "kind": "object",
            "name": item,
            "where": "here",
        }
    exit_id = loc["state"]["connections"][0]
    assert look(world, char, here, exit_id)["kind"] == "exit"
    missing = look(world, char, here, "unicorn")
    assert "nothing called" in missing["error"] and missing["exits"] == loc["state"]["connections"]
    memories = recall(char, "of")  # too short a word: no match, only the summary
    assert memories == {"summary": char["memory"]["summary"], "memories": []}
    inventory = answer_query(world, char, here, FunctionCall(name="inventory"))
    assert inventory == {"inventory": char["state"]["inventory"]}


def test_recall_matches_memory_words(demo_world: Path) -> None:
    world = Storage(demo_world).load()
    char = next(c for c in world.characters.values() if c["memory"]["cells"])
    cell = char["memory"]["cells"][-1]
    word = max(re.findall(r"\w+", cell["text"]), key=len)
    found = recall(char, word.upper())
    assert f"tick {cell['tick']}: {cell['text']}" in found["memories"]


def test_gemini_tools_mode_offers_query_tools(
    demo_world: Path, gemini_stub: GeminiStubServer
) -> None:
    (demo_world / "config.toml").write_text(TOOLS_MODE)
    result = run(
        [
            "tick",
            "--world",
            str(demo_world),
            "--provider",
            "gemini",
            "--base-url",
            gemini_stub.base_url,
        ],
        env={"GEMINI_API_KEY": "gemini-test", "GEMINI_MODEL": None},
    )
    assert result.exit_code == 0, result.output
    first = gemini_stub.log[0]
    names = [d["name"] for d in first["tools"][0]["functionDeclarations"]]
    assert (
        set(QUERY_NAMES) <= set(names)
        and first["toolConfig"]["functionCallingConfig"]["mode"] == "ANY"
    )


@pytest.mark.parametrize("steps", [1])
def test_logged_steps_carry_the_conversation(demo_world: Path, steps: int) -> None:
    (demo_world / "config.toml").write_text(TOOLS_MODE + f"max_tool_steps = {steps}\n")
    assert run(["tick", "--world", str(demo_world)]).exit_code == 0
    log = read_log(demo_world / ".sim" / "log" / "tick-000001.jsonl")
    records = [record_data(record) for record in log.records]
    calls = [r for r in records if str(r.get("request_id", "")).startswith("1:intentions:")]
    first = {r["request_id"]: r for r in calls if r["request_id"].endswith(":0")}
    second = {r["request_id"]: r for r in calls if r["request_id"].endswith(":1")}
    assert first and len(first) == len(second)
    for rid, record in second.items():
        # the second step answers a different question: its digest covers the conversation
        assert record["digest"] != first[rid[:-1] + "0"]["digest"]
        assert "conversation" in record["settings"]


def test_resume_does_not_pay_finished_steps_again(demo_world: Path, tmp_path: Path) -> None:
    (demo_world / "config.toml").write_text(TOOLS_MODE)
    reference = copy_demo(tmp_path / "reference")
    (reference / "config.toml").write_text(TOOLS_MODE)
    seed = Storage(demo_world).load().seed
    config = load_config(
        world_dir=demo_world, cwd=demo_world, overrides={"llm": {"max_concurrency": 1}}
    )
    whole = Counted(seed)
    Runner(reference, config, adapter=whole).run(1)
    characters = len(Storage(demo_world).load().characters)
    # die in the middle of the second round of steps: the first round and part of the
    # second were answered and logged
    crashing = Counted(seed, crash_at=characters + 3)
    with pytest.raises(BaseException):  # noqa: B017  (the crash, however it surfaces)
        Runner(demo_world, config, adapter=crashing).run(1)
    assert Storage(demo_world).load().tick == 0
    resumed = Counted(seed)
    Runner(demo_world, config, adapter=resumed).run(1)
    assert crashing.answered == characters + 2
    assert crashing.answered + resumed.answered == whole.answered  # nothing paid twice
    assert tree(demo_world) == tree(reference)


def test_recall_finds_the_long_term_store(demo_world: Path) -> None:
    """Retrieving, evicted cells live in ``memory.archive``: the recall tool finds them."""
    world = Storage(demo_world).load()
    char = next(iter(world.characters.values()))
    char["memory"]["archive"] = [{"tick": 1, "text": "The smuggler hid the key under the bell."}]
    found = recall(char, "smuggler")
    assert found["memories"] == ["tick 1: The smuggler hid the key under the bell."]
