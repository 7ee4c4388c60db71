"""Tool calling in our own types (spec 004): messages, function calls, tool declarations.

Tool calling is an optional adapter capability: a ``ModelRequest`` with ``tools`` set goes
through the same ``execute``; an adapter that lacks it takes its schema with ``schema_of``,
which fails such a request loudly with ``LLMConfigurationError`` naming its class. A tool
call's answer travels as an ``AdapterResponse`` whose ``parsed`` is a ``ToolCalls`` (so
chains, usage, recovery and events treat it like any structured answer).

A conversation over several turns (spec 004's ``generate(messages, tools)``) is the same
call: the request's ``messages`` carry the model's earlier function calls and the tools'
answers after its ``input``, and ``tool_choice`` says whether a call is required, allowed
or not allowed. Every adapter renders those messages in its own wire format;
``generate`` wraps that into spec 004's signature and ``GenerateResponse``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from sim.llm.errors import (
    LLMConfigurationError,
    LLMError,
    LLMIncompleteError,
    LLMSchemaError,
    ToolNotFoundError,
)
from sim.llm.types import AdapterResponse, CallSettings, ModelRequest, ToolChoice, Usage

if TYPE_CHECKING:
    from sim.llm.types import Adapter

logger = logging.getLogger(__name__)

#: ``LLMIncompleteError.reason``s that mean the answer hit the token cap (``max_tokens``)
CUT_AT_TOKEN_CAP = frozenset({"max_output_tokens", "max_tokens", "length"})


class FunctionCall(BaseModel):
    """One call the model chose: a tool name and its parsed arguments.

    ``signature`` is opaque provider data that must go back with the call when a
    conversation continues (Gemini's thought signature, base64); ``None`` for most.
    """

    model_config = ConfigDict(frozen=True, defer_build=True)

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    call_id: str = ""
    signature: str | None = Field(default=None, repr=False)


class FunctionResponse(BaseModel):
    """What a tool returned, to send back to the model.

    ``call_id`` names the call it answers; when empty, it answers the earliest unanswered
    call of the same tool (``with_call_ids``).
    """

    model_config = ConfigDict(frozen=True, defer_build=True)

    name: str
    response: dict[str, Any] = Field(default_factory=dict)
    call_id: str = ""


class LLMMessage(BaseModel):
    """One message of a tool-calling conversation (spec 004)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    role: Literal["user", "assistant", "function"]
    content: str | None = None
    function_call: FunctionCall | None = None
    function_response: FunctionResponse | None = None


class ToolDeclaration(BaseModel):
    """A tool the model may call: name, what it is for, its JSON Schema parameters."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str
    parameters: dict[str, Any]

    @classmethod
    def of_strings(cls, name: str, description: str, **fields: str) -> ToolDeclaration:
        """A tool whose arguments are all strings, each with its description; every one is
        required (an argument-less tool declares no ``required`` list)."""
        properties = {key: {"type": "string", "description": text} for key, text in fields.items()}
        parameters: dict[str, Any] = {"type": "object", "properties": properties}
        if fields:
            parameters["required"] = list(fields)
        return cls(name=name, description=description, parameters=parameters)

    def openai_responses(self) -> dict[str, Any]:
        """The Responses API shape (flat)."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "strict": False,
        }

    def openai_chat(self) -> dict[str, Any]:
        """The chat-completions shape (nested under ``function``)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


class ToolCalls(BaseModel):
    """The parsed answer of a tool-calling request: the calls, and any text."""

    model_config = ConfigDict(title="ToolCalls", defer_build=True)

    calls: list[FunctionCall] = Field(default_factory=list)
    content: str | None = None

    def dump(self) -> str:
        """Compact JSON, kept as the exchange's output in a chain window."""
        return orjson.dumps(self.model_dump(mode="json", exclude_none=True)).decode()


#: an ``AdapterResponse`` whose ``parsed`` is a ``ToolCalls``
ToolCallResponse = AdapterResponse


@dataclass(frozen=True, slots=True)
class GenerateResponse:
    """Spec 004's answer to ``generate``: text and/or function calls.

    ``finish_reason`` is ``"tool_calls"`` (calls to offered tools), ``"stop"`` (text
    only), ``"max_tokens"`` (the answer was cut short at the token cap) or ``"error"`` (the
    answer was malformed even after recovery's retries; ``error`` says how). Other failures
    (rate limit, timeout, key...) are raised as ``LLMError``s, as the spec's table says.
    ``ignored`` holds a ``ToolNotFoundError`` for each call of a tool that was not offered:
    such a call is left out of ``function_calls`` and the conversation goes on (spec 004).
    """

    content: str | None
    function_calls: list[FunctionCall] | None
    finish_reason: Literal["stop", "tool_calls", "max_tokens", "error"]
    usage: Usage | None = None
    error: str | None = None
    #: the adapter's whole answer (response id, model, attempts...); ``None`` when the
    #: call ended in ``max_tokens`` or ``error``
    response: AdapterResponse | None = None
    ignored: tuple[ToolNotFoundError, ...] = ()


class ToolRegistry:
    """Tools by name, immutable; ``get_tool_declarations`` picks a phase's set (spec 004).

    Raises:
        ValueError: two tools share a name.
    """

    def __init__(self, tools: Iterable[ToolDeclaration]) -> None:
        by_name: dict[str, ToolDeclaration] = {}
        for tool in tools:
            if tool.name in by_name:
                raise ValueError(f"two tools are named {tool.name!r}")
            by_name[tool.name] = tool
        self._tools = MappingProxyType(by_name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def get_tool_declarations(self, names: Iterable[str]) -> tuple[ToolDeclaration, ...]:
        """The declarations of ``names``, in that order.

        Raises:
            LLMConfigurationError: a name is not registered (the known names are listed).
        """
        out = []
        for name in names:
            tool = self._tools.get(name)
            if tool is None:
                raise LLMConfigurationError(
                    f"unknown tool {name!r}; the registry has: {', '.join(self._tools) or 'none'}"
                )
            out.append(tool)
        return tuple(out)


def with_call_ids(messages: Sequence[LLMMessage]) -> tuple[LLMMessage, ...]:
    """The conversation with every call and response paired by id.

    A function call without an id gets ``call_{n}`` (its position), deterministically; a
    function response without one answers the earliest unanswered call of its tool (else
    the last call of any tool), as wire formats that pair them by id need.
    """
    out: list[LLMMessage] = []
    open_calls: list[FunctionCall] = []
    for n, message in enumerate(messages):
        call = message.function_call
        if call is not None:
            if not call.call_id:
                call = call.model_copy(update={"call_id": f"call_{n}"})
                message = message.model_copy(update={"function_call": call})
            open_calls.append(call)
        answer = message.function_response
        if answer is not None:
            match = next((c for c in open_calls if c.call_id == answer.call_id), None)
            if match is None and not answer.call_id:
                match = next((c for c in open_calls if c.name == answer.name), None) or (
                    open_calls[-1] if open_calls else None
                )
                if match is not None:
                    answer = answer.model_copy(update={"call_id": match.call_id})
                    message = message.model_copy(update={"function_response": answer})
            if match is not None:
                open_calls.remove(match)
        out.append(message)
    return tuple(out)


def response_json(answer: FunctionResponse) -> str:
    """A tool's answer as the compact JSON text the OpenAI wire formats carry."""
    return orjson.dumps(answer.response).decode()


def conversation_request(
    messages: Sequence[LLMMessage],
    tools: Sequence[ToolDeclaration],
    *,
    instructions: str = "",
    settings: CallSettings | None = None,
    tool_choice: ToolChoice = "auto",
) -> ModelRequest:
    """A spec-004 conversation as one ``ModelRequest``: the first message (a user text) is
    the input, the rest its ``messages``.

    Raises:
        ValueError: the conversation does not start with a user text, or has no tools.
    """
    if not messages or messages[0].role != "user" or messages[0].content is None:
        raise ValueError("a conversation starts with a user message with content")
    return ModelRequest(
        instructions,
        messages[0].content,
        tools=tuple(tools),
        messages=with_call_ids(messages[1:]),
        tool_choice=tool_choice,
        settings=settings or CallSettings(),
    )


async def generate(
    adapter: Adapter,
    messages: Sequence[LLMMessage],
    tools: Sequence[ToolDeclaration],
    *,
    instructions: str = "",
    settings: CallSettings | None = None,
    tool_choice: ToolChoice = "auto",
) -> GenerateResponse:
    """One turn of a tool-calling conversation on any adapter (spec 004's ``generate``).

    Args:
        adapter: the provider (or a wrapped stack: recovery, budget...).
        messages: the conversation so far, starting with the user's message.
        tools: the tools the model may call.
        instructions: the system instructions.
        settings: model, temperature, ``max_output_tokens`` (spec: ``max_tokens``).
        tool_choice: ``auto`` (may call), ``required`` (must), ``none`` (must not).

    Raises:
        LLMError: the call failed (rate limit, timeout, refusal...).
    """
    request = conversation_request(
        messages, tools, instructions=instructions, settings=settings, tool_choice=tool_choice
    )
    try:
        response = await adapter.execute(request)
    except LLMIncompleteError as exc:
        if exc.reason not in CUT_AT_TOKEN_CAP:
            raise
        return GenerateResponse(None, None, "max_tokens", exc.total_usage, str(exc))
    except LLMError as exc:
        if exc.code != LLMSchemaError.default_code:  # also a fallback chain's last error
            raise
        return GenerateResponse(None, None, "error", exc.total_usage, str(exc))
    parsed = response.parsed
    offered = {tool.name for tool in tools}
    calls = list(parsed.calls) if isinstance(parsed, ToolCalls) else []
    ignored = tuple(
        ToolNotFoundError(
            f"the model called {call.name!r}, which it was not offered "
            f"({', '.join(sorted(offered))}); the call is ignored",
            tool=call.name,
            model=response.model,
            context={"arguments": call.arguments, "call_id": call.call_id},
        )
        for call in calls
        if call.name not in offered
    )
    for unknown in ignored:
        logger.warning("%s", unknown)
    calls = [call for call in calls if call.name in offered]
    content = parsed.content if isinstance(parsed, ToolCalls) else response.raw
    return GenerateResponse(
        content=content,
        function_calls=calls or None,
        finish_reason="tool_calls" if calls else "stop",
        usage=response.usage,
        response=response,
        ignored=ignored,
    )


def schema_of(adapter: object, request: ModelRequest) -> type[BaseModel]:
    """The schema ``request`` asks for; a tool-calling request is a loud error naming the
    adapter's class (call this where an adapter without tool calling reads the schema)."""
    if request.schema is None:
        raise LLMConfigurationError(
            f"{type(adapter).__name__} does not support tool calling; use a provider that "
            'does (offline, openai, chat, gemini, anthropic) or set [phase1] mode = "schema"'
        )
    return request.schema


def parse_arguments(name: str, text: str | None) -> dict[str, Any]:
    """A function call's JSON arguments as a dict.

    Raises:
        LLMSchemaError: the arguments are not a JSON object.
    """
    try:
        value = orjson.loads(text or "{}")
    except orjson.JSONDecodeError as exc:
        raise LLMSchemaError(f"arguments of {name} are not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise LLMSchemaError(f"arguments of {name} are not a JSON object")
    return value


def wire_call(name: Any, arguments: str | None, call_id: Any) -> FunctionCall:
    """A function call as the OpenAI wire formats send it: JSON-text ``arguments``, parsed
    here (``LLMSchemaError`` when they are not a JSON object); a missing name or id is ""."""
    name = str(name or "")
    return FunctionCall(
        name=name, arguments=parse_arguments(name, arguments), call_id=str(call_id or "")
    )
