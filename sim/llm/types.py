"""Value types shared by the client and every adapter, and the adapter contract."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from pydantic import BaseModel

if TYPE_CHECKING:
    from sim.llm.batching import BatchTransport
    from sim.llm.calls import CallIdentity
    from sim.llm.enums import SchemaEnums
    from sim.llm.streaming import CallText
    from sim.llm.tools import LLMMessage, ToolDeclaration

#: a check of a parsed answer beyond its schema (a phase's references): the problem, worded
#: for the model (recovery feeds it back like a schema error), or ``None`` when it is fine
AnswerCheck = Callable[[BaseModel], "str | None"]

#: whether a tool-calling request must call a tool (``required``), may (``auto``) or may not
#: (``none``: answer in text, e.g. to close a conversation)
ToolChoice = Literal["auto", "required", "none"]

#: how a chat-completions server is asked for the schema (``sim.providers._structured``)
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
class ModelTarget:
    """Where one model runs: an endpoint's name (``openai``, ``local``) and the model as that
    endpoint names it. Written ``provider/model`` (``sim.config.resolve_model`` parses it)."""

    provider: str
    model: str

    def __str__(self) -> str:
        return f"{self.provider}/{self.model}" if self.provider else self.model

    def key(self) -> tuple[str, str]:
        """What two candidates are the same by: the provider and the model, case and
        surrounding whitespace ignored (``"A"`` and ``" a"`` are one model)."""
        return self.provider, self.model.strip().casefold()


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
    #: the endpoint ``model`` runs on (a name from ``sim.config.routing``; "": the stack's
    #: default endpoint)
    provider: str = ""
    #: models tried in order when ``model`` fails after its retries (recovery wrapper): a
    #: plain name runs on ``provider``, a ``ModelTarget`` on its own endpoint
    fallback_models: tuple[str | ModelTarget, ...] = ()
    #: how a chat-completions server is asked for the schema: auto, json_schema,
    #: json_object_schema, tool or prompt (``sim.providers._structured``)
    structured_output: StructuredOutput = "auto"

    def __post_init__(self) -> None:
        """Spec 001's invariants, for settings built in code as for those from a config:
        0 <= temperature <= 2, a positive token cap, positive finite timeouts.

        Raises:
            ValueError: naming each setting out of range.
        """
        problems = []
        if not 0.0 <= self.temperature <= 2.0:  # a NaN fails this too
            problems.append(f"temperature must be between 0 and 2, got {self.temperature!r}")
        if isinstance(self.max_output_tokens, bool) or self.max_output_tokens <= 0:
            problems.append(f"max_output_tokens must be > 0, got {self.max_output_tokens!r}")
        for name in ("timeout_seconds", "first_token_timeout_seconds", "idle_timeout_seconds"):
            value = getattr(self, name)
            if not 0.0 < value < math.inf:
                problems.append(f"{name} must be a positive number of seconds, got {value!r}")
        if problems:
            raise ValueError("invalid CallSettings: " + "; ".join(problems))


@dataclass(frozen=True, slots=True)
class Exchange:
    """One earlier turn of a chain: what was sent and what the model answered.

    In ``window`` chain mode the client sends the last ``depth`` exchanges as input, so the
    model sees exactly that window whatever the provider.
    """

    response_id: str
    input: str
    output: str


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """Everything one call to a model sends, as one frozen value.

    Adapters take it whole (``Adapter.execute``); wrappers that change a call make a
    changed copy with ``dataclasses.replace`` (recovery: the schema feedback, the
    fallback model), so what was asked and what was sent stay separate values.

    Exactly one of ``schema`` (structured output) and ``tools`` (ask for a tool call; the
    answer's ``parsed`` is then a ``ToolCalls``) is set. ``history`` is the chain window
    (``window`` mode); ``previous_response_id`` the provider-side chain (``server`` mode).
    ``messages`` continue a tool-calling conversation after ``input`` (the model's function
    calls and what the tools answered, spec 004's ``LLMMessage``); ``tool_choice`` says
    whether the answer must call a tool. ``enums`` limit some fields of the schema sent to
    the values valid for this request (``sim.llm.enums``); ``check`` looks at the parsed
    answer (recovery: a problem is a schema error, re-asked with it fed back).
    ``call`` names the call (request id, tick scope, failures seen: ``sim.llm.calls``) for
    the layers that need to know which call they serve (the policy gate, replay, the
    Batch API, the idempotency key); ``None``: an anonymous call (no tick recorder).
    ``batch`` is the Batch API session of the ``create_batch`` the call belongs to
    (``[llm] batch``: ``sim.llm.batching``): an endpoint that batches posts the body to it
    instead of sending it, and the budget prices it at the batch rate. ``stream_to`` is
    where a streamed answer's text goes as it arrives (``sim.llm.streaming``; ``None``:
    nowhere).
    """

    instructions: str
    input: str
    schema: type[BaseModel] | None = None
    tools: tuple[ToolDeclaration, ...] | None = None
    history: tuple[Exchange, ...] = ()
    previous_response_id: str | None = None
    settings: CallSettings = field(default_factory=CallSettings)
    messages: tuple[LLMMessage, ...] = ()
    tool_choice: ToolChoice = "required"
    enums: SchemaEnums | None = None
    check: AnswerCheck | None = field(default=None, compare=False)
    call: CallIdentity | None = field(default=None, compare=False)
    batch: BatchTransport | None = field(default=None, compare=False)
    stream_to: CallText | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if (self.schema is None) == (self.tools is None):
            raise ValueError("a ModelRequest needs exactly one of schema and tools")
        if self.messages and self.tools is None:
            raise ValueError("a ModelRequest with messages (a tool conversation) needs tools")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One request sent (or refused by an open breaker), as recovery records it."""

    model: str
    attempt: int
    usage: Usage
    latency: float
    error_code: str | None = None
    #: the endpoint the attempt went to ("": the stack's only one)
    provider: str = ""
    #: the server URL the attempt went to (``None``: no network, e.g. offline)
    endpoint: str | None = None


#: where an answer came from: the provider, or a tick log (``sim replay``, a resumed tick)
ServedFrom = Literal["live", "replay", "resume"]


@dataclass(frozen=True, slots=True)
class AdapterResponse:
    """What an adapter returns for one successful call.

    Attributes:
        provider: the adapter that answered (``"openai"``, ``"chat"``, ``"offline"``...).
        model: the model that answered, as the provider names it.
        served_from: ``"live"``, or the tick log's mode when a recording answered.
        attempts: every attempt of the call, the successful one last (set by recovery;
            empty when nothing recorded them: the call was one attempt).
        fallback_from, fallback_to: the model asked for and the fallback model that
            answered, when the call fell back (recovery): ``provider/model`` when the
            request named its provider.
        structured_output: the form the schema was asked for in (``chat``, ``openai``).
        notice: something the user should hear once, in the tick summary, one note a
            line (``auto`` switched this endpoint's structured-output form; what the
            server said about its capacity, ``sim.llm.backpressure``).
        endpoint: the server URL that answered (set by ``sim.llm.backpressure``).
        moved: attempts that failed on other servers of a pool before this one answered
            (``sim.llm.pool``); recovery puts them in ``attempts``.
    """

    parsed: BaseModel
    response_id: str
    usage: Usage
    model: str
    finish_reason: str = "stop"
    raw: str = ""
    provider: str = ""
    served_from: ServedFrom = "live"
    attempts: tuple[Attempt, ...] = ()
    fallback_from: str | None = None
    fallback_to: str | None = None
    structured_output: str | None = None
    notice: str | None = None
    endpoint: str | None = None
    moved: tuple[Attempt, ...] = ()


@runtime_checkable
class Adapter(Protocol):
    """A provider boundary: one async call, plus response deletion.

    ``execute`` raises only ``LLMError`` subclasses. An adapter without tool calling fails
    a request with ``tools`` loudly (``sim.llm.tools.schema_of``).
    """

    name: str

    async def execute(self, request: ModelRequest) -> AdapterResponse: ...

    async def delete_response(self, response_id: str) -> None: ...


@runtime_checkable
class Closeable(Protocol):
    """What holds connections open (a provider adapter's HTTP client, a pool of servers):
    ``aclose`` closes them, on the event loop that used them. The stack's builder keeps
    the ones it made (``sim.engine.stack.Stack.clients``) and closes exactly those."""

    async def aclose(self) -> None: ...
