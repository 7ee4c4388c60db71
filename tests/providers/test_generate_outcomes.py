"""Spec 004's ``generate`` outcomes beyond a plain answer: ``finish_reason`` ``max_tokens``
(cut at the token cap) and ``error`` (malformed after recovery), and ``ToolNotFoundError``
(a call of a tool not offered is ignored and the conversation goes on)."""

from __future__ import annotations

import openai
import pytest

from sim.llm.errors import (
    LLMIncompleteError,
    LLMRateLimitError,
    LLMSchemaError,
    ToolNotFoundError,
)
from sim.llm.recovery import RecoveryAdapter, RetryPolicy
from sim.llm.tools import FunctionCall, LLMMessage, ToolCalls, generate
from sim.llm.types import CallSettings, Usage
from sim.phases.intention_tools import TOOLS
from sim.providers.chat import ChatAdapter
from sim.testing import MockAdapter
from sim.testing.stub_server import StubServer

SETTINGS = CallSettings(model="stub-model", timeout_seconds=5)
ASK = [LLMMessage(role="user", content='{"tick": 1, "character": {"id": "ada"}}')]


def chat(server: StubServer) -> ChatAdapter:
    return ChatAdapter(
        openai.AsyncOpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
    )


async def test_an_unknown_tool_call_is_ignored_and_named(stub_server: StubServer) -> None:
    stub_server.enqueue("unknown_tool")  # the model calls "teleport", never offered
    answer = await generate(chat(stub_server), ASK, TOOLS, settings=SETTINGS)
    assert answer.function_calls is None and answer.finish_reason == "stop"
    (ignored,) = answer.ignored
    assert isinstance(ignored, ToolNotFoundError) and ignored.tool == "teleport"
    assert ignored.code == "tool_not_found" and "teleport" in str(ignored)
    # the conversation goes on: the next turn is answered as usual
    after = await generate(chat(stub_server), ASK, TOOLS, settings=SETTINGS)
    assert after.finish_reason == "tool_calls" and after.function_calls and not after.ignored


async def test_known_calls_are_kept_beside_an_unknown_one() -> None:
    adapter = MockAdapter()
    known = FunctionCall(name=TOOLS[0].name, arguments={}, call_id="a")
    adapter.enqueue(ToolCalls(calls=[FunctionCall(name="fly", call_id="b"), known]))
    answer = await generate(adapter, ASK, TOOLS)
    assert answer.function_calls == [known] and answer.finish_reason == "tool_calls"
    assert [e.tool for e in answer.ignored] == ["fly"]
    assert answer.ignored[0].context == {"arguments": {}, "call_id": "b"}


async def test_an_answer_cut_at_the_token_cap_is_max_tokens(stub_server: StubServer) -> None:
    stub_server.enqueue("incomplete")  # chat: finish_reason "length"
    answer = await generate(chat(stub_server), ASK, TOOLS, settings=SETTINGS)
    assert answer.finish_reason == "max_tokens"
    assert answer.function_calls is None and answer.response is None
    assert answer.error and answer.usage is not None and answer.usage.output_tokens > 0


async def test_an_answer_stopped_for_another_reason_is_still_raised() -> None:
    adapter = MockAdapter()
    adapter.enqueue(LLMIncompleteError("filtered", reason="content_filter"))
    with pytest.raises(LLMIncompleteError):
        await generate(adapter, ASK, TOOLS)


async def test_a_malformed_answer_after_its_retries_is_error() -> None:
    adapter = MockAdapter()
    bad = [LLMSchemaError(f"bad JSON {n}", usage=Usage(10, 5)) for n in range(3)]
    adapter.enqueue(*bad)
    stack = RecoveryAdapter(adapter, RetryPolicy(schema_retries=2))
    answer = await generate(stack, ASK, TOOLS)
    assert answer.finish_reason == "error" and answer.error == "bad JSON 2"
    assert answer.usage == Usage(30, 15)  # every attempt was paid for
    assert adapter.call_count == 3


async def test_other_failures_are_raised_as_the_spec_says() -> None:
    adapter = MockAdapter()
    adapter.enqueue(LLMRateLimitError("slow down"))
    with pytest.raises(LLMRateLimitError):
        await generate(adapter, ASK, TOOLS)
