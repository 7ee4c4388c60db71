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

from typing import Any

import openai
from pydantic import BaseModel

from sim.llm.adapters._openai_common import (
    build_client,
    request_timeout,
    strict_schema,
    valid_settings,
    validate_text,
)
from sim.llm.adapters._openai_errors import map_openai_error
from sim.llm.errors import LLMAPIError, LLMIncompleteError, LLMRefusalError
from sim.llm.tools import (
    FunctionCall,
    ToolCallResponse,
    ToolCalls,
    ToolDeclaration,
    parse_arguments,
)
from sim.llm.types import AdapterResponse, CallSettings, Exchange, Usage


def _usage(response: Any) -> Usage:
    usage = getattr(response, "usage", None)
    if usage is None:
        return Usage()
    details = getattr(usage, "input_tokens_details", None)
    cached = getattr(details, "cached_tokens", 0) if details is not None else 0
    return Usage(
        input_tokens=int(usage.input_tokens or 0),
        output_tokens=int(usage.output_tokens or 0),
        cached_input_tokens=int(cached or 0),
    )


def _input_items(history: tuple[Exchange, ...], input_data: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
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
        store: bool = False,
        **_: Any,
    ) -> None:
        self.api_key_env = api_key_env
        self.connect_timeout_seconds = connect_timeout_seconds
        self.store = store
        self.client = client or build_client(
            base_url=base_url, api_key_env=api_key_env, timeout_seconds=timeout_seconds,
            connect_timeout_seconds=connect_timeout_seconds,
        )

    async def _create(self, settings: CallSettings, **params: Any) -> Any:
        try:
            return await self.client.responses.create(
                model=settings.model,
                temperature=settings.temperature,
                max_output_tokens=settings.max_output_tokens,
                store=self.store,
                timeout=request_timeout(settings, self.connect_timeout_seconds),
                **params,
            )
        except openai.OpenAIError as exc:
            raise map_openai_error(
                exc, api_key_env=self.api_key_env, model=settings.model
            ) from exc

    @staticmethod
    def _check(response: Any, usage: Usage, context: dict[str, Any]) -> None:
        """Incomplete, failed and refused answers, in that order."""
        context = {**context, "usage": usage, "response_id": response.id}
        if response.status == "incomplete":
            details = response.incomplete_details
            reason = str(getattr(details, "reason", "") or "unknown")
            raise LLMIncompleteError(
                f"the answer was cut short ({reason})", reason=reason, context=context
            )
        if response.status == "failed":
            error = response.error
            raise LLMAPIError(
                f"the response failed: {getattr(error, 'message', '')}",
                code=str(getattr(error, "code", "") or "response_failed"), context=context,
            )
        for item in response.output or ():
            if item.type != "message":
                continue
            for content in item.content or ():
                if content.type == "refusal":
                    raise LLMRefusalError(
                        f"the model refused: {content.refusal}",
                        refusal_message=str(content.refusal), context=context,
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
        params: dict[str, Any] = {
            "instructions": instructions,
            "input": _input_items(history, input_data),
            "text": {"format": {"type": "json_schema", "name": schema.__name__,
                                "schema": strict_schema(schema), "strict": True}},
        }
        if previous_response_id:
            params["previous_response_id"] = previous_response_id
        response = await self._create(settings, **params)
        usage = _usage(response)
        context = {"model": settings.model}
        self._check(response, usage, context)
        text = response.output_text
        parsed = validate_text(schema, text, usage, {**context, "response_id": response.id})
        return AdapterResponse(
            parsed=parsed, response_id=response.id, usage=usage,
            model=str(response.model or settings.model), finish_reason="stop", raw=text,
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
        response = await self._create(
            settings,
            instructions=instructions,
            input=_input_items(history, input_data),
            tools=[tool.openai_responses() for tool in tools],
            tool_choice="required",
        )
        usage = _usage(response)
        self._check(response, usage, {"model": settings.model})
        calls: list[FunctionCall] = []
        for item in response.output or ():
            if item.type == "function_call":
                calls.append(FunctionCall(
                    name=item.name, arguments=parse_arguments(item.name, item.arguments),
                    call_id=str(item.call_id or ""),
                ))
        result = ToolCalls(calls=calls, content=response.output_text or None)
        return AdapterResponse(
            parsed=result, response_id=response.id, usage=usage,
            model=str(response.model or settings.model),
            finish_reason="tool_calls" if calls else "stop", raw=result.dump(),
            metadata={"provider": self.name},
        )

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
        await self.client.close()

    def validate_config(self, settings: CallSettings) -> bool:
        return valid_settings(settings)
