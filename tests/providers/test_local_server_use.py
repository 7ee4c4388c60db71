"""A local server used well (issue 25): the structured-output form settled once per
endpoint, for ``chat`` and ``openai`` alike. Over real HTTP with the real SDK against the
stub server told to behave like llama-cpp-python (or a Responses bridge in front of it)."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from pydantic import BaseModel, ConfigDict

from sim.llm.adapters.chat import ChatAdapter
from sim.llm.adapters.openai import OpenAIAdapter
from sim.llm.errors import LLMAPIError, LLMTimeoutError
from sim.llm.types import CallSettings, ModelRequest
from sim.testing.stub_server import StubServer


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid", title="Note")

    text: str
    count: int


def sdk(server: StubServer, timeout: float = 10.0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=server.base_url, api_key="x", max_retries=0, timeout=timeout
    )


async def call(adapter: Any, timeout: float = 10.0, **kw: Any) -> Any:
    settings = CallSettings(model="m", timeout_seconds=timeout, **kw)
    return await adapter.execute(
        ModelRequest("Write a note.", "about fog", Note, settings=settings)
    )


def chat_forms(server: StubServer) -> list[str]:
    return [body["response_format"]["type"] for body in server.log]


def responses_forms(server: StubServer) -> list[str]:
    return [body["text"]["format"]["type"] for body in server.log]


async def test_auto_sends_one_rejected_request_however_many_calls_start_at_once(
    stub_server: StubServer,
) -> None:
    stub_server.options.reject_json_schema = True
    stub_server.options.latency = 0.05  # the probe is still out when the others start
    adapter = ChatAdapter(sdk(stub_server))
    results = await asyncio.gather(*(call(adapter) for _ in range(10)))
    assert all(isinstance(r.parsed, Note) for r in results)
    sent = chat_forms(stub_server)
    assert sent.count("json_schema") == 1  # one probe refused, not ten
    assert sent.count("json_object") == 10
    assert sum(r.notice is not None for r in results) == 1
    assert adapter.forms.settled


async def test_a_server_that_takes_json_schema_settles_on_the_first_answer(
    stub_server: StubServer,
) -> None:
    adapter = ChatAdapter(sdk(stub_server))
    results = await asyncio.gather(*(call(adapter) for _ in range(5)))
    assert {r.structured_output for r in results} == {"json_schema"}
    assert chat_forms(stub_server) == ["json_schema"] * 5
    assert adapter.forms.switches == []


async def test_a_probe_that_times_out_settles_nothing_and_the_next_call_probes(
    stub_server: StubServer,
) -> None:
    stub_server.options.reject_json_schema = True
    stub_server.options.hang_seconds = 5.0
    adapter = ChatAdapter(sdk(stub_server, timeout=0.5))
    # the refused json_schema is answered before the fault script is read: the hang is
    # the json_object_schema request's
    stub_server.enqueue("hang")
    with pytest.raises(LLMTimeoutError):
        await call(adapter, timeout=0.5)
    assert not adapter.forms.settled
    response = await call(adapter, timeout=0.5)
    assert response.structured_output == "json_object_schema"
    assert adapter.forms.settled
    assert chat_forms(stub_server) == ["json_schema", "json_object", "json_object"]


async def test_openai_provider_falls_back_from_json_schema_once_behind_a_bridge(
    stub_server: StubServer,
) -> None:
    stub_server.options.reject_json_schema = True  # refuses text.format json_schema too
    stub_server.options.latency = 0.05
    adapter = OpenAIAdapter(sdk(stub_server))
    results = await asyncio.gather(*(call(adapter) for _ in range(10)))
    assert all(isinstance(r.parsed, Note) for r in results)
    sent = responses_forms(stub_server)
    assert sent.count("json_schema") == 1 and sent.count("json_object") == 10
    body = stub_server.log[-1]
    assert body["text"]["format"]["schema"]["required"] == ["text", "count"]
    notes = [r.notice for r in results if r.notice is not None]
    assert len(notes) == 1 and "rejected json_schema (HTTP 500 naming format)" in notes[0]


async def test_openai_provider_takes_the_tool_and_prompt_forms(stub_server: StubServer) -> None:
    adapter = OpenAIAdapter(sdk(stub_server))
    response = await call(adapter, structured_output="tool")
    assert isinstance(response.parsed, Note) and response.structured_output == "tool"
    body = stub_server.log[-1]
    assert "text" not in body
    assert body["tool_choice"] == {"type": "function", "name": "Note"}
    assert body["tools"][0]["parameters"]["required"] == ["text", "count"]
    # the stub reads no schema from prose: it answers in text, a schema error recovery
    # would feed back; what matters here is what was sent
    with pytest.raises(Exception) as info:
        await call(adapter, structured_output="prompt")
    assert getattr(info.value, "code", "") == "schema_error"
    body = stub_server.log[-1]
    assert "text" not in body and "tools" not in body
    assert '"required":["text","count"]' in body["instructions"]


async def test_openai_provider_with_a_fixed_form_is_not_switched(stub_server: StubServer) -> None:
    stub_server.options.reject_json_schema = True
    adapter = OpenAIAdapter(sdk(stub_server))
    with pytest.raises(LLMAPIError) as info:
        await call(adapter, structured_output="json_schema")
    assert getattr(info.value, "status_code", None) == 500
    response = await call(adapter, structured_output="json_object_schema")
    assert isinstance(response.parsed, Note)
    assert responses_forms(stub_server) == ["json_schema", "json_object"]
