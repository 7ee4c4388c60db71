"""Tool calling in our own types (spec 004): messages, function calls, tool declarations.

Tool calling is an optional adapter capability: an adapter that has it implements
``execute_tools`` (see ``ToolAdapter``); asking one that lacks it fails loudly with
``LLMConfigurationError`` naming its class. A tool call's answer travels as an
``AdapterResponse`` whose ``parsed`` is a ``ToolCalls`` (so chains, usage, recovery and
events treat it like any structured answer).
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

import orjson
from pydantic import BaseModel, ConfigDict, Field

from sim.llm.errors import LLMConfigurationError, LLMSchemaError
from sim.llm.types import AdapterResponse, CallSettings, Exchange


class FunctionCall(BaseModel):
    """One call the model chose: a tool name and its parsed arguments."""

    model_config = ConfigDict(frozen=True)

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    call_id: str = ""


class FunctionResponse(BaseModel):
    """What a tool returned, to send back to the model."""

    model_config = ConfigDict(frozen=True)

    name: str
    response: dict[str, Any] = Field(default_factory=dict)


class LLMMessage(BaseModel):
    """One message of a tool-calling conversation (spec 004)."""

    model_config = ConfigDict(frozen=True)

    role: Literal["user", "assistant", "function"]
    content: str | None = None
    function_call: FunctionCall | None = None
    function_response: FunctionResponse | None = None


class ToolDeclaration(BaseModel):
    """A tool the model may call: name, what it is for, its JSON Schema parameters."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str
    parameters: dict[str, Any]

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

    model_config = ConfigDict(title="ToolCalls")

    calls: list[FunctionCall] = Field(default_factory=list)
    content: str | None = None

    def dump(self) -> str:
        """Compact JSON, kept as the exchange's output in a chain window."""
        return orjson.dumps(self.model_dump(mode="json", exclude_none=True)).decode()


#: an ``AdapterResponse`` whose ``parsed`` is a ``ToolCalls``
ToolCallResponse = AdapterResponse


@runtime_checkable
class ToolAdapter(Protocol):
    """The optional tool-calling capability of an adapter."""

    name: str

    async def execute_tools(
        self,
        instructions: str,
        input_data: str,
        tools: tuple[ToolDeclaration, ...],
        settings: CallSettings | None = None,
        history: tuple[Exchange, ...] = (),
    ) -> ToolCallResponse: ...


def require_tools(adapter: object) -> ToolAdapter:
    """``adapter`` as a ``ToolAdapter``, or a loud error naming its class."""
    if not isinstance(adapter, ToolAdapter):
        raise LLMConfigurationError(
            f"{type(adapter).__name__} does not support tool calling; use a provider that "
            'does (offline, openai, chat) or set [phase1] mode = "schema"'
        )
    return adapter


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
