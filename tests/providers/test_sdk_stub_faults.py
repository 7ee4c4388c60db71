"""The Anthropic and Gemini stubs perform every fault they list (issue 24, item 24), and
the anthropic adapter names an empty answer as malformed (item 15). The real SDKs, over
HTTP on loopback."""

from __future__ import annotations

from dataclasses import replace

import anthropic
import pytest
from pydantic import BaseModel, ConfigDict

from sim.llm.errors import LLMAPIError, LLMConfigurationError, LLMError, LLMTimeoutError
from sim.llm.recovery import classify
from sim.llm.types import CallSettings, ModelRequest
from sim.providers.anthropic import AnthropicAdapter
from sim.providers.gemini import GeminiAdapter
from sim.testing.anthropic_stub import ANTHROPIC_FAULTS, AnthropicStubServer
from sim.testing.gemini_stub import GEMINI_FAULTS, GeminiStubServer
from sim.testing.stub_model import ANSWER_FAULTS

KEY = "sk-test-not-a-real-key"


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid", title="Note")

    text: str
    count: int


def note(model: str) -> ModelRequest:
    return ModelRequest(
        "Write a note.", "about fog", Note, settings=CallSettings(model=model, timeout_seconds=5)
    )


def claude(server: AnthropicStubServer) -> AnthropicAdapter:
    client = anthropic.AsyncAnthropic(base_url=server.base_url, api_key=KEY, max_retries=0)
    return AnthropicAdapter(client)


def gemini(server: GeminiStubServer, monkeypatch: pytest.MonkeyPatch) -> GeminiAdapter:
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    return GeminiAdapter(base_url=server.base_url, timeout_seconds=5)


async def test_an_empty_anthropic_answer_is_a_named_malformed_answer(
    anthropic_stub: AnthropicStubServer,
) -> None:
    anthropic_stub.enqueue("empty")
    with pytest.raises(LLMAPIError) as info:
        await claude(anthropic_stub).execute(note("claude-haiku-4-5"))
    exc = info.value
    assert exc.code == "malformed_answer" and exc.status_code == 200
    assert "malformed answer from the Messages API" in str(exc)
    assert "AttributeError" not in repr(exc)
    assert classify(exc) == "fatal"  # not sent again as is: a fallback model's turn
    assert (await claude(anthropic_stub).execute(note("claude-haiku-4-5"))).parsed is not None


#: what each fault that is not about the answer's content ends in
HTTP_OUTCOMES: dict[str, tuple[type[LLMError], int | None]] = {
    "forbidden": (LLMConfigurationError, None),
    "model_not_found": (LLMConfigurationError, None),
    "bad_gateway": (LLMAPIError, 502),
}


@pytest.mark.parametrize("fault", sorted(HTTP_OUTCOMES))
async def test_the_anthropic_stub_performs_the_faults_it_lists(
    anthropic_stub: AnthropicStubServer, fault: str
) -> None:
    assert fault in ANTHROPIC_FAULTS
    anthropic_stub.enqueue(fault)
    error, status = HTTP_OUTCOMES[fault]
    with pytest.raises(error) as info:
        await claude(anthropic_stub).execute(note("claude-haiku-4-5"))
    if status is not None:
        assert getattr(info.value, "status_code", None) == status
    if fault == "model_not_found":
        assert "claude-haiku-4-5" in str(info.value)


@pytest.mark.parametrize("fault", sorted(HTTP_OUTCOMES))
async def test_the_gemini_stub_performs_the_faults_it_lists(
    gemini_stub: GeminiStubServer, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    assert fault in GEMINI_FAULTS
    gemini_stub.enqueue(fault)
    error, status = HTTP_OUTCOMES[fault]
    with pytest.raises(error) as info:
        await gemini(gemini_stub, monkeypatch).execute(note("gemini-2.5-flash"))
    if status is not None:
        assert getattr(info.value, "status_code", None) == status


async def test_a_stall_without_a_stream_is_a_hang(
    anthropic_stub: AnthropicStubServer,
    gemini_stub: GeminiStubServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    request = note("m")
    request = replace(request, settings=replace(request.settings, timeout_seconds=0.3))
    anthropic_stub.enqueue("stall")
    with pytest.raises(LLMTimeoutError):
        await claude(anthropic_stub).execute(request)
    gemini_stub.enqueue("stall")
    with pytest.raises(LLMTimeoutError):
        await gemini(gemini_stub, monkeypatch).execute(request)


def test_the_anthropic_stub_lists_no_fault_it_cannot_perform() -> None:
    # a tool's input is an object on the Messages API: no JSON text to break a line in
    assert "raw_newline" not in ANTHROPIC_FAULTS
    assert "raw_newline" in ANSWER_FAULTS and "raw_newline" in GEMINI_FAULTS
