"""The ``openai`` provider: OpenAI's Responses API.

The schema goes as a strict ``json_schema`` text format and the instructions are re-sent
with every call. The answer is checked here, in this order: ``status == "incomplete"`` ->
``LLMIncompleteError`` (never re-asked as a schema error: a truncated answer re-asked burns
tokens); refusal content -> ``LLMRefusalError``; ``model_validate_json(output_text)``
failure -> ``LLMSchemaError``. Every failure carries the attempt's usage in
``error.context["usage"]`` so recovery can count it.

Chains: in ``window`` mode the window's exchanges are sent as input items and nothing is
stored server-side (``store=False``); in ``server`` mode responses are stored and chained
with ``previous_response_id``, and evicted ones are deleted after commit.
"""

from __future__ import annotations

import contextlib
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
from sim.llm.adapters._streaming import ResponsesAssembler, StreamTimeouts, post_stream
from sim.llm.errors import LLMAPIError, LLMError, LLMIncompleteError, LLMRefusalError
from sim.llm.tools import (
    FunctionCall,
    ToolCallResponse,
    ToolCalls,
    ToolDeclaration,
    parse_arguments,
)
from sim.llm.types import AdapterResponse, CallSettings, Exchange, Usage

Json = dict[str, Any]


def _usage(data: Json) -> Usage:
    usage = data.get("usage") or {}
    details = usage.get("input_tokens_details") or {}
    return Usage(
        input_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        cached_input_tokens=int(details.get("cached_tokens") or 0),
    )


def _output_text(data: Json) -> str:
    """All ``output_text`` parts of all messages, joined (the SDK's ``output_text``)."""
    return "".join(
        str(part.get("text") or "")
        for item in data.get("output") or ()
        if item.get("type") == "message"
        for part in item.get("content") or ()
        if part.get("type") == "output_text"
    )


def _input_items(history: tuple[Exchange, ...], input_data: str) -> list[Json]:
    items: list[Json] = []
    for exchange in history:
        items.append({"role": "user", "content": exchange.input})
        items.append({"role": "assistant", "content": exchange.output})
    items.append({"role": "user", "content": input_data})
    return items


class OpenAIAdapter:
    """OpenAI Responses API adapter.

    Args:
        client: an ``openai.AsyncOpenAI`` to use (tests hand one in); built from the other
            arguments when omitted, with SDK retries off.
        base_url: API base URL (``None``: OpenAI's).
        api_key_env: the environment variable holding the key.
        timeout_seconds: default total timeout; each call uses its settings' timeout.
        connect_timeout_seconds: connect timeout.
        max_concurrency: calls in flight to size the HTTP connection pools for.
        store: keep responses server-side (``server`` chain mode).
    """

    name = "openai"

    def __init__(
        self,
        client: openai.AsyncOpenAI | None = None,
        *,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_seconds: float = 60.0,
        connect_timeout_seconds: float = 10.0,
        max_concurrency: int = 64,
        store: bool = False,
        **_: Any,
    ) -> None:
        self.api_key_env = api_key_env
        self.connect_timeout_seconds = connect_timeout_seconds
        self.store = store
        self.pool = (
            ClientPool([client])
            if client is not None
            else build_pool(
                base_url=base_url,
                api_key_env=api_key_env,
                timeout_seconds=timeout_seconds,
                connect_timeout_seconds=connect_timeout_seconds,
                max_concurrency=max_concurrency,
            )
        )
        #: the (first) SDK client, for direct use
        self.client = self.pool.first

    async def _create(self, settings: CallSettings, body: Json) -> Json:
        """One ``POST /responses``; returns the response as plain JSON.

        The request goes through the SDK's own ``post`` (auth, headers, timeouts, and its
        errors, which ``map_openai_error`` maps) but with the body already serialized by
        orjson and the answer read as raw bytes: the SDK's per-call transformation of the
        typed params, its stdlib-JSON encoding and its construction of typed models cost
        more CPU than the rest of a call (measured), and we need only a few fields.
        """
        payload = {
            "model": settings.model,
            "temperature": settings.temperature,
            "max_output_tokens": settings.max_output_tokens,
            "store": self.store,
            **body,
        }
        try:
            if settings.stream:  # the final event carries the whole response
                return await post_stream(
                    self.pool,
                    "/responses",
                    payload,
                    ResponsesAssembler(),
                    StreamTimeouts(
                        settings.timeout_seconds,
                        settings.first_token_timeout_seconds,
                        settings.idle_timeout_seconds,
                    ),
                    connect_timeout_seconds=self.connect_timeout_seconds,
                    model=settings.model,
                )
            timeout = request_timeout(settings, self.connect_timeout_seconds)
            raw = await post_json(self.pool, "/responses", payload, timeout)
            data = orjson.loads(raw)
        except openai.OpenAIError as exc:
            raise map_openai_error(exc, api_key_env=self.api_key_env, model=settings.model) from exc
        except orjson.JSONDecodeError as exc:
            raise LLMAPIError(
                f"the provider sent a body that is not JSON: {exc}", code="bad_response", cause=exc
            ) from exc
        if not isinstance(data, dict):
            raise LLMAPIError("the provider sent an unexpected body", code="bad_response")
        return data

    @staticmethod
    def _check(data: Json, usage: Usage, context: dict[str, Any]) -> None:
        """Incomplete, failed and refused answers, in that order."""
        context = {**context, "usage": usage, "response_id": data.get("id")}
        status = data.get("status")
        if status == "incomplete":
            reason = str((data.get("incomplete_details") or {}).get("reason") or "unknown")
            raise LLMIncompleteError(
                f"the answer was cut short ({reason})", reason=reason, context=context
            )
        if status == "failed":
            error = data.get("error") or {}
            raise LLMAPIError(
                f"the response failed: {error.get('message', '')}",
                code=str(error.get("code") or "response_failed"),
                context=context,
            )
        for item in data.get("output") or ():
            if item.get("type") != "message":
                continue
            for content in item.get("content") or ():
                if content.get("type") == "refusal":
                    refusal = str(content.get("refusal") or "")
                    raise LLMRefusalError(
                        f"the model refused: {refusal}",
                        refusal_message=refusal,
                        context=context,
                    )

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
        body: Json = {
            "instructions": instructions,
            "input": _input_items(history, input_data),
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": schema.__name__,
                    "schema": strict_schema(schema),
                    "strict": True,
                }
            },
        }
        if previous_response_id:
            body["previous_response_id"] = previous_response_id
        data = await self._create(settings, body)
        usage = _usage(data)
        rid = str(data.get("id") or "")
        context = {"model": settings.model}
        try:
            self._check(data, usage, context)
            text = _output_text(data)
            parsed = validate_text(schema, text, usage, {**context, "response_id": rid})
        except LLMError:
            await self._discard(rid)
            raise
        return AdapterResponse(
            parsed=parsed,
            response_id=rid,
            usage=usage,
            model=str(data.get("model") or settings.model),
            finish_reason="stop",
            raw=text,
            metadata={"provider": self.name},
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
        body: Json = {
            "instructions": instructions,
            "input": _input_items(history, input_data),
            "tools": [tool.openai_responses() for tool in tools],
            "tool_choice": "required",
        }
        data = await self._create(settings, body)
        usage = _usage(data)
        try:
            self._check(data, usage, {"model": settings.model})
        except LLMError:
            await self._discard(str(data.get("id") or ""))
            raise
        calls: list[FunctionCall] = []
        for item in data.get("output") or ():
            if item.get("type") == "function_call":
                name = str(item.get("name") or "")
                calls.append(
                    FunctionCall(
                        name=name,
                        arguments=parse_arguments(name, item.get("arguments")),
                        call_id=str(item.get("call_id") or ""),
                    )
                )
        result = ToolCalls(calls=calls, content=_output_text(data) or None)
        return AdapterResponse(
            parsed=result,
            response_id=str(data.get("id") or ""),
            usage=usage,
            model=str(data.get("model") or settings.model),
            finish_reason="tool_calls" if calls else "stop",
            raw=result.dump(),
            metadata={"provider": self.name},
        )

    async def _discard(self, response_id: str) -> None:
        """Delete a stored answer that failed our checks: no chain will ever point at it,
        so it can go at once (best effort; never masks the original error)."""
        if self.store and response_id:
            with contextlib.suppress(LLMError):
                await self.delete_response(response_id)

    async def delete_response(self, response_id: str) -> None:
        """Delete a stored response; a no-op when responses are not stored (``window``)."""
        if not self.store:
            return
        try:
            await self.client.responses.delete(response_id)
        except openai.NotFoundError:
            return  # already gone: the goal of a deletion
        except openai.OpenAIError as exc:
            raise map_openai_error(exc, api_key_env=self.api_key_env, model="") from exc

    async def aclose(self) -> None:
        """Close the SDK client's connections (call on the loop that used them)."""
        await self.pool.aclose()

    def validate_config(self, settings: CallSettings) -> bool:
        return valid_settings(settings)
