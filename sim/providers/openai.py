"""The ``openai`` provider: OpenAI's Responses API.

The schema goes in the call's ``structured_output`` form, as for ``chat``
(``_structured``): a strict ``json_schema`` text format (``auto`` starts there), a
``json_object`` text format with the schema, a forced function call, or the schema in the
instructions; ``auto`` moves on to the next form when the server refuses one (HTTP 400,
422 or 500 naming ``format``, as a Responses bridge in front of llama-cpp-python answers),
or when the probing call's complete answer is not of the schema's shape (the bridge took
the form and dropped the schema, as llama-stack 0.7.3 does with ``json_object``).
The instructions are re-sent with every call. The answer is checked here, in this
order: ``status == "incomplete"`` -> ``LLMIncompleteError`` (never re-asked as a schema
error: a truncated answer re-asked burns tokens); refusal content -> ``LLMRefusalError``;
``model_validate_json`` of the answer's JSON text -> ``LLMSchemaError``. Every failure
carries the attempt's usage in ``error.usage`` so recovery and the budget can count it.

Chains: in ``window`` mode the window's exchanges are sent as input items and nothing is
stored server-side (``store=False``); in ``server`` mode responses are stored and chained
with ``previous_response_id``, and evicted ones are deleted after commit. Servers that
say they do this and do not are caught (``ChainCheck``): a chained call whose input
tokens do not cover the previous exchange (made earlier in this run) means the server
ignored ``previous_response_id``, and the call fails with a configuration error that
names ``chain_mode = "window"`` (the tick stops; nothing is committed); a server that
reports no usage cannot be checked, and says so once. A deletion answered 404 for a
response this run made is reported (``response_missing``), not taken as done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import TYPE_CHECKING, Unpack

import orjson

from sim.llm.errors import LLMAPIError, LLMConfigurationError, LLMError, LLMIncompleteError
from sim.llm.tools import LLMMessage, ToolCalls, response_json, schema_of, wire_call
from sim.llm.types import AdapterResponse, Exchange, ModelRequest, Usage
from sim.providers._adapter_common import refused, window_turns
from sim.providers._openai_common import responses_usage, strict_schema, validate_text
from sim.providers._openai_errors import failures_or_odd, map_openai_error, post_failures
from sim.providers._openai_family import FamilyOptions, Json, OpenAIFamilyAdapter
from sim.providers._streaming import ResponsesAssembler
from sim.providers._structured import (
    Form,
    checked_mode,
    fits_shape,
    instructions_for,
    responses_fields,
    unfenced,
)
from sim.providers.profiles import OPENAI

if TYPE_CHECKING:
    import openai


def _output_text(data: Json) -> str:
    """All ``output_text`` parts of all messages, joined (the SDK's ``output_text``)."""
    return "".join(
        str(part.get("text") or "")
        for item in data.get("output") or ()
        if item.get("type") == "message"
        for part in item.get("content") or ()
        if part.get("type") == "output_text"
    )


def _input_items(
    history: tuple[Exchange, ...], input_data: str, conversation: tuple[LLMMessage, ...] = ()
) -> list[Json]:
    items = window_turns(history, input_data)
    for message in conversation:  # a tool conversation: function_call / _output items
        call, answer = message.function_call, message.function_response
        if message.content and answer is None:
            role = "assistant" if message.role == "assistant" else "user"
            items.append({"role": role, "content": message.content})
        if call is not None:
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.call_id,
                    "name": call.name,
                    "arguments": orjson.dumps(call.arguments).decode(),
                }
            )
        if answer is not None:
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": answer.call_id,
                    "output": response_json(answer),
                }
            )
    return items


def _check(data: Json, usage: Usage, model: str) -> None:
    """Incomplete, failed and refused answers, in that order."""
    status = data.get("status")
    if status == "incomplete":
        reason = str((data.get("incomplete_details") or {}).get("reason") or "unknown")
        raise LLMIncompleteError(
            f"the answer was cut short ({reason})", reason=reason, model=model, usage=usage
        )
    if status == "failed":
        error = data.get("error") or {}
        raise LLMAPIError(
            f"the response failed: {error.get('message', '')}",
            code=str(error.get("code") or "response_failed"),
            model=model,
            usage=usage,
        )
    for item in data.get("output") or ():
        if item.get("type") != "message":
            continue
        for content in item.get("content") or ():
            if content.get("type") == "refusal":
                refusal = str(content.get("refusal") or "")
                raise refused(refusal, usage, model)


def _answer_text(form: Form, data: Json) -> str:
    """The JSON text of the answer: the forced call's arguments for ``tool`` (else the
    text), the text without a code fence for ``prompt``."""
    if form == "tool":
        for item in data.get("output") or ():
            if item.get("type") == "function_call" and item.get("arguments"):
                arguments = item["arguments"]
                return arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    text = _output_text(data)
    return unfenced(text) if form == "prompt" else text


def _tool_calls(data: Json) -> ToolCalls:
    """The function calls (and any text) of a tool-calling answer."""
    calls = [
        wire_call(item.get("name"), item.get("arguments"), item.get("call_id"))
        for item in data.get("output") or ()
        if item.get("type") == "function_call"
    ]
    return ToolCalls(calls=calls, content=_output_text(data) or None)


#: a response id that may go in a URL path
_ID = re.compile(r"[A-Za-z0-9_-]{1,256}")
#: the most responses of this run whose sizes are kept for ``ChainCheck`` (the oldest go)
_KEPT_SIZES = 100_000


class ChainCheck:
    """Whether a server keeps the chains it is asked to (``server`` chain mode).

    Remembers each stored response's input and output tokens; a call chained on one of
    them must have read at least that many input tokens (the earlier exchange, and then
    its own input). A response made in an earlier run is looked up at the server
    (``GET /responses/{id}``: its usage) until one chained call has been seen covered,
    at most ``MAX_LOOKUPS`` times a run.

    Args:
        endpoint: the server's URL, named in messages.
    """

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.sizes: dict[str, tuple[int, int]] = {}
        #: the responses this run made and has not deleted (insertion-ordered)
        self.created: dict[str, None] = {}
        self.said_unknown = False
        #: a chained call was seen to cover its previous exchange: no more lookups
        self.verified = False
        self.lookups = 0

    MAX_LOOKUPS = 3

    def wants(self, previous: str | None) -> bool:
        """Whether to look ``previous`` up at the server before checking a call on it
        (a yes counts as one of the run's lookups)."""
        wanted = (
            previous is not None
            and _ID.fullmatch(previous) is not None  # read from the world: untrusted
            and previous not in self.sizes
            and not self.verified
            and self.lookups < self.MAX_LOOKUPS
        )
        self.lookups += wanted
        return wanted

    def learn(self, response_id: str, usage: Usage | None) -> None:
        """A looked-up response's usage (``None``: the lookup failed)."""
        if usage is not None and (usage.input_tokens > 0 or usage.output_tokens > 0):
            self.sizes[response_id] = (usage.input_tokens, usage.output_tokens)

    def made(self, response_id: str) -> bool:
        """Whether this run made (and has not deleted) ``response_id``."""
        return response_id in self.created

    def forget(self, response_id: str) -> None:
        """Drop a deleted response."""
        self.sizes.pop(response_id, None)
        self.created.pop(response_id, None)

    def check(self, previous: str | None, response_id: str, usage: Usage) -> str | None:
        """Check one stored answer; returns a note to show once, if any.

        Raises:
            LLMConfigurationError: the server ignored ``previous``.
        """
        reported = usage.input_tokens > 0 or usage.output_tokens > 0
        before = self.sizes.get(previous) if previous else None
        if response_id:
            self.created[response_id] = None
            if len(self.created) > _KEPT_SIZES:
                del self.created[next(iter(self.created))]
        if response_id and reported:
            self.sizes[response_id] = (usage.input_tokens, usage.output_tokens)
            if len(self.sizes) > _KEPT_SIZES:
                del self.sizes[next(iter(self.sizes))]
        if previous is None:
            return None
        if not reported:
            if self.said_unknown:
                return None
            self.said_unknown = True
            return (
                f"chains: {self.endpoint} reports no token usage, so whether it keeps "
                "chains (previous_response_id) cannot be told; if answers forget earlier "
                'ticks, set [llm] chain_mode = "window"'
            )
        if before is not None and usage.input_tokens < sum(before):
            raise LLMConfigurationError(
                f"{self.endpoint} ignores previous_response_id: a chained call read "
                f"{usage.input_tokens} input tokens, fewer than the {sum(before)} of the "
                "exchange it continues, so the server keeps no chains and the model does "
                'not see its earlier ticks. Set [llm] chain_mode = "window" (the engine '
                "then sends the window itself)"
            )
        if before is not None:
            self.verified = True
        return None


class OpenAIAdapter(OpenAIFamilyAdapter):
    """OpenAI Responses API adapter.

    Args:
        client, base_url, api_key_env, timeout_seconds, connect_timeout_seconds,
            max_concurrency: as for every adapter of the family (``OpenAIFamilyAdapter``).
        store: keep responses server-side (``server`` chain mode).
    """

    name = "openai"
    profile = OPENAI
    path = "/responses"
    schema_field = "format"

    def __init__(
        self,
        client: openai.AsyncOpenAI | None = None,
        *,
        store: bool = False,
        **options: Unpack[FamilyOptions],
    ) -> None:
        super().__init__(client, **options)
        self.store = store
        #: what server chains are checked against (``store``: ``server`` mode)
        self.chains = ChainCheck(self.base_url.rstrip("/"))

    def assembler(self) -> ResponsesAssembler:
        return ResponsesAssembler()

    def body(self, request: ModelRequest, form: Form | None = None) -> Json:
        """The schema in ``form`` (default: the endpoint's current one for the call's
        setting), or the tools with a call required."""
        settings = request.settings
        body: Json = {
            "model": settings.model,
            "temperature": settings.temperature,
            "max_output_tokens": settings.max_output_tokens,
            "store": self.store,
            "instructions": request.instructions,
            "input": _input_items(request.history, request.input, request.messages),
        }
        if request.tools is not None:
            body["tools"] = [tool.openai_responses() for tool in request.tools]
            body["tool_choice"] = request.tool_choice
        else:
            schema = schema_of(self, request)
            form = form or self.forms.form(checked_mode(settings.structured_output))
            json_schema = strict_schema(
                schema, request.enums, lengths=self.sent_lengths, grammar=self.grammar
            )
            body.update(responses_fields(form, schema.__name__, json_schema))
            body["instructions"] = instructions_for(form, request.instructions, json_schema)
        if request.previous_response_id:
            body["previous_response_id"] = request.previous_response_id
        return body

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        """One call; with ``auto``, the form is settled as for ``chat``
        (``_structured.FormSelector.send``)."""
        if request.tools is not None:
            return await super().execute(request)
        mode = checked_mode(request.settings.structured_output)

        answered: list[str] = []

        async def post(form: Form) -> Json:
            data = await self.post(request, self.body(request, form))
            answered.append(str(data.get("id") or ""))
            return data

        def applied(data: Json, form: Form) -> bool | None:
            """For ``json_object_schema`` (no Responses API of its own: a bridge's),
            whether a complete answer has the schema's shape (``_structured``: a server
            that took the form and dropped the schema). The other forms are taken as
            applied, as before."""
            if form != "json_object_schema":
                return True
            if data.get("status") != "completed":
                return None
            schema = strict_schema(schema_of(self, request), request.enums, lengths=False)
            return fits_shape(_answer_text(form, data), schema)

        data, form, _ = await self.forms.send(
            mode, post, probe=request.batch is None, applied=applied
        )
        for misfit in answered[:-1]:  # stored answers of forms the server dropped
            await self._discard(misfit)
        try:
            response = await self.answer(request, data, form)
        except LLMError as exc:
            exc.notice = "\n".join(self.forms.untold()) or None
            raise
        notes: list[str] = []
        if self.store:
            previous = request.previous_response_id
            if self.chains.wants(previous):
                assert previous is not None
                self.chains.learn(previous, await self._usage_of(previous))
            try:
                chain_note = self.chains.check(
                    request.previous_response_id, response.response_id, response.usage
                )
            except LLMConfigurationError as exc:
                exc.usage = response.usage
                await self._discard(response.response_id)
                raise
            notes += [chain_note] if chain_note is not None else []
        notes = self.forms.untold() + notes
        if not notes:
            return response
        return dataclasses.replace(response, notice="\n".join(notes))

    async def answer(
        self, request: ModelRequest, data: Json, form: Form = "json_schema"
    ) -> AdapterResponse:
        settings = request.settings
        usage = responses_usage(data)
        rid = str(data.get("id") or "")
        try:
            _check(data, usage, settings.model)
            return self.respond(
                request,
                usage,
                lambda: _tool_calls(data),
                lambda schema: validate_text(
                    schema, _answer_text(form, data), usage, settings.model
                ),
                response_id=rid,
                model=str(data.get("model") or settings.model),
                structured_output=form,
            )
        except LLMError:
            await self._discard(rid)
            raise

    async def _usage_of(self, response_id: str) -> Usage | None:
        """A stored response's usage, from the server (``None``: not to be had)."""
        try:
            data = await self.api.json(
                "GET", f"/responses/{response_id}", timeout=self.connect_timeout_seconds
            )
        except failures_or_odd():
            return None
        return responses_usage(data) if isinstance(data, dict) else None

    async def _discard(self, response_id: str) -> None:
        """Delete a stored answer that failed our checks: no chain will ever point at it,
        so it can go at once (best effort; never masks the original error)."""
        if self.store and response_id:
            with contextlib.suppress(LLMError):
                await self.delete_response(response_id)

    async def delete_response(self, response_id: str) -> None:
        """Delete a stored response; a no-op when responses are not stored (``window``).
        On the calls' connections (``ServerAPI``)."""
        if not self.store:
            return
        made = self.chains.made(response_id)
        self.chains.forget(response_id)
        try:
            await self.api.json("DELETE", f"/responses/{response_id}")
        except post_failures() as exc:
            if _status(exc) != 404:
                raise map_openai_error(exc, api_key_env=self.api_key_env, model="") from exc
            if not made:
                return  # made before this run: deleted before a crash, say; gone is done
            raise LLMAPIError(
                f"{self.chains.endpoint} answered 404 to deleting response {response_id}, "
                "which it made in this run: it does not keep the responses it is asked to "
                '(chains through it are lost; set [llm] chain_mode = "window")',
                code="response_missing",
                status_code=404,
                cause=exc,
            ) from exc


def _status(exc: BaseException) -> int | None:
    """The HTTP status of a failure of either path (a route's or the SDK's), if any."""
    status = getattr(exc, "status", None)
    if status is None:
        status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None
