"""The openai and chat adapters over real HTTP (the real SDK) against the stub server."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from pydantic import BaseModel, ConfigDict

from sim.llm.errors import (
    LLMAPIError,
    LLMBudgetExceededError,
    LLMChainNotFoundError,
    LLMConfigurationError,
    LLMContextLengthError,
    LLMError,
    LLMIncompleteError,
    LLMRateLimitError,
    LLMRefusalError,
    LLMSchemaError,
    LLMTimeoutError,
)
from sim.llm.types import CallSettings, Exchange, ModelRequest, Usage
from sim.phases.intention_tools import TOOLS
from sim.providers import create_adapter
from sim.providers.chat import ChatAdapter
from sim.providers.openai import OpenAIAdapter
from sim.testing.stub_server import StubServer

KEY = "sk-test-not-a-real-key"


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid", title="Note")

    text: str
    count: int


SETTINGS = CallSettings(model="stub-model", timeout_seconds=5)


def client(server: StubServer, timeout: float = 5.0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=timeout)


def adapters(server: StubServer, store: bool = False) -> list[Any]:
    return [OpenAIAdapter(client(server), store=store), ChatAdapter(client(server))]


@pytest.mark.parametrize("kind", ["openai", "chat"])
async def test_structured_answer_and_usage(stub_server: StubServer, kind: str) -> None:
    adapter = (
        OpenAIAdapter(client(stub_server)) if kind == "openai" else ChatAdapter(client(stub_server))
    )
    first = await adapter.execute(
        ModelRequest("Write a note.", "about fog", Note, settings=SETTINGS)
    )
    second = await adapter.execute(
        ModelRequest("Write a note.", "about tides", Note, settings=SETTINGS)
    )

    assert isinstance(first.parsed, Note)
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    # the instructions prefix is "cached" the second time, and reported as such
    assert first.usage.cached_input_tokens == 0
    assert second.usage.cached_input_tokens > 0
    assert first.provider == kind and first.served_from == "live"
    assert stub_server.stats.input_tokens == first.usage.input_tokens + second.usage.input_tokens


async def test_window_is_sent_as_input_items_and_not_stored(stub_server: StubServer) -> None:
    adapter = OpenAIAdapter(client(stub_server))  # window mode: store=False
    history = (Exchange("r1", "in one", '{"text":"a","count":1}'),)
    response = await adapter.execute(
        ModelRequest("Write.", "in two", Note, settings=SETTINGS, history=history)
    )
    body = stub_server.log[-1]
    assert body["store"] is False
    assert body["input"] == [
        {"role": "user", "content": "in one"},
        {"role": "assistant", "content": '{"text":"a","count":1}'},
        {"role": "user", "content": "in two"},
    ]
    assert body["instructions"] == "Write."
    assert body["text"]["format"]["strict"] is True
    assert response.response_id not in stub_server.responses
    await adapter.delete_response(response.response_id)  # nothing stored: a no-op
    assert stub_server.stats.by_route.get("DELETE /v1/responses", 0) == 0


async def test_server_mode_chains_and_deletes(stub_server: StubServer) -> None:
    adapter = OpenAIAdapter(client(stub_server), store=True)
    first = await adapter.execute(ModelRequest("Write.", "one", Note, settings=SETTINGS))
    second = await adapter.execute(
        ModelRequest(
            "Write.", "two", Note, previous_response_id=first.response_id, settings=SETTINGS
        )
    )
    assert stub_server.log[-1]["previous_response_id"] == first.response_id
    # the model saw the whole chain: more input than the first call
    assert second.usage.input_tokens > first.usage.input_tokens
    await adapter.delete_response(first.response_id)
    with pytest.raises(openai.NotFoundError):
        await adapter.connections.client(0).responses.retrieve(first.response_id)
    with pytest.raises(LLMChainNotFoundError):
        await adapter.execute(
            ModelRequest(
                "Write.", "three", Note, previous_response_id=first.response_id, settings=SETTINGS
            )
        )
    await adapter.delete_response(first.response_id)  # already gone: fine
    # an answer that fails our checks is not left stored at the provider
    stub_server.enqueue("malformed")
    stored = len(stub_server.responses)
    with pytest.raises(LLMSchemaError):
        await adapter.execute(ModelRequest("Write.", "four", Note, settings=SETTINGS))
    assert len(stub_server.responses) == stored


async def test_chat_window_is_sent_as_messages(stub_server: StubServer) -> None:
    adapter = ChatAdapter(client(stub_server))
    history = (Exchange("r1", "in one", "out one"),)
    await adapter.execute(
        ModelRequest("Write.", "in two", Note, settings=SETTINGS, history=history)
    )
    body = stub_server.log[-1]
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["name"] == "Note"


FAULT_ERRORS: list[tuple[str, type[LLMError], str]] = [
    ("rate_limit", LLMRateLimitError, "rate_limit"),
    ("server_error", LLMAPIError, "server_error"),
    ("malformed", LLMSchemaError, "schema_error"),
    ("refusal", LLMRefusalError, "refusal"),
    ("incomplete", LLMIncompleteError, "incomplete"),
    ("insufficient_quota", LLMBudgetExceededError, "insufficient_quota"),
    ("auth", LLMConfigurationError, "configuration_error"),
    ("context_length", LLMContextLengthError, "context_length"),
]


@pytest.mark.parametrize("kind", ["openai", "chat"])
async def test_a_raw_line_break_inside_a_string_is_read_as_meant(
    stub_server: StubServer, kind: str
) -> None:
    """A small model's answer with a line break written as itself inside a JSON string
    (invalid JSON) is read with it escaped; the log keeps the answer as it came."""
    adapter = adapters(stub_server)[0 if kind == "openai" else 1]
    stub_server.enqueue("raw_newline")
    response = await adapter.execute(ModelRequest("Write.", "x", Note, settings=SETTINGS))
    assert isinstance(response.parsed, Note)
    assert "\n" in response.parsed.text
    assert "\n" in response.raw and response.raw != response.parsed.model_dump_json()


@pytest.mark.parametrize(("fault", "error", "code"), FAULT_ERRORS)
@pytest.mark.parametrize("kind", ["openai", "chat"])
async def test_faults_map_to_llm_errors(
    stub_server: StubServer, kind: str, fault: str, error: type[LLMError], code: str
) -> None:
    adapter = adapters(stub_server)[0 if kind == "openai" else 1]
    stub_server.enqueue(fault)
    with pytest.raises(error) as info:
        await adapter.execute(ModelRequest("Write.", "x", Note, settings=SETTINGS))
    assert info.value.code == code
    assert isinstance(info.value.cause, Exception) or fault in (
        "malformed",
        "refusal",
        "incomplete",
    )
    if fault == "rate_limit":
        assert info.value.retry_after == pytest.approx(stub_server.options.retry_after)
    if fault == "auth":
        assert "OPENAI_API_KEY" in str(info.value)
        assert KEY not in str(info.value)
    if fault in ("malformed", "refusal", "incomplete"):  # the attempt was paid for
        usage = info.value.usage
        assert isinstance(usage, Usage) and usage.input_tokens > 0


@pytest.mark.parametrize("kind", ["openai", "chat"])
async def test_hang_past_the_timeout_is_a_timeout(stub_server: StubServer, kind: str) -> None:
    settings = CallSettings(model="stub-model", timeout_seconds=0.3)
    adapter = (OpenAIAdapter if kind == "openai" else ChatAdapter)(client(stub_server))
    stub_server.enqueue("hang")
    with pytest.raises(LLMTimeoutError):
        await adapter.execute(ModelRequest("Write.", "x", Note, settings=settings))


async def test_connection_refused_is_a_transient_api_error() -> None:
    dead = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key=KEY, max_retries=0)
    with pytest.raises(LLMAPIError) as info:
        await OpenAIAdapter(dead).execute(ModelRequest("Write.", "x", Note, settings=SETTINGS))
    assert info.value.code == "connection_error" and info.value.status_code is None


def test_missing_key_names_the_variable_never_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIM_TEST_KEY", raising=False)
    with pytest.raises(LLMConfigurationError) as info:
        create_adapter("openai", api_key_env="SIM_TEST_KEY")
    assert "SIM_TEST_KEY" in str(info.value)
    monkeypatch.setenv("SIM_TEST_KEY", "secret-value")
    adapter = create_adapter("openai", api_key_env="SIM_TEST_KEY")
    route = adapter.connections.routes[0]  # type: ignore[attr-defined]
    assert route is not None and route.connect_timeout is not None  # aiohttp, no SDK
    assert "secret-value" not in repr(vars(adapter))


@pytest.mark.parametrize("kind", ["openai", "chat"])
async def test_tool_calls(stub_server: StubServer, kind: str) -> None:
    adapter = adapters(stub_server)[0 if kind == "openai" else 1]
    data = (
        '{"tick":1,"character":{"id":"ada","name":"Ada","mood":"restless"},'
        '"location":{"id":"quay","objects":["net"]},'
        '"exits":[{"id":"market","name":"Market"}],"present":[]}'
    )
    response = await adapter.execute(ModelRequest("Decide.", data, tools=TOOLS, settings=SETTINGS))
    calls = response.parsed.calls  # type: ignore[attr-defined]
    assert len(calls) == 1 and calls[0].name in {t.name for t in TOOLS}
    assert isinstance(calls[0].arguments, dict)
    body = stub_server.log[-1]
    assert body["tool_choice"] == "required"
    assert len(body["tools"]) == 4
