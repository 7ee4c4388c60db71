"""``sim.testing.MockAdapter`` answers tool-calling requests as well as schema ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import copy_demo
from pydantic import BaseModel

from sim.config import load_config
from sim.engine.runner import Runner
from sim.llm.client import LLMClient, LLMRequest
from sim.llm.errors import LLMRateLimitError
from sim.llm.tools import FunctionCall, ToolCalls
from sim.phases.intention_tools import TOOLS
from sim.testing import MockAdapter, default_instance, default_tool_calls

PROMPT = "Say what you do."


async def test_a_tool_request_gets_a_call_of_the_first_tool_by_default() -> None:
    adapter = MockAdapter()
    client = LLMClient(adapter, [])
    (answer,) = await client.create_batch([LLMRequest(PROMPT, "{}", ToolCalls, tools=TOOLS)])
    assert isinstance(answer, ToolCalls) and answer == default_tool_calls(TOOLS)
    (call,) = answer.calls
    assert call.name == TOOLS[0].name
    assert set(call.arguments) == set(TOOLS[0].parameters.get("required", []))
    assert adapter.last_request is not None and adapter.last_request.tools == TOOLS


async def test_queued_tool_calls_and_failures_are_answered_in_order() -> None:
    adapter = MockAdapter()
    say = FunctionCall(name="say", arguments={"to": "bram", "words": "Hello"})
    adapter.enqueue(say, LLMRateLimitError("slow down"), ToolCalls(content="thinking"))
    client = LLMClient(adapter, [])
    asks = [LLMRequest(PROMPT, str(i), ToolCalls, tools=TOOLS) for i in range(3)]
    first, second, third = await client.create_batch(asks)
    assert first == ToolCalls(calls=[say])
    assert isinstance(second, LLMRateLimitError)
    assert third == ToolCalls(content="thinking")
    assert adapter.pending == 0


def test_a_tick_in_tool_mode_runs_on_the_mock(tmp_path: Path) -> None:
    """The intentions phase in tool mode: every character's call is a tool request the
    mock answers; the tick commits."""
    world = copy_demo(tmp_path / "w")
    (world / "config.toml").write_text('[phase1]\nmode = "tools"\n')

    def waits(schema: type[BaseModel], text: str) -> Any:
        # the mock's own default call (move_to "mock") names no exit: it would fall back
        if schema is ToolCalls:
            return ToolCalls(calls=[FunctionCall(name="wait", arguments={"reasoning": "mock"})])
        return default_instance(schema)

    adapter = MockAdapter(default=waits)
    config = load_config(world_dir=world, cwd=world)
    (result,) = Runner(world, config, adapter=adapter).run(1)
    tool_requests = [r for r in adapter.calls if r.tools is not None]
    assert len(tool_requests) == 10  # one per character
    assert result.reports[0].name == "intentions" and result.reports[0].failures == 0
