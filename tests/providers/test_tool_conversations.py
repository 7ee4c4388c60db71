"""Spec 004's multi-turn tool calling on every provider: ``generate(messages, tools)`` with
function calls and function responses, ``tool_choice`` auto/required/none, and
``get_tool_declarations`` from a registry. HTTP providers run against the loopback stubs."""

from __future__ import annotations

import base64
from typing import Any

import openai
import pytest

from sim.llm.errors import LLMConfigurationError
from sim.llm.tools import (
    FunctionCall,
    FunctionResponse,
    LLMMessage,
    ToolRegistry,
    conversation_request,
    generate,
    with_call_ids,
)
from sim.llm.types import CallSettings, ModelRequest
from sim.offline.adapter import OfflineAdapter
from sim.phases.intention_tools import TOOLS
from sim.providers.anthropic import AnthropicAdapter
from sim.providers.chat import ChatAdapter
from sim.providers.gemini import GeminiAdapter
from sim.providers.openai import OpenAIAdapter
from sim.testing.anthropic_stub import AnthropicStubServer
from sim.testing.gemini_stub import GeminiStubServer
from sim.testing.stub_server import StubServer

SETTINGS = CallSettings(model="stub-model", timeout_seconds=5)
DATA = (
    '{"tick":1,"character":{"id":"ada","name":"Ada","mood":"restless"},'
    '"location":{"id":"quay","objects":["net"]},'
    '"exits":[{"id":"market","name":"Market"}],"present":[]}'
)
REGISTRY = ToolRegistry(TOOLS)
SIGNATURE = base64.b64encode(b"opaque-thought").decode()


def conversation() -> list[LLMMessage]:
    """The user asks; the model looked around (a call); the tool answered."""
    return [
        LLMMessage(role="user", content=DATA),
        LLMMessage(
            role="assistant",
            function_call=FunctionCall(
                name="act", arguments={"object": "net", "action": "look"}, signature=SIGNATURE
            ),
        ),
        LLMMessage(
            role="function",
            function_response=FunctionResponse(name="act", response={"seen": "a torn net"}),
        ),
    ]


def test_registry_picks_declarations_in_order() -> None:
    assert [t.name for t in REGISTRY.get_tool_declarations(["wait", "say"])] == ["wait", "say"]
    assert "move_to" in REGISTRY and REGISTRY.names == tuple(t.name for t in TOOLS)
    with pytest.raises(LLMConfigurationError, match=r"unknown tool 'fly'.*move_to"):
        REGISTRY.get_tool_declarations(["fly"])
    with pytest.raises(ValueError, match="two tools"):
        ToolRegistry([*TOOLS, TOOLS[0]])


def test_call_ids_pair_calls_with_their_answers() -> None:
    messages = with_call_ids(
        [
            LLMMessage(role="assistant", function_call=FunctionCall(name="a")),
            LLMMessage(role="assistant", function_call=FunctionCall(name="b", call_id="x")),
            LLMMessage(role="function", function_response=FunctionResponse(name="b")),
            LLMMessage(role="function", function_response=FunctionResponse(name="a")),
        ]
    )
    assert [m.function_call.call_id for m in messages[:2]] == ["call_0", "x"]  # type: ignore[union-attr]
    assert [m.function_response.call_id for m in messages[2:]] == ["x", "call_0"]  # type: ignore[union-attr]


def test_a_conversation_starts_with_the_user_and_needs_tools() -> None:
    with pytest.raises(ValueError, match="starts with a user message"):
        conversation_request(conversation()[1:], TOOLS)
    with pytest.raises(ValueError, match="needs tools"):
        ModelRequest("x", "y", dict, messages=tuple(conversation()[1:]))  # type: ignore[arg-type]
    request = conversation_request(conversation(), TOOLS, tool_choice="none")
    assert request.input == DATA and len(request.messages) == 2
    assert request.tool_choice == "none" and request.tools == TOOLS


def chat_client(server: StubServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)


@pytest.fixture
def gemini(gemini_stub: GeminiStubServer, monkeypatch: pytest.MonkeyPatch) -> GeminiAdapter:
    monkeypatch.setenv("GEMINI_API_KEY", "gemini-test")
    return GeminiAdapter(base_url=gemini_stub.base_url)


async def test_openai_sends_calls_and_outputs_as_items(stub_server: StubServer) -> None:
    adapter = OpenAIAdapter(chat_client(stub_server))
    answer = await generate(
        adapter, conversation(), TOOLS, instructions="Decide.", settings=SETTINGS
    )
    assert answer.finish_reason == "tool_calls" and answer.function_calls
    body = stub_server.log[-1]
    assert body["tool_choice"] == "auto"
    call, output = body["input"][1:]
    assert call["type"] == "function_call" and call["name"] == "act"
    assert output == {
        "type": "function_call_output",
        "call_id": call["call_id"],
        "output": '{"seen":"a torn net"}',
    }
    closing = await generate(adapter, conversation(), TOOLS, settings=SETTINGS, tool_choice="none")
    assert closing.function_calls is None and closing.content
    assert stub_server.log[-1]["tool_choice"] == "none"


async def test_chat_sends_tool_calls_and_tool_messages(stub_server: StubServer) -> None:
    adapter = ChatAdapter(chat_client(stub_server))
    answer = await generate(adapter, conversation(), TOOLS, settings=SETTINGS)
    assert answer.function_calls and answer.usage is not None
    body = stub_server.log[-1]
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool"]
    assistant, tool = body["messages"][2:]
    assert assistant["tool_calls"][0]["function"]["name"] == "act"
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert body["tool_choice"] == "auto"
    closing = await generate(adapter, conversation(), TOOLS, settings=SETTINGS, tool_choice="none")
    assert closing.function_calls is None and closing.content


async def test_gemini_sends_function_parts_with_signatures(
    gemini: GeminiAdapter, gemini_stub: GeminiStubServer
) -> None:
    answer = await generate(gemini, conversation(), TOOLS, settings=SETTINGS)
    assert answer.finish_reason == "tool_calls" and answer.function_calls
    body = gemini_stub.log[-1]
    contents: list[dict[str, Any]] = body["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    call_part = contents[1]["parts"][0]
    call = call_part["functionCall"]
    assert call["name"] == "act" and call["args"] == {"object": "net", "action": "look"}
    # the thought signature goes back with the call, as Gemini requires
    assert call_part["thoughtSignature"] == SIGNATURE
    response = contents[2]["parts"][0]["functionResponse"]
    assert response == {"id": call["id"], "name": "act", "response": {"seen": "a torn net"}}
    assert body["toolConfig"]["functionCallingConfig"]["mode"] == "AUTO"
    closing = await generate(gemini, conversation(), TOOLS, settings=SETTINGS, tool_choice="none")
    assert closing.function_calls is None and closing.content
    assert gemini_stub.log[-1]["toolConfig"]["functionCallingConfig"]["mode"] == "NONE"
    # the model's signed call is kept, and sent back when the conversation goes on
    first = await generate(gemini, conversation()[:1], TOOLS, settings=SETTINGS)
    assert first.function_calls is not None
    signed = first.function_calls[0]
    assert signed.signature and base64.b64decode(signed.signature).startswith(b"signed:")
    messages = [
        conversation()[0],
        LLMMessage(role="assistant", function_call=signed),
        LLMMessage(role="function", function_response=FunctionResponse(name=signed.name)),
    ]
    await generate(gemini, messages, TOOLS, settings=SETTINGS, tool_choice="required")
    sent = gemini_stub.log[-1]
    assert sent["contents"][1]["parts"][0]["thoughtSignature"] == signed.signature
    assert sent["toolConfig"]["functionCallingConfig"]["mode"] == "ANY"


async def test_anthropic_sends_tool_use_and_tool_result_blocks(
    anthropic_stub: AnthropicStubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    adapter = AnthropicAdapter(base_url=anthropic_stub.base_url)
    answer = await generate(
        adapter, conversation(), TOOLS, instructions="Decide.", settings=SETTINGS
    )
    assert answer.finish_reason == "tool_calls" and answer.function_calls
    body = anthropic_stub.log[-1]
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    (call,) = body["messages"][1]["content"]
    assert call["type"] == "tool_use" and call["name"] == "act"
    assert call["input"] == {"object": "net", "action": "look"}
    (result,) = body["messages"][2]["content"]
    assert result == {
        "type": "tool_result",
        "tool_use_id": call["id"],
        "content": '{"seen":"a torn net"}',
    }
    assert body["tool_choice"] == {"type": "auto"}
    closing = await generate(adapter, conversation(), TOOLS, settings=SETTINGS, tool_choice="none")
    assert closing.function_calls is None and closing.content
    assert anthropic_stub.log[-1]["tool_choice"] == {"type": "none"}
    await generate(adapter, conversation(), TOOLS, settings=SETTINGS, tool_choice="required")
    assert anthropic_stub.log[-1]["tool_choice"] == {"type": "any"}


async def test_offline_answers_each_step_deterministically() -> None:
    adapter = OfflineAdapter(seed=7)
    first = await generate(adapter, conversation()[:1], TOOLS, settings=SETTINGS)
    step = await generate(adapter, conversation(), TOOLS, settings=SETTINGS)
    again = await generate(OfflineAdapter(seed=7), conversation(), TOOLS, settings=SETTINGS)
    assert first.function_calls and step.function_calls
    assert step == again  # same seed, same answer
    assert step.response is not None and first.response is not None
    assert step.response.response_id != first.response.response_id  # its own seed
    assert step.response.usage.input_tokens > first.response.usage.input_tokens
    closing = await generate(adapter, conversation(), TOOLS, settings=SETTINGS, tool_choice="none")
    assert closing.function_calls is None and closing.content == "Understood."


def test_a_conversation_step_has_its_own_call_digest() -> None:
    from sim.llm.calls import CallIdentity

    def sent(request: ModelRequest) -> CallIdentity:
        ident = CallIdentity("1:intentions:ada:0", "intentions", "ada", 0, "Decide.", DATA, "", "")
        return ident.sent(request)

    single = sent(ModelRequest("Decide.", DATA, tools=TOOLS, settings=SETTINGS))
    assert set(single.settings) == {"temperature", "max_output_tokens"}  # as before
    step = sent(conversation_request(conversation(), TOOLS, settings=SETTINGS))
    other = sent(conversation_request(conversation()[:2], TOOLS, settings=SETTINGS))
    closing = sent(
        conversation_request(conversation(), TOOLS, settings=SETTINGS, tool_choice="none")
    )
    assert len({single.digest, step.digest, other.digest, closing.digest}) == 4


def test_the_budget_reserves_the_conversation_too() -> None:
    from sim.llm.budget import estimate_usage

    start = estimate_usage(conversation_request(conversation()[:1], TOOLS, settings=SETTINGS))
    step = estimate_usage(conversation_request(conversation(), TOOLS, settings=SETTINGS))
    assert step.input_tokens > start.input_tokens
