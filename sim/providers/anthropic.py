"""The ``anthropic`` provider: Claude through Anthropic's own SDK and its Messages API.

A request becomes one ``POST /v1/messages``: the instructions as ``system``, the chain
window (``window`` mode) and the input as alternating user/assistant ``messages``, and

- structured output: one tool whose ``input_schema`` is the answer's JSON Schema, forced
  with ``tool_choice = {"type": "tool", "name": ...}``; the tool call's ``input`` is the
  answer, validated against the schema here (an invalid one is an ``LLMSchemaError``, so
  recovery retries with the validation error fed back, as for every provider);
- tool calling (``request.tools``): the tools declared with the request's ``tool_choice``
  (``required`` -> ``{"type": "any"}``, ``auto``, ``none``); the ``tool_use`` blocks become
  the same ``ToolCalls`` the other adapters return. A tool conversation
  (``request.messages``) continues after the input: the model's calls as ``tool_use``
  blocks of assistant turns, the tools' answers as ``tool_result`` blocks of user turns.

No temperature is sent: the Messages API of the SDK this adapter is written against (2.x)
takes no sampling parameters, so a phase's ``temperature`` does not apply to Claude.

The answer is checked in this order: not a message at all (``{}``, no content blocks or
no usage) -> ``LLMAPIError`` with code ``malformed_answer``, not retried (it is a fallback
model's turn); ``stop_reason`` ``refusal`` -> ``LLMRefusalError``;
``max_tokens`` (or another early stop) -> ``LLMIncompleteError``; a missing or invalid
answer -> ``LLMSchemaError``. Every failure carries the attempt's usage.

Usage: Anthropic's ``input_tokens`` leaves out cached tokens, so the input counted here is
``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``, of which
``cache_read_input_tokens`` are the cached input (priced at ``cached_input``). Cache writes
are counted as input at the input price: sim never asks for prompt caching
(``cache_control``), so Anthropic writes none for its requests and the count is 0; a
gateway that reports some is under-priced by the write premium (docs/providers.md).

Anthropic keeps no responses: there are no server chains and nothing to delete. The SDK is
an optional extra (``pip install 'sim[anthropic]'``); its own retries stay off (recovery
owns retries), and every call passes its timeout explicitly.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import httpx2
import orjson
from pydantic import BaseModel, ValidationError

from sim.llm.calls import schema_json
from sim.llm.enums import constrain
from sim.llm.errors import (
    LLMAPIError,
    LLMBudgetExceededError,
    LLMError,
    LLMIncompleteError,
    LLMSchemaError,
)
from sim.llm.tools import FunctionCall, LLMMessage, ToolCalls, response_json, schema_of
from sim.llm.types import AdapterResponse, Exchange, ModelRequest, ToolChoice, Usage
from sim.providers._adapter_common import (
    ErrorReply,
    SDKAdapter,
    map_sdk_error,
    refused,
    require_module,
    window_turns,
)
from sim.providers._openai_common import schema_mismatch
from sim.providers._openai_errors import retry_after_seconds
from sim.providers.http.sdk_pool import sdk_http_client
from sim.providers.profiles import ANTHROPIC

if TYPE_CHECKING:
    import anthropic
    from anthropic.types import Message

#: the environment variable read for the key unless ``[llm] api_key_env`` names another
DEFAULT_KEY_ENV = ANTHROPIC.key_env
INSTALL_HINT = f"pip install 'sim[{ANTHROPIC.sdk_extra}]'"

#: stop reasons of a complete answer
_DONE = frozenset({"end_turn", "tool_use", "stop_sequence", None})
_CONTEXT = re.compile(r"prompt is too long|context (window|length)|too many tokens", re.I)
_CREDIT = re.compile(r"credit balance is too low", re.I)
_API = "the Anthropic API"
_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")


def require_sdk() -> Any:
    """The ``anthropic`` module; a clear configuration error when it is not installed."""
    return require_module("anthropic", ANTHROPIC.kind, "Anthropic's SDK (anthropic)", INSTALL_HINT)


#: the schema as a tool's ``input_schema`` (its JSON Schema), computed once per class
input_schema = schema_json


def answer_tool(schema: type[BaseModel]) -> str:
    """The name of the forced tool that carries a ``schema`` answer (a valid tool name)."""
    return _TOOL_NAME.sub("_", schema.__name__)[:64] or "answer"


#: spec 004's tool_choice as the Messages API's
_TOOL_CHOICE: dict[ToolChoice, dict[str, str]] = {
    "required": {"type": "any"},
    "auto": {"type": "auto"},
    "none": {"type": "none"},
}


def _turn(out: list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    """The content blocks of the last turn if it is ``role``'s, else of a new one (the
    Messages API alternates roles: a turn's calls, or tool answers, share one turn)."""
    last = out[-1] if out else None
    if last is None or last["role"] != role or isinstance(last["content"], str):
        last = {"role": role, "content": []}
        out.append(last)
    blocks: list[dict[str, Any]] = last["content"]
    return blocks


def messages(
    history: tuple[Exchange, ...],
    input_data: str,
    conversation: tuple[LLMMessage, ...] = (),
) -> list[dict[str, Any]]:
    """The window's exchanges as user/assistant turns, the input as a user turn, then a
    tool conversation: calls as ``tool_use`` blocks, the tools' answers as ``tool_result``."""
    out = window_turns(history, input_data)
    for message in conversation:
        call, answer = message.function_call, message.function_response
        if answer is not None:
            _turn(out, "user").append(
                {
                    "type": "tool_result",
                    "tool_use_id": answer.call_id,
                    "content": response_json(answer),
                }
            )
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _turn(out, role)
        if message.content:
            blocks.append({"type": "text", "text": message.content})
        if call is not None:
            blocks.append(
                {"type": "tool_use", "id": call.call_id, "name": call.name, "input": call.arguments}
            )
    return out


def malformed(message: Message) -> str | None:
    """What makes ``message`` no Messages API message, or ``None``: the fields this adapter
    reads (``content``, a list of blocks with a ``type``; ``usage`` with whole
    ``input_tokens`` and ``output_tokens``). The SDK builds its answer object without
    validating it, so a ``{}`` answered with status 200 arrives with all of them ``None``."""
    content = getattr(message, "content", None)
    if not isinstance(content, list):
        return "no content blocks"
    for block in content:
        kind = getattr(block, "type", None)
        if not isinstance(kind, str):
            return "a content block without a type"
        if kind == "text" and not isinstance(getattr(block, "text", None), str):
            return "a text block without text"
        if kind == "tool_use" and not (
            isinstance(getattr(block, "name", None), str)
            and isinstance(getattr(block, "input", None), dict)
        ):
            return "a tool_use block without a name or an input object"
    usage = getattr(message, "usage", None)
    counts = (getattr(usage, "input_tokens", None), getattr(usage, "output_tokens", None))
    if usage is None or not all(isinstance(n, int) and n >= 0 for n in counts):
        return "no usage (input_tokens, output_tokens)"
    return None


def usage_of(message: Message) -> Usage:
    """Input including cache reads and writes (Anthropic counts them apart), cache reads
    as the cached part, and output."""
    usage = message.usage
    read = usage.cache_read_input_tokens or 0
    written = usage.cache_creation_input_tokens or 0
    return Usage(
        input_tokens=usage.input_tokens + read + written,
        output_tokens=usage.output_tokens,
        cached_input_tokens=read,
    )


def check_stop(message: Message, usage: Usage, model: str) -> None:
    """Raise for a refused or cut-short answer."""
    reason = message.stop_reason
    if reason == "refusal":
        details = message.stop_details
        detail = (details.explanation if details is not None else None) or "no explanation"
        category = details.category if details is not None else None
        raise refused(detail, usage, model, category or "refusal")
    if reason == "max_tokens":
        raise LLMIncompleteError(
            "the answer was cut short (max_output_tokens)",
            reason="max_output_tokens",
            model=model,
            usage=usage,
        )
    if reason not in _DONE:
        raise LLMIncompleteError(
            f"the answer stopped early ({reason})", reason=str(reason), model=model, usage=usage
        )


def _text(message: Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def tool_calls(message: Message) -> ToolCalls:
    """The ``tool_use`` blocks (and any text) of an answer, in our own types."""
    calls = [
        FunctionCall(name=block.name, arguments=dict(block.input), call_id=block.id)
        for block in message.content
        if block.type == "tool_use"
    ]
    return ToolCalls(calls=calls, content=_text(message) or None)


def structured(
    schema: type[BaseModel], message: Message, usage: Usage, model: str
) -> tuple[BaseModel, str]:
    """The forced tool call's input, validated against ``schema``; and its JSON.

    Raises:
        LLMSchemaError: no call of the answer tool, or input that does not validate.
    """
    name = answer_tool(schema)
    for block in message.content:
        if block.type == "tool_use" and block.name == name:
            raw = orjson.dumps(block.input).decode()
            try:
                return schema.model_validate(block.input), raw
            except ValidationError as exc:
                raise schema_mismatch(schema, exc, raw, usage, model) from exc
    text = _text(message)
    raise LLMSchemaError(
        f"the model did not call the {name} tool with its answer",
        model=model,
        usage=usage,
        raw=text[:2000],
    )


def _error_type(exc: anthropic.APIStatusError) -> str:
    """``error.type`` of an Anthropic error body (``{"type": "error", "error": {...}}``)."""
    kind = exc.type
    if kind is None and isinstance(exc.body, dict):
        inner = exc.body.get("error")
        if isinstance(inner, dict):
            kind = inner.get("type")
    return str(kind or "")


def map_anthropic_error(exc: Exception, *, api_key_env: str, model: str) -> LLMError:
    """Convert what the SDK raised into the matching ``LLMError``.

    Most specific first: timeouts before other connection errors; rate limits, auth,
    billing, context length and unknown models before other statuses. ``overloaded_error``
    (529) and 5xx are ``LLMAPIError`` with their status, which recovery retries with
    backoff (transient).
    """

    def statuses(exc: anthropic.APIStatusError) -> LLMError:
        status = exc.status_code
        kind = _error_type(exc)
        message = str(exc.api_message or exc.message)
        reply = ErrorReply(_API, status, message, exc.body, exc, model)
        if status in (401, 403) or kind in ("authentication_error", "permission_error"):
            return reply.key_rejected(api_key_env, f"HTTP {status} {kind}")
        if status == 402 or kind == "billing_error" or _CREDIT.search(message):
            return LLMBudgetExceededError(
                f"the Anthropic account is out of credit: {message}",
                code="insufficient_quota",
                cause=exc,
                model=model,
            )
        if status == 429 or kind == "rate_limit_error":
            return reply.rate_limited(retry_after_seconds(exc.response.headers))
        if status == 413 or (status == 400 and _CONTEXT.search(message)):
            return reply.too_long()
        if status == 404:
            return reply.unknown_model("Anthropic model", " (or --model)")
        overloaded = status == 529 or kind == "overloaded_error"
        return reply.failure(
            f"HTTP {status} {kind} from {_API}", code="overloaded" if overloaded else None
        )

    return map_sdk_error(
        exc,
        require_sdk(),
        _API,
        model,
        statuses,
        bad_response="Anthropic API error",
        code="bad_response",
    )


class AnthropicAdapter(SDKAdapter["anthropic.AsyncAnthropic"]):
    """Messages API adapter on the ``anthropic`` SDK; takes the options of every SDK
    adapter (``SDKAdapter``). ``client`` is an ``anthropic.AsyncAnthropic``; ``base_url``
    ``None`` is Anthropic's (or ``$ANTHROPIC_BASE_URL``), under which the SDK posts to
    ``/v1/messages``.
    """

    name = "anthropic"
    profile = ANTHROPIC
    default_key_env = DEFAULT_KEY_ENV
    key_name = "an Anthropic API key"
    require_sdk = staticmethod(require_sdk)

    def connect(
        self, key: str, base_url: str | None, timeout_seconds: float, max_concurrency: int
    ) -> anthropic.AsyncAnthropic:
        sdk = require_sdk()
        client: anthropic.AsyncAnthropic = sdk.AsyncAnthropic(
            api_key=key,
            base_url=base_url or None,
            max_retries=0,
            timeout=httpx2.Timeout(timeout_seconds, connect=self.connect_timeout_seconds),
            http_client=sdk_http_client(max_concurrency, sdk.DefaultAsyncHttpxClient),
        )
        return client

    def params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` that ask for ``request``."""
        settings = request.settings
        params: dict[str, Any] = {
            "model": settings.model,
            "max_tokens": settings.max_output_tokens,
            "messages": messages(request.history, request.input, request.messages),
            "timeout": httpx2.Timeout(
                settings.timeout_seconds, connect=self.connect_timeout_seconds
            ),
        }
        if request.instructions:
            params["system"] = request.instructions
        if request.tools is not None:
            params["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in request.tools
            ]
            params["tool_choice"] = _TOOL_CHOICE[request.tool_choice]
        else:
            schema = schema_of(self, request)
            name = answer_tool(schema)
            params["tools"] = [
                {
                    "name": name,
                    "description": (
                        f"Give your answer as the input of this tool: a {schema.__name__} "
                        "that matches the schema exactly."
                    ),
                    "input_schema": constrain(input_schema(schema), request.enums),
                }
            ]
            params["tool_choice"] = {"type": "tool", "name": name}
        return params

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        settings = request.settings
        self.require_window(request)
        params = self.params(request)
        try:
            message = await self.client.messages.create(**params)
        except Exception as exc:
            raise map_anthropic_error(
                exc, api_key_env=self.api_key_env, model=settings.model
            ) from exc
        return self.answer(request, message)

    def answer(self, request: ModelRequest, message: Message) -> AdapterResponse:
        """The checked, parsed answer of one Messages API response."""
        model = request.settings.model
        problem = malformed(message)
        if problem is not None:  # status 200, but not an answer: the gateway's or API's fault
            raise LLMAPIError(
                f"malformed answer from the Messages API: {problem} (expected a message "
                "with content blocks and usage)",
                code="malformed_answer",
                status_code=200,
                model=model,
            )
        usage = usage_of(message)
        check_stop(message, usage, model)
        return self.respond(
            request,
            usage,
            lambda: tool_calls(message),
            lambda schema: structured(schema, message, usage, model),
            response_id=message.id,
            model=str(message.model or model),
        )

    async def aclose(self) -> None:
        """Close the SDK client's connections (call on the loop that used it)."""
        await self.client.close()
