"""Declared phases that name tools from the registry (``[phases.<name>] tools``): query
steps the engine answers, then the answer as a call of ``answer``; each step logged,
replayed, and not paid again on resume; unknown tools are config errors naming both."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result
from conftest import HARVEST, Counted, tree

from sim.cli import main
from sim.config import load_config
from sim.engine.runner import Runner
from sim.llm.tools import FunctionCall, ToolCalls
from sim.llm.types import AdapterResponse, ModelRequest, Usage
from sim.phases.intentions import Intention
from sim.phases.tool_registry import REGISTRY
from sim.storage import Storage
from sim.testing import default_instance
from sim.testing.stub_server import StubServer
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

VOTE_TOOLS = 'tools = ["look", "recall", "inventory"]\nmax_tool_steps = 2\n'


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def harvest(dest: Path, extra: str = VOTE_TOOLS, section: str = "[phases.vote]\n") -> Path:
    """A copy of worlds/harvest-vote whose vote phase gets ``extra`` settings."""
    shutil.copytree(HARVEST, dest, ignore=shutil.ignore_patterns(".sim"))
    config = dest / "config.toml"
    text = config.read_text()
    assert section in text
    config.write_text(text.replace(section, section + extra, 1))
    return dest


def vote_calls(world: Path, tick: int) -> list[tuple[str, str]]:
    """(request id, tools called) of each vote call of a tick, from ``sim log --calls``."""
    out = run("log", "--world", str(world), "--tick", str(tick), "--calls").output
    return [
        (m.group(1), m.group(2))
        for m in re.finditer(r"^(\d+:vote:\S+)\s.*tools: (.+)$", out, re.MULTILINE)
    ]


def test_a_declared_phase_looks_then_answers_and_replays(tmp_path: Path) -> None:
    world = harvest(tmp_path / "hv")
    result = run("tick", "--world", str(world), "--ticks", "2")
    assert result.exit_code == 0, result.output
    characters = Storage(world).load().characters
    calls = vote_calls(world, 1)
    firsts = {rid.rsplit(":", 2)[1]: tools for rid, tools in calls if rid.endswith(":0")}
    assert set(firsts) == set(characters)
    # the offline model takes a query step first where it can; every subject ends answering
    assert {"look", "recall", "inventory"} & set(firsts.values())
    last: dict[str, str] = {}
    for rid, tools in calls:
        last[rid.rsplit(":", 2)[1]] = tools
    assert set(last.values()) == {"answer"}
    assert len(calls) > len(characters)  # some steps before answering
    assert all(int(rid.rsplit(":", 1)[1]) <= 2 for rid, _ in calls)  # max_tool_steps = 2
    # the steps carry the conversation: a later step holds the engine's answer to a query
    log = read_log(log_path(world, 1))
    later = [c for c in log.calls.values() if c.phase == "vote" and c.n > 0]
    assert later and all("conversation" in c.settings for c in later)
    # the answers are the phase's results and its writes happened
    results = log.phase_results("vote")
    assert set(results) == set(characters)
    for cid, answer in results.items():
        assert answer["stance"] in ("sell", "keep", "undecided")
        assert Storage(world).load().characters[cid]["state"]["stance"] in (
            "sell",
            "keep",
            "undecided",
        )
    report = log.phases["vote"].report
    assert report.calls == len(calls) and report.failures == 0
    replay = run("replay", "--world", str(world), "--tick", "1", "--to", "2")
    assert replay.exit_code == 0, replay.output
    assert "tick 1: identical" in replay.output and "tick 2: identical" in replay.output
    # deterministic: the same world runs to the same files
    other = harvest(tmp_path / "other")
    assert run("tick", "--world", str(other), "--ticks", "2").exit_code == 0
    assert tree(other) == tree(world)


def test_without_tools_a_declared_phase_is_one_call_each(tmp_path: Path) -> None:
    world = harvest(tmp_path / "hv", extra="")
    assert run("tick", "--world", str(world)).exit_code == 0
    calls = [c for c in read_log(log_path(world, 1)).calls.values() if c.phase == "vote"]
    assert len(calls) == len(Storage(world).load().characters)
    assert all(c.schema_name != "ToolCalls" for c in calls)


@pytest.mark.parametrize(
    ("extra", "section", "expected"),
    [
        ('tools = ["peek"]\n', "[phases.vote]\n", "phase 'vote' names unknown tool 'peek'"),
        ('tools = ["say"]\n', "[phases.vote]\n", "phase 'vote' names action tool 'say'"),
        ('tools = ["look", "look"]\n', "[phases.vote]\n", "names tool 'look' twice"),
        ('tools = "look"\n', "[phases.vote]\n", "phases.vote.tools"),
    ],
)
def test_a_bad_tool_is_a_config_error_naming_phase_and_tool(
    tmp_path: Path, extra: str, section: str, expected: str
) -> None:
    world = harvest(tmp_path / "hv", extra=extra, section=section)
    before = tree(world, logs=True)
    for command in ("check", "tick"):
        result = run(command, "--world", str(world))
        assert result.exit_code == 2, result.output
        assert expected in result.output
        assert "Traceback" not in result.output
    assert tree(world, logs=True) == before
    assert "peek" not in REGISTRY


def test_a_tool_must_fit_the_phase_subjects(tmp_path: Path) -> None:
    world = harvest(tmp_path / "hv")
    config = world / "config.toml"
    config.write_text(config.read_text().replace('per = "character"', 'per = "location"'))
    config.write_text(config.read_text().replace('writes = { "state.stance" = "stance" }\n', ""))
    result = run("check", "--world", str(world))
    assert result.exit_code == 2
    assert "phase 'vote' (per = 'location') names tool 'recall'" in result.output
    assert "it may name: look" in result.output


class Looking:
    """A model that looks at 'well' until only ``answer`` is offered (a fake)."""

    name = "looking"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        if request.schema is not None:
            # an intention must name what is there: the idle one names nothing
            parsed = (
                Intention.fallback()
                if issubclass(request.schema, Intention)
                else default_instance(request.schema)
            )
            return AdapterResponse(parsed, "r", Usage(5, 1), "fake")
        self.requests.append(request)
        names = [t.name for t in request.tools or ()]
        if names != ["answer"]:
            call = FunctionCall(name="look", arguments={"target": "well"}, call_id="c")
        else:
            call = FunctionCall(
                name="answer",
                arguments={"stance": "keep", "confidence": 0.5, "reason": "I looked."},
                call_id="d",
            )
        parsed = ToolCalls(calls=[call])
        return AdapterResponse(parsed, "r", Usage(5, 1), "fake", raw=parsed.dump())

    async def delete_response(self, response_id: str) -> None:
        return None


def test_steps_are_bounded_and_answered_from_the_world(tmp_path: Path) -> None:
    world = harvest(tmp_path / "hv")
    config = load_config(world_dir=world, cwd=world)
    model = Looking()
    Runner(world, config, adapter=model).run(1)
    characters = Storage(world).load().characters
    assert len(model.requests) == 3 * len(characters)  # two query steps, then the answer
    first, last = model.requests[0], model.requests[-1]
    assert [t.name for t in first.tools or ()] == ["answer", "look", "recall", "inventory"]
    assert [t.name for t in last.tools or ()] == ["answer"]
    answer_tool = (first.tools or ())[0]
    assert answer_tool.parameters["properties"]["stance"]["enum"] == ["sell", "keep", "undecided"]
    # the engine answered each look from the world as it is now
    reply = model.requests[len(characters)].messages[1].function_response
    assert reply is not None and reply.name == "look"
    assert "error" in reply.response or reply.response.get("kind") in ("object", "person", "exit")
    for char in characters.values():
        assert char["state"]["stance"] == "keep"


def test_resume_does_not_pay_finished_vote_steps_again(tmp_path: Path) -> None:
    world = harvest(tmp_path / "hv")
    reference = harvest(tmp_path / "reference")
    seed = Storage(world).load().seed
    config = load_config(world_dir=world, cwd=world, overrides={"llm": {"max_concurrency": 1}})
    whole = Counted(seed)
    Runner(reference, config, adapter=whole).run(1)
    log = read_log(log_path(reference, 1))
    before_vote = sum(1 for c in log.calls.values() if c.phase in ("intentions", "resolution"))
    before_vote += sum(1 for c in log.calls.values() if c.phase == "narrative")
    # die inside the vote phase's second round of steps
    characters = len(Storage(world).load().characters)
    crashing = Counted(seed, crash_at=before_vote + characters + 2)
    with pytest.raises(BaseException):  # noqa: B017  (the crash, however it surfaces)
        Runner(world, config, adapter=crashing).run(1)
    assert Storage(world).load().tick == 0
    partial = read_log(log_path(world, 1))
    assert sum(1 for c in partial.calls.values() if c.phase == "vote") == characters + 1
    resumed = Counted(seed)
    Runner(world, config, adapter=resumed).run(1)
    assert crashing.answered + resumed.answered == whole.answered  # nothing paid twice
    assert tree(world) == tree(reference)
    assert orjson.loads((world / "world.json").read_bytes())["tick"] == 1


@pytest.mark.parametrize("provider", ["openai", "chat"])
def test_declared_tools_over_http(tmp_path: Path, stub_server: StubServer, provider: str) -> None:
    """The same steps through the real openai SDK against the loopback stub."""
    world = harvest(tmp_path / "hv")
    result = CliRunner().invoke(
        main,
        ["tick", "--world", str(world), "--provider", provider, "--base-url", stub_server.base_url],
        env={"OPENAI_API_KEY": "sk-test"},
    )
    assert result.exit_code == 0, result.output
    calls = vote_calls(world, 1)
    assert calls and {tools for _, tools in calls} <= {"look", "recall", "inventory", "answer"}
    log = read_log(log_path(world, 1))
    report = log.phases["vote"].report
    assert report.calls == len(calls) and report.failures == 0
    # every character answered through the answer tool, and its write happened
    characters = Storage(world).load().characters
    assert set(log.phase_results("vote")) == set(characters)
    assert all(c["state"]["stance"] in ("sell", "keep", "undecided") for c in characters.values())
    assert any(tools != "answer" for _, tools in calls)  # and some looked first
    replay = run("replay", "--world", str(world), "--tick", "1")
    assert replay.exit_code == 0, replay.output
