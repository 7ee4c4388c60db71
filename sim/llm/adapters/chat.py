"""The ``chat`` provider: any OpenAI-compatible chat-completions server.

One adapter, many endpoints (vLLM, Ollama, llama.cpp, SGLang, Gemini's OpenAI endpoint):
only ``base_url`` and ``api_key_env`` differ. The schema goes in the call's
``structured_output`` form (``_structured``: ``auto`` finds the one the server takes); the
output cap goes as ``max_completion_tokens`` and, to servers other than OpenAI's own, also
as ``max_tokens`` (llama-cpp-python and older servers read only that). These servers keep no
chains, so the window is always sent as messages
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
    valid_settings,
    validate_text,
)
from sim.llm.adapters._openai_errors import map_openai_error
from sim.llm.adapters._streaming import ChatAssembler, StreamTimeouts, post_stream
from sim.llm.adapters._structured import (
    MODES,
    FormSelector,
    FormSwitch,
    answer_text,
    instructions_for,
    rejects_form,
    request_fields,
)
from sim.llm.errors import (
    LLMAPIError,
    LLMConfigurationError,
    LLMIncompleteError,
    LLMRefusalError,
)
from sim.llm.tools import (
    FunctionCall,
    ToolCallResponse,
    ToolCalls,
    ToolDeclaration,
    parse_arguments,
)
from sim.llm.types import AdapterResponse, CallSettings, Exchange, StructuredOutput, Usage

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


def _mode(value: str) -> StructuredOutput:
    if value not in MODES:
        raise LLMConfigurationError(
            f"unknown structured_output {value!r}; expected one of: {', '.join(MODES)}"
        )
    return value


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
        **_: Any,
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
        endpoint = str(base_url or self.client.base_url)
        #: ``auto`` structured output: the form this endpoint takes, found once per run
        self.forms = FormSelector(endpoint)
        #: OpenAI's own API refuses ``max_tokens`` for its reasoning models; every other
        #: server gets the cap under both names
        self.legacy_max_tokens = "api.openai.com" not in endpoint

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
            **({"max_tokens": settings.max_output_tokens} if self.legacy_max_tokens else {}),
            **params,
            **body,
        }
        try:
            if settings.stream:
                return await post_stream(
                    self.pool,
                    "/chat/completions",
                    {**payload, "stream_options": {"include_usage": True}},
                    ChatAssembler(),
                    StreamTimeouts(
                        settings.timeout_seconds,
                        settings.first_token_timeout_seconds,
                        settings.idle_timeout_seconds,
                    ),
                    connect_timeout_seconds=self.connect_timeout_seconds,
                    model=settings.model,
                )
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
    def _message(data: Json, usage: Usage, context: dict[str, Any]) -> Json:
        context = {**context, "usage": usage, "response_id": data.get("id")}
        choices = data.get("choices") or []
        if not choices:
            raise LLMIncompleteError(
                "the server returned no choices", reason="empty", context=context
            )
        choice = choices[0]
        if choice.get("finish_reason") == "length":
            raise LLMIncompleteError(
                "the answer was cut short (max_output_tokens)",
                reason="max_output_tokens",
                context=context,
            )
        message: Json = choice.get("message") or {}
        refusal = message.get("refusal")
        if refusal:
            raise LLMRefusalError(
                f"the model refused: {refusal}",
                refusal_message=str(refusal),
                context=context,
            )
        return message

    async def execute(
        self,
        instructions: str,
        input_data: str,
        schema: type[BaseModel],
        previous_response_id: str | None = None,
        settings: CallSettings | None = None,
        history: tuple[Exchange, ...] = (),
    ) -> AdapterResponse:
        settings = settings or CallSettings()
        mode = _mode(settings.structured_output)
        name = schema.__name__
        json_schema = strict_schema(schema)
        form = self.forms.form(mode)
        switched: FormSwitch | None = None
        while True:
            try:
                data = await self._create(
                    settings,
                    request_fields(form, name, json_schema),
                    messages=_messages(
                        instructions_for(form, instructions, json_schema), history, input_data
                    ),
                )
                break
            except LLMAPIError as exc:
                if mode != "auto" or not rejects_form(exc, form):
                    raise
                switched = self.forms.switch(form, exc) or switched
                if self.forms.current == form:  # no form left to try
                    raise
                form = self.forms.current
        usage = _usage(data)
        cid = str(data.get("id") or "")
        context = {"model": settings.model}
        message = self._message(data, usage, context)
        text = answer_text(form, message)
        parsed = validate_text(schema, text, usage, {**context, "response_id": cid})
        metadata: dict[str, Any] = {"provider": self.name, "structured_output": form}
        if switched is not None:
            metadata["structured_output_switch"] = switched.note()
        return AdapterResponse(
            parsed=parsed,
            response_id=cid,
            usage=usage,
            model=str(data.get("model") or settings.model),
            finish_reason="stop",
            raw=text,
            metadata=metadata,
        )

    async def execute_tools(
        self,
        instructions: str,
        input_data: str,
        tools: tuple[ToolDeclaration, ...],
        settings: CallSettings | None = None,
        history: tuple[Exchange, ...] = (),
    ) -> ToolCallResponse:
        settings = settings or CallSettings()
        data = await self._create(
            settings,
            {
                "tools": [tool.openai_chat() for tool in tools],
            },
            messages=_messages(instructions, history, input_data),
            tool_choice="required",
        )
        usage = _usage(data)
        message = self._message(data, usage, {"model": settings.model})
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
        result = ToolCalls(calls=calls, content=message.get("content") or None)
        return AdapterResponse(
            parsed=result,
            response_id=str(data.get("id") or ""),
            usage=usage,
            model=str(data.get("model") or settings.model),
            finish_reason="tool_calls" if calls else "stop",
            raw=result.dump(),
            metadata={"provider": self.name},
        )

    async def delete_response(self, response_id: str) -> None:
        """Chat servers store nothing; the engine's store drops its own copy."""

    async def aclose(self) -> None:
        """Close the SDK client's connections (call on the loop that used them)."""
        await self.pool.aclose()

    def validate_config(self, settings: CallSettings) -> bool:
        return valid_settings(settings)
