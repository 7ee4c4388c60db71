"""Value types shared by the client and every adapter, and the adapter contract."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel

#: how a chat-completions server is asked for the schema (``sim.llm.adapters._structured``)
StructuredOutput = Literal["auto", "json_schema", "json_object_schema", "tool", "prompt"]


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one call consumed, as the provider counted them."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
        )

    def to_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_input_tokens": self.cached_input_tokens,
        }


@dataclass(frozen=True, slots=True)
class CallSettings:
    """Per-call generation settings, taken from a phase's config section."""

    model: str = "offline"
    temperature: float = 0.7
    max_output_tokens: int = 800
    #: the whole call, queueing at the server included
    timeout_seconds: float = 600.0
    #: streamed calls: until the first event (covers time queued behind a busy server)
    first_token_timeout_seconds: float = 300.0
    #: streamed calls: between two events (a stream silent this long is hung)
    idle_timeout_seconds: float = 60.0
    #: ask the server to stream the answer (``stream: true``); the answer is the same
    stream: bool = False
    #: models tried in order when ``model`` fails after its retries (recovery wrapper)
    fallback_models: tuple[str, ...] = ()
    #: how a chat-completions server is asked for the schema: auto, json_schema,
    #: json_object_schema, tool or prompt (``sim.llm.adapters._structured``)
    structured_output: StructuredOutput = "auto"


@dataclass(frozen=True, slots=True)
class Exchange:
    """One earlier turn of a chain: what was sent and what the model answered.

    In ``window`` chain mode the client sends the last ``depth`` exchanges as input, so the
    model sees exactly that window whatever the provider.
    """

    response_id: str
    input: str
    output: str


@dataclass(slots=True)
class AdapterResponse:
    """What an adapter returns for one successful call."""

    parsed: BaseModel
    response_id: str
    usage: Usage
    model: str
    finish_reason: str = "stop"
    raw: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Adapter(Protocol):
    """A provider boundary: one required async method, plus response deletion.

    ``execute`` raises only ``LLMError`` subclasses. ``history`` is the chain window
    (``window`` mode); ``previous_response_id`` is the provider-side chain (``server`` mode).
    """

    name: str

    async def execute(
        self,
        instructions: str,
        input_data: str,
        schema: type[BaseModel],
        previous_response_id: str | None = None,
        settings: CallSettings | None = None,
        history: tuple[Exchange, ...] = (),
    ) -> AdapterResponse: ...

    async def delete_response(self, response_id: str) -> None: ...

    def validate_config(self, settings: CallSettings) -> bool: ...
