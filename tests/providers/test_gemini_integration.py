"""The gemini adapter against the real Gemini API: runs only when ``GEMINI_API_KEY`` is set
(skipped otherwise). ``GEMINI_MODEL`` picks the model (default ``gemini-2.5-flash-lite``)."""

from __future__ import annotations

import os

import pytest
from pydantic import BaseModel, ConfigDict

from sim.llm.tools import ToolCalls
from sim.llm.types import CallSettings, Exchange, ModelRequest
from sim.phases.intention_tools import TOOLS
from sim.providers.gemini import GeminiAdapter

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get("GEMINI_API_KEY"), reason="GEMINI_API_KEY not set"),
]


class Reply(BaseModel):
    model_config = ConfigDict(extra="forbid", title="Reply")

    name: str
    answer: str


def settings() -> CallSettings:
    model = os.environ.get("GEMINI_MODEL") or "gemini-2.5-flash-lite"
    return CallSettings(model=model, temperature=0.0, max_output_tokens=400, timeout_seconds=60)


async def test_structured_answer_sees_the_window() -> None:
    adapter = GeminiAdapter()
    history = (Exchange("", "My name is Zanzibar.", '{"name":"Zanzibar","answer":"Hello."}'),)
    response = await adapter.execute(
        ModelRequest(
            "You are a terse assistant. Answer in the requested JSON.",
            "What is my name? Put it in name.",
            Reply,
            history=history,
            settings=settings(),
        )
    )
    assert isinstance(response.parsed, Reply)
    assert "zanzibar" in response.parsed.name.lower()
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    await adapter.aclose()


async def test_tool_call() -> None:
    adapter = GeminiAdapter()
    data = (
        '{"tick":1,"character":{"id":"ada","name":"Ada","mood":"restless"},'
        '"location":{"id":"quay","objects":["net"]},'
        '"exits":[{"id":"market","name":"Market"}],"present":[]}'
    )
    response = await adapter.execute(
        ModelRequest("Decide what Ada does now.", data, tools=TOOLS, settings=settings())
    )
    assert isinstance(response.parsed, ToolCalls)
    assert response.parsed.calls and response.parsed.calls[0].name in {t.name for t in TOOLS}
    await adapter.aclose()
