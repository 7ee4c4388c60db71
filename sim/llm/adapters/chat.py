"""The ``chat`` provider: any OpenAI-compatible chat-completions server.

One adapter, many endpoints (vLLM, Ollama, llama.cpp, SGLang, Gemini's OpenAI endpoint):
only ``base_url`` and ``api_key_env`` differ. The schema goes as ``response_format``
json_schema; these servers keep no chains, so the window is always sent as messages
(the engine keeps it in the world's response store) and there is nothing to delete.
Checks, in order: ``finish_reason == "length"`` -> ``LLMIncompleteError``; a refusal ->
``LLMRefusalError``; invalid JSON for the schema -> ``LLMSchemaError``.
"""

from __future__ import annotations

from typing import Any

import openai
import orjson
from pydantic import BaseModel

from sim.llm.adapters._openai_common import (
    ClientPool,
    build_pool,
    post_json,
    request_timeout,
    strict_schema,
    validate_text,
)
from sim.llm.adapters._openai_errors import map_openai_error
from sim.llm.errors import LLMAPIError, LLMIncompleteError, LLMRefusalError
from sim.llm.tools import FunctionCall, ToolCalls, parse_arguments, schema_of
from sim.llm.types import AdapterResponse, CallSettings, Exchange, ModelRequest, Usage

Json = dict[str, Any]


def _usage(data: Json) -> Usage:
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return Usage(
        input_tokens=int(usage.get("prompt_tokens") or 0),
        output_tokens=int(usage.get("completion_tokens") or 0),
        cached_input_tokens=int(details.get("cached_tokens") or 0),
    )


def _messages(
    instructions: str, history: tuple[Exchange, ...], input_data: str
) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}]
    for exchange in history:
        messages.append({"role": "user", "content": exchange.input})
        messages.append({"role": "assistant", "content": exchange.output})
    messages.append({"role": "user", "content": input_data})
    return messages


def _tool_calls(message: Json) -> ToolCalls:
    """The function calls (and any text) of a tool-calling message."""
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        name = str(function.get("name") or "")
        calls.append(
            FunctionCall(
                name=name,
                arguments=parse_arguments(name, function.get("arguments")),
                call_id=str(call.get("id") or ""),
            )
        )
    return ToolCalls(calls=calls, content=message.get("content") or None)


class ChatAdapter:
    """Chat-completions adapter for OpenAI-compatible servers.

    Args:
        client: an ``openai.AsyncOpenAI`` to use; built from the other arguments if omitted.
        base_url: the server's ``/v1`` URL.
        api_key_env: the environment variable holding the key; when ``base_url`` points at a
            local server the key may be unset.
        timeout_seconds: default total timeout; each call uses its settings' timeout.
        connect_timeout_seconds: connect timeout.
        max_concurrency: calls in flight to size the HTTP connection pools for.
    """

    name = "chat"

    def __init__(
        self,
        client: openai.AsyncOpenAI | None = None,
        *,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_seconds: float = 60.0,
        connect_timeout_seconds: float = 10.0,
        max_concurrency: int = 64,
    ) -> None:
        self.api_key_env = api_key_env
        self.connect_timeout_seconds = connect_timeout_seconds
        local = bool(base_url) and any(
            host in str(base_url) for host in ("127.0.0.1", "localhost", "[::1]")
        )
        self.pool = (
            ClientPool([client])
            if client is not None
            else build_pool(
                base_url=base_url,
                api_key_env=api_key_env,
                timeout_seconds=timeout_seconds,
                connect_timeout_seconds=connect_timeout_seconds,
                max_concurrency=max_concurrency,
                require_key=not local,
            )
        )
        #: the (first) SDK client, for direct use
        self.client = self.pool.first

    async def _create(self, settings: CallSettings, body: Json, **params: Any) -> Json:
        """One ``POST /chat/completions``; returns the completion as plain JSON.

        As in the openai adapter, the body is serialized once with orjson and posted
        through the SDK's ``post``, and the raw body is read directly: the SDK's param
        transformation and typed models cost more CPU per call than everything else.
        """
        payload = {
            "model": settings.model,
            "temperature": settings.temperature,
            "max_completion_tokens": settings.max_output_tokens,
            **params,
            **body,
        }
        try:
            timeout = request_timeout(settings, self.connect_timeout_seconds)
            raw = await post_json(self.pool, "/chat/completions", payload, timeout)
            data = orjson.loads(raw)
        except openai.OpenAIError as exc:
            raise map_openai_error(exc, api_key_env=self.api_key_env, model=settings.model) from exc
        except orjson.JSONDecodeError as exc:
            raise LLMAPIError(
                f"the server sent a body that is not JSON: {exc}", code="bad_response", cause=exc
            ) from exc
        if not isinstance(data, dict):
            raise LLMAPIError("the server sent an unexpected body", code="bad_response")
        return data

    @staticmethod
    def _message(data: Json, usage: Usage, model: str) -> Json:
        choices = data.get("choices") or []
        if not choices:
            raise LLMIncompleteError(
                "the server returned no choices", reason="empty", model=model, usage=usage
            )
        choice = choices[0]
        if choice.get("finish_reason") == "length":
            raise LLMIncompleteError(
                "the answer was cut short (max_output_tokens)",
                reason="max_output_tokens",
                model=model,
                usage=usage,
            )
        message: Json = choice.get("message") or {}
        refusal = message.get("refusal")
        if refusal:
            raise LLMRefusalError(
                f"the model refused: {refusal}",
                refusal_message=str(refusal),
                model=model,
                usage=usage,
            )
        return message

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        """One ``POST /chat/completions``: a strict JSON-schema answer, or tool calls."""
        settings = request.settings
        messages = _messages(request.instructions, request.history, request.input)
        if request.tools is not None:
            data = await self._create(
                settings,
                {"tools": [tool.openai_chat() for tool in request.tools]},
                messages=messages,
                tool_choice="required",
            )
        else:
            schema = schema_of(self, request)
            data = await self._create(
                settings,
                {
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {
                            "name": schema.__name__,
                            "schema": strict_schema(schema),
                            "strict": True,
                        },
                    },
                },
                messages=messages,
            )
        usage = _usage(data)
        message = self._message(data, usage, settings.model)
        parsed: BaseModel
        if request.tools is not None:
            parsed = _tool_calls(message)
            raw = parsed.dump()
            finish = "tool_calls" if parsed.calls else "stop"
        else:
            raw = str(message.get("content") or "")
            parsed = validate_text(schema, raw, usage, settings.model)
            finish = "stop"
        return AdapterResponse(
            parsed=parsed,
            response_id=str(data.get("id") or ""),
            usage=usage,
            model=str(data.get("model") or settings.model),
            finish_reason=finish,
            raw=raw,
            provider=self.name,
        )

    async def delete_response(self, response_id: str) -> None:
        """Chat servers store nothing; the engine's store drops its own copy."""

    async def aclose(self) -> None:
        """Close the SDK client's connections (call on the loop that used them)."""
        await self.pool.aclose()
