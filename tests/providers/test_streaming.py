"""Streamed calls over loopback HTTP: the same answer and usage as a plain call, the
first-token, idle and total clocks, text passed on as it arrives."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from pydantic import BaseModel, ConfigDict

from sim.llm.errors import LLMIncompleteError, LLMRefusalError, LLMTimeoutError
from sim.llm.streaming import CallText, StreamDelta, StreamHub
from sim.llm.tools import ToolCalls, ToolDeclaration
from sim.llm.types import CallSettings, ModelRequest
from sim.providers._streaming import ChatAssembler, ResponsesAssembler
from sim.providers.chat import ChatAdapter
from sim.providers.openai import OpenAIAdapter
from sim.testing.stub_server import StubServer


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid", title="Note")

    text: str
    count: int


def adapter(server: StubServer, kind: str) -> Any:
    sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=10)
    return OpenAIAdapter(sdk) if kind == "openai" else ChatAdapter(sdk)


def settings(**kw: Any) -> CallSettings:
    return CallSettings(**{"model": "m", "timeout_seconds": 10, **kw})


async def note(target: Any, stream_to: CallText | None = None, **kw: Any) -> Any:
    return await target.execute(
        ModelRequest(
            "Write a note.", "about fog", Note, settings=settings(**kw), stream_to=stream_to
        )
    )


@pytest.mark.parametrize("kind", ["chat", "openai"])
async def test_streamed_answer_equals_the_plain_one(stub_server: StubServer, kind: str) -> None:
    plain = await note(adapter(stub_server, kind))
    stub_server.reset()
    streamed = await note(adapter(stub_server, kind), stream=True)
    body = stub_server.log[-1]
    assert body["stream"] is True
    if kind == "chat":
        assert body["stream_options"] == {"include_usage": True}
    assert streamed.parsed == plain.parsed and streamed.raw == plain.raw
    # (the stub caches the repeated prompt prefix, so only cached tokens may differ)
    assert streamed.usage.input_tokens == plain.usage.input_tokens
    assert streamed.usage.output_tokens == plain.usage.output_tokens > 0


@pytest.mark.parametrize("kind", ["chat", "openai"])
async def test_streamed_tool_calls_are_assembled(stub_server: StubServer, kind: str) -> None:
    params = Note.model_json_schema()
    tools = (
        ToolDeclaration(name="say", description="Say something", parameters=params),
        ToolDeclaration(name="wait", description="Wait", parameters=params),
    )
    results = []
    for stream in (False, True):
        target = adapter(stub_server, kind)
        results.append(
            await target.execute(
                ModelRequest("Pick one.", "fog", tools=tools, settings=settings(stream=stream))
            )
        )
        stub_server.reset()
    plain, streamed = results
    assert isinstance(streamed.parsed, ToolCalls) and streamed.parsed.calls
    assert streamed.parsed.calls[0].name == plain.parsed.calls[0].name
    assert streamed.parsed.calls[0].arguments == plain.parsed.calls[0].arguments


@pytest.mark.parametrize(
    ("fault", "error"), [("refusal", LLMRefusalError), ("incomplete", LLMIncompleteError)]
)
@pytest.mark.parametrize("kind", ["chat", "openai"])
async def test_streamed_refusals_and_cuts_are_reported_as_before(
    stub_server: StubServer, kind: str, fault: str, error: type[Exception]
) -> None:
    stub_server.enqueue(fault)
    with pytest.raises(error):
        await note(adapter(stub_server, kind), stream=True)


async def test_text_goes_to_the_hub_as_it_arrives(stub_server: StubServer) -> None:
    stub_server.options.stream_chunk_delay = 0.01
    seen: list[StreamDelta] = []
    hub = StreamHub(seen.append)
    with hub.call("narrative", "narrative:quay") as text:
        response = await note(adapter(stub_server, "chat"), stream=True, stream_to=text)
    assert len(seen) > 2  # several pieces, not one block
    assert all(d.phase == "narrative" and d.entity_key == "narrative:quay" for d in seen)
    assert "".join(d.text for d in seen) == response.raw
    assert hub.in_flight() == []  # a finished call leaves the hub


async def test_missing_stream_usage_is_zero_not_an_error(stub_server: StubServer) -> None:
    stub_server.options.stream_usage = False  # as llama-cpp-python 0.3
    response = await note(adapter(stub_server, "chat"), stream=True)
    assert isinstance(response.parsed, Note) and response.usage.total_tokens == 0


@pytest.mark.parametrize("kind", ["chat", "openai"])
async def test_first_token_timeout(stub_server: StubServer, kind: str) -> None:
    stub_server.options.latency = 1.0
    with pytest.raises(LLMTimeoutError) as info:
        await note(adapter(stub_server, kind), stream=True, first_token_timeout_seconds=0.3)
    assert info.value.code == "first_token_timeout"


@pytest.mark.parametrize("kind", ["chat", "openai"])
async def test_idle_timeout_keeps_the_partial_text(stub_server: StubServer, kind: str) -> None:
    stub_server.enqueue("stall")  # one event, then silence
    with pytest.raises(LLMTimeoutError) as info:
        await note(adapter(stub_server, kind), stream=True, idle_timeout_seconds=0.3)
    assert info.value.code == "idle_timeout"
    assert "no new token within 0.3s" in info.value.message


async def test_total_timeout_bounds_a_slow_but_live_stream(stub_server: StubServer) -> None:
    stub_server.options.stream_chunk_delay = 0.1  # never idle for long, but slow overall
    with pytest.raises(LLMTimeoutError) as info:
        await note(adapter(stub_server, "chat"), stream=True, timeout_seconds=0.5)
    assert info.value.code == "timeout"


async def test_a_long_queue_is_not_a_timeout_when_the_clocks_allow_it() -> None:
    """Time queued behind a busy single-slot server counts against the first-token clock
    only: with the default clocks, a call waiting its turn streams normally."""
    from sim.testing.stub_server import ServerThread, StubOptions

    with ServerThread(StubServer(StubOptions(slots=1, latency=0.5))) as server:
        target = adapter(server, "chat")
        results = await asyncio.gather(*(note(target, stream=True) for _ in range(4)))
    assert all(isinstance(r.parsed, Note) for r in results)
    assert server.peak_active == 1


def test_assemblers_rebuild_bodies_from_events() -> None:
    chat = ChatAssembler()
    for event in (
        {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": '{"a"'}}]},
        {"choices": [{"index": 0, "delta": {"content": ": 1}"}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    ):
        chat.feed(event)
    assert chat.complete  # the finish_reason came
    body = chat.result()
    assert body["id"] == "c1" and body["usage"]["completion_tokens"] == 2
    assert body["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": '{"a": 1}', "refusal": None},
        "finish_reason": "stop",
    }
    responses = ResponsesAssembler()
    assert responses.feed({"type": "response.output_text.delta", "delta": "ab"}) == "ab"
    assert not responses.complete  # a stream ending here was cut short (``stream_cut``)
    responses.feed({"type": "response.completed", "response": {"id": "r", "status": "completed"}})
    assert responses.complete
    assert responses.result() == {"id": "r", "status": "completed"}
    assert not ChatAssembler().complete
