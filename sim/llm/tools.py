"""Tool calling in our own types (spec 004): messages, function calls, tool declarations.

Tool calling is an optional adapter capability: a ``ModelRequest`` with ``tools`` set goes
through the same ``execute``; an adapter that lacks it takes its schema with ``schema_of``,
which fails such a request loudly with ``LLMConfigurationError`` naming its class. A tool
call's answer travels as an ``AdapterResponse`` whose ``parsed`` is a ``ToolCalls`` (so
chains, usage, recovery and events treat it like any structured answer).
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from sim.llm.errors import LLMConfigurationError, LLMSchemaError
from sim.llm.types import AdapterResponse, ModelRequest


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


def schema_of(adapter: object, request: ModelRequest) -> type[BaseModel]:
    """The schema ``request`` asks for; a tool-calling request is a loud error naming the
    adapter's class (call this where an adapter without tool calling reads the schema)."""
    if request.schema is None:
        raise LLMConfigurationError(
            f"{type(adapter).__name__} does not support tool calling; use a provider that "
            'does (offline, openai, chat) or set [phase1] mode = "schema"'
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
