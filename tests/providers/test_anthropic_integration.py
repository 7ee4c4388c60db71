"""The anthropic adapter against the real Messages API: run only with ``ANTHROPIC_API_KEY``
set (skipped otherwise, as in CI). ``SIM_TEST_ANTHROPIC_MODEL`` picks the model (default
``claude-haiku-4-5``). Each test makes one or two small calls."""

from __future__ import annotations

import os

import pytest
from pydantic import BaseModel, ConfigDict

from sim.llm.errors import LLMConfigurationError
from sim.llm.tools import ToolCalls
from sim.llm.types import CallSettings, Exchange, ModelRequest
from sim.phases.intention_tools import TOOLS
from sim.providers.anthropic import AnthropicAdapter

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get("ANTHROPIC_API_KEY"), reason="ANTHROPIC_API_KEY not set"),
]

MODEL = os.environ.get("SIM_TEST_ANTHROPIC_MODEL", "claude-haiku-4-5")
SETTINGS = CallSettings(model=MODEL, max_output_tokens=300, timeout_seconds=60)


class Reply(BaseModel):
    model_config = ConfigDict(extra="forbid", title="Reply")

    name: str
    answer: str


async def test_structured_answer_through_the_forced_tool() -> None:
    adapter = AnthropicAdapter()
    try:
        response = await adapter.execute(
            ModelRequest(
                "You are a terse assistant. Answer with the tool.",
                "Your name is Bob. What is 2 + 2?",
                Reply,
                settings=SETTINGS,
            )
        )
    finally:
        await adapter.aclose()
    assert isinstance(response.parsed, Reply)
    assert "4" in response.parsed.answer
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert response.response_id.startswith("msg_")


async def test_window_turns_are_seen() -> None:
    adapter = AnthropicAdapter()
    history = (Exchange("msg_x", "My name is Zed.", '{"name":"Bob","answer":"Noted, Zed."}'),)
    try:
        response = await adapter.execute(
            ModelRequest(
                "You are a terse assistant. Answer with the tool.",
                "What is my name?",
                Reply,
                history=history,
                settings=SETTINGS,
            )
        )
    finally:
        await adapter.aclose()
    assert isinstance(response.parsed, Reply)
    assert "Zed" in response.parsed.answer


async def test_tool_call() -> None:
    adapter = AnthropicAdapter()
    data = (
        '{"tick":1,"character":{"id":"ada","name":"Ada","mood":"restless"},'
        '"location":{"id":"quay","objects":["net"]},'
        '"exits":[{"id":"market","name":"Market"}],"present":[]}'
    )
    try:
        response = await adapter.execute(
            ModelRequest("Decide what Ada does next.", data, tools=TOOLS, settings=SETTINGS)
        )
    finally:
        await adapter.aclose()
    assert isinstance(response.parsed, ToolCalls)
    assert response.parsed.calls and response.parsed.calls[0].name in {t.name for t in TOOLS}


async def test_unknown_model_is_a_configuration_error() -> None:
    adapter = AnthropicAdapter()
    settings = CallSettings(model="claude-no-such-model", max_output_tokens=10)
    try:
        with pytest.raises(LLMConfigurationError):
            await adapter.execute(ModelRequest("x", "y", Reply, settings=settings))
    finally:
        await adapter.aclose()
