"""The ``chat`` provider: any OpenAI-compatible chat-completions server.

One adapter, many endpoints (vLLM, Ollama, llama.cpp, SGLang, Gemini's OpenAI endpoint):
only ``base_url`` and ``api_key_env`` differ. The schema goes in the call's
``structured_output`` form (``_structured``; ``auto`` finds the one the server takes); the
output cap goes as ``max_completion_tokens`` and, to servers other than OpenAI's own, also
as ``max_tokens`` (llama-cpp-python and older servers read only that). These servers keep
no chains, so the window is always sent as messages (the engine keeps it in the world's
response store) and there is nothing to delete.
Checks, in order: ``finish_reason == "length"`` -> ``LLMIncompleteError``; a refusal ->
``LLMRefusalError``; invalid JSON for the schema -> ``LLMSchemaError``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Unpack

import orjson

from sim.llm.errors import LLMError, LLMIncompleteError
from sim.llm.tools import LLMMessage, ToolCalls, response_json, schema_of, wire_call
from sim.llm.types import AdapterResponse, Exchange, ModelRequest, Usage
from sim.providers._adapter_common import refused, window_turns
from sim.providers._openai_common import chat_usage, strict_schema, validate_text
from sim.providers._openai_family import FamilyOptions, Json, OpenAIFamilyAdapter
from sim.providers._streaming import ChatAssembler
from sim.providers._structured import (
    Form,
    answer_text,
    checked_mode,
    instructions_for,
    request_fields,
)
from sim.providers.profiles import CHAT

if TYPE_CHECKING:
    import openai


def _messages(
    instructions: str,
    history: tuple[Exchange, ...],
    input_data: str,
    conversation: tuple[LLMMessage, ...] = (),
) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": instructions}, *window_turns(history, input_data)]
    for message in conversation:  # a tool conversation: calls, then the tools' answers
        call, answer = message.function_call, message.function_response
        if answer is not None:
            messages.append(
                {"role": "tool", "tool_call_id": answer.call_id, "content": response_json(answer)}
            )
        elif message.role == "assistant":
            last = messages[-1]
            if call is not None and last["role"] == "assistant" and "tool_calls" in last:
                target = last  # one assistant turn holds all the calls it made
            else:
                target = {"role": "assistant", "content": message.content}
                messages.append(target)
            if call is not None:
                target.setdefault("tool_calls", []).append(
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {
                            "name": call.name,
                            "arguments": orjson.dumps(call.arguments).decode(),
                        },
                    }
                )
        else:
            messages.append({"role": "user", "content": message.content or ""})
    return messages


def _tool_calls(message: Json) -> ToolCalls:
    """The function calls (and any text) of a tool-calling message."""
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        calls.append(wire_call(function.get("name"), function.get("arguments"), call.get("id")))
    return ToolCalls(calls=calls, content=message.get("content") or None)


def _message(data: Json, usage: Usage, model: str) -> Json:
    """The first choice's message; cut-short, empty and refused answers raise."""
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
        raise refused(str(refusal), usage, model)
    return message


class ChatAdapter(OpenAIFamilyAdapter):
    """Chat-completions adapter for OpenAI-compatible servers.

    Takes the options of every adapter of the family (``OpenAIFamilyAdapter``); when
    ``base_url`` points at this machine the key may be unset. Chat servers keep no
    responses, so there is nothing to delete: the engine's store drops its own copy.
    """

    name = "chat"
    profile = CHAT
    path = "/chat/completions"
    local_without_key = True

    def __init__(
        self,
        client: openai.AsyncOpenAI | None = None,
        *,
        seed: int | None = None,
        **options: Unpack[FamilyOptions],
    ) -> None:
        super().__init__(client, **options)
        #: sent as ``seed``: best-effort determinism on servers that take one
        self.seed = seed

    @functools.cached_property
    def legacy_max_tokens(self) -> bool:
        """Send the cap as ``max_tokens`` too: OpenAI's own API refuses it for its
        reasoning models; every other server gets the cap under both names."""
        return "api.openai.com" not in self.base_url

    def assembler(self) -> ChatAssembler:
        return ChatAssembler()

    def stream_fields(self) -> Json:
        return {"stream_options": {"include_usage": True}}

    def body(self, request: ModelRequest, form: Form | None = None) -> Json:
        """The window as messages, and the schema in ``form`` (default: the endpoint's
        current one for the call's setting) or the tools."""
        settings = request.settings
        instructions = request.instructions
        extra: Json
        if request.tools is not None:
            extra = {
                "tool_choice": request.tool_choice,
                "tools": [tool.openai_chat() for tool in request.tools],
            }
        else:
            schema = schema_of(self, request)
            form = form or self.forms.form(checked_mode(settings.structured_output))
            # only the short caps (``LOCAL_MAX_LENGTH``; none to OpenAI): llama.cpp turns a
            # long one into a grammar rule repeated that many times, refuses it and its
            # server dies (a 1,200-character narrative, measured); the engine checks every
            # length on the answer
            json_schema = strict_schema(
                schema, request.enums, lengths=self.sent_lengths, grammar=self.grammar
            )
            extra = request_fields(form, schema.__name__, json_schema)
            instructions = instructions_for(form, instructions, json_schema)
        body: Json = {
            "model": settings.model,
            "temperature": settings.temperature,
            "max_completion_tokens": settings.max_output_tokens,
            "messages": _messages(instructions, request.history, request.input, request.messages),
            **extra,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        if self.legacy_max_tokens:
            body["max_tokens"] = settings.max_output_tokens
        return body

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        """One call; with ``auto``, the endpoint's form is settled by one probing call
        while the others wait, and a server refusing a form moves the endpoint on to the
        next (``_structured.FormSelector.send``)."""
        if request.tools is not None:
            return await super().execute(request)
        mode = checked_mode(request.settings.structured_output)

        async def post(form: Form) -> Json:
            return await self.post(request, self.body(request, form))

        data, form, _ = await self.forms.send(mode, post, probe=request.batch is None)
        try:
            response = await self.answer(request, data, form)
        except LLMError as exc:
            exc.notice = "\n".join(self.forms.untold()) or None
            raise
        return dataclasses.replace(response, notice="\n".join(self.forms.untold()) or None)

    async def answer(
        self, request: ModelRequest, data: Json, form: Form = "json_schema"
    ) -> AdapterResponse:
        settings = request.settings
        usage = chat_usage(data)
        message = _message(data, usage, settings.model)
        return self.respond(
            request,
            usage,
            lambda: _tool_calls(message),
            lambda schema: validate_text(schema, answer_text(form, message), usage, settings.model),
            response_id=str(data.get("id") or ""),
            model=str(data.get("model") or settings.model),
            structured_output=form,
        )
