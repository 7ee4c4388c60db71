"""A loopback stub of Anthropic's Messages API, answered by the offline model.

The route the ``anthropic`` SDK calls: ``POST /v1/messages`` (``system``, user/assistant
``messages``, ``tools`` with ``input_schema``, ``tool_choice``). A forced tool
(``tool_choice: {"type": "tool"}``) is answered with a ``tool_use`` block whose input the
offline engine wrote for that tool's ``input_schema`` (sim's structured output); ``any`` or
``auto`` with tools, with a call of one of them; no tools, with text. Bodies are Anthropic's
shape: ``{"type": "message", "content": [...], "stop_reason", "usage": {"input_tokens",
"output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"}}``, with the
cached prefix counted apart from ``input_tokens`` as Anthropic counts it. Errors are
Anthropic's: ``{"type": "error", "error": {"type": ..., "message": ...}}``.

Point the SDK at ``server.base_url`` (``sim tick --provider anthropic --base-url ...``).
Faults, latency, stats and ``ServerThread`` work as for ``StubServer``; the faults mean, in
Anthropic's terms: ``rate_limit`` 429 ``rate_limit_error`` with ``retry-after``,
``overloaded`` 529 ``overloaded_error``, ``server_error`` 500 ``api_error``, ``hang``,
``stall`` (a hang: no streams here), ``bad_gateway`` (502 with a proxy's HTML page),
``auth`` 401 ``authentication_error``, ``permission`` and ``forbidden`` 403
``permission_error``, ``model_not_found`` 404 ``not_found_error`` "model: NAME",
``bad_request`` 400 ``invalid_request_error``, ``insufficient_quota`` 400 "credit balance is too
low", ``context_length`` 400 "prompt is too long", ``malformed`` (a tool input missing half
its fields), ``refusal`` (``stop_reason: refusal``), ``incomplete`` (``stop_reason:
max_tokens``), ``unknown_tool``, ``empty`` (status 200 with ``{}``). Every fault listed in
``ANTHROPIC_FAULTS`` is performed.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from sim.testing.sdk_stub import SDKStubServer
from sim.testing.stub_model import Ask, Json, StubAnswer, split_messages, text_of
from sim.testing.stub_server import FAULTS, _HTTPError

#: the faults the stub performs: the OpenAI stub's but ``raw_newline`` (a tool's input is
#: an object here, not JSON text), and Anthropic's own
ANTHROPIC_FAULTS = (
    *(fault for fault in FAULTS if fault != "raw_newline"),
    "overloaded",
    "bad_request",
    "permission",
    "empty",
)
ROUTE = "/v1/messages"
REFUSAL_EXPLANATION = "This request was declined under the usage policy."


def anthropic_error(type_: str, message: str) -> Json:
    """An error body in Anthropic's format."""
    return {"type": "error", "error": {"type": type_, "message": message}}


def _tools(tools: Any) -> list[Json]:
    """Declared tools as the offline tool chooser reads them (name, parameters)."""
    return [
        {"name": tool.get("name"), "parameters": tool.get("input_schema") or {}}
        for tool in (tools if isinstance(tools, list) else ())
        if isinstance(tool, dict)
    ]


def _forced(request: Json) -> Json | None:
    """The tool ``tool_choice`` forces, if any."""
    choice = request.get("tool_choice")
    if not isinstance(choice, dict) or choice.get("type") != "tool":
        return None
    for tool in request.get("tools") or ():
        if isinstance(tool, dict) and tool.get("name") == choice.get("name"):
            return tool
    raise _HTTPError(
        400,
        anthropic_error(
            "invalid_request_error", f"tool_choice names an unknown tool {choice.get('name')!r}"
        ),
    )


def _tool_blocks_only(message: Any) -> bool:
    """A turn of a tool conversation holding only calls or tool answers (the stub answers
    from the conversation's opening input, as its Responses API route does)."""
    content = message.get("content") if isinstance(message, dict) else None
    return (
        isinstance(content, list)
        and bool(content)
        and all(
            isinstance(block, dict) and block.get("type") in ("tool_use", "tool_result")
            for block in content
        )
    )


def _spoiled(text: str) -> Json:
    """The answer's object with its second half of fields dropped (``malformed``)."""
    data = orjson.loads(text) if text else {}
    if not isinstance(data, dict):
        return {}
    keys = list(data)
    return {key: data[key] for key in keys[: len(keys) // 2]}


def message_body(
    mid: str, model: str, ans: StubAnswer, tool: str | None, fault: str | None
) -> Json:
    """A Messages API ``message`` for one answer (with its answer-level fault)."""
    content: list[Json] = []
    stop = "end_turn"
    if fault == "refusal":
        stop = "refusal"
    elif ans.call is not None:
        name, args = ans.call
        content.append({"type": "tool_use", "id": f"toolu_{mid[4:]}", "name": name, "input": args})
        stop = "tool_use"
    elif tool is not None:
        spoil = fault in ("malformed", "incomplete")
        data = _spoiled(ans.text) if spoil else orjson.loads(ans.text)
        content.append({"type": "tool_use", "id": f"toolu_{mid[4:]}", "name": tool, "input": data})
        stop = "tool_use"
    else:
        content.append({"type": "text", "text": ans.text})
    if fault == "incomplete":
        stop = "max_tokens"
    body: Json = {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            # Anthropic counts the cached prefix apart from input_tokens
            "input_tokens": ans.input_tokens - ans.cached_tokens,
            "output_tokens": ans.output_tokens,
            "cache_read_input_tokens": ans.cached_tokens,
            "cache_creation_input_tokens": 0,
        },
    }
    if stop == "refusal":
        body["stop_details"] = {
            "type": "refusal",
            "category": None,
            "explanation": REFUSAL_EXPLANATION,
        }
    return body


class AnthropicStubServer(SDKStubServer):
    """``StubServer`` speaking Anthropic's Messages API (same faults, plus ``overloaded``)."""

    FAULTS = ANTHROPIC_FAULTS

    def _error(self, status: int, type_: str, message: str) -> Json:
        return anthropic_error(type_, message)

    async def _route(self, method: str, path: str, request: Any) -> Json | None:
        if method != "POST" or path != ROUTE:
            return None
        if not isinstance(request, dict):
            raise _HTTPError(400, anthropic_error("invalid_request_error", "body is not an object"))
        self.log.append(request)
        self.stats.in_flight += 1
        try:
            return await self._message(request)
        finally:
            self.stats.in_flight -= 1

    def _http_fault(self, fault: str, model: str) -> str | None:
        """Anthropic's status and error type for each HTTP-level fault."""
        opts = self.options
        if fault == "rate_limit":
            headers = {} if opts.retry_after is None else {"retry-after": f"{opts.retry_after:g}"}
            raise _HTTPError(
                429,
                anthropic_error(
                    "rate_limit_error",
                    "This request would exceed the rate limit for your organization of 50 "
                    "requests per minute.",
                ),
                headers,
            )
        if fault == "overloaded":
            raise _HTTPError(529, anthropic_error("overloaded_error", "Overloaded"))
        if fault == "server_error":
            raise _HTTPError(500, anthropic_error("api_error", "Internal server error"))
        if fault == "auth":
            raise _HTTPError(401, anthropic_error("authentication_error", "invalid x-api-key"))
        if fault == "forbidden":
            raise _HTTPError(
                403,
                anthropic_error(
                    "permission_error",
                    "Your API key does not have permission to use the specified resource.",
                ),
            )
        if fault == "model_not_found":
            raise _HTTPError(404, anthropic_error("not_found_error", f"model: {model}"))
        if fault == "permission":
            raise _HTTPError(
                403,
                anthropic_error(
                    "permission_error", "Your API key does not have permission to use this model."
                ),
            )
        if fault == "bad_request":
            raise _HTTPError(
                400,
                anthropic_error(
                    "invalid_request_error", "messages: text content blocks must be non-empty"
                ),
            )
        if fault == "insufficient_quota":
            raise _HTTPError(
                400,
                anthropic_error(
                    "invalid_request_error",
                    "Your credit balance is too low to access the Anthropic API. Please go "
                    "to Plans & Billing to upgrade or purchase credits.",
                ),
            )
        if fault == "context_length":
            raise _HTTPError(
                400,
                anthropic_error(
                    "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"
                ),
            )
        return fault

    async def _message(self, request: Json) -> Json:
        model = str(request.get("model") or "stub")
        forced = _forced(request)
        fault = await self._sdk_prelude(model)
        if fault == "empty":  # status 200 and an empty object: no message at all
            return {}
        turns = [m for m in request.get("messages") or () if not _tool_blocks_only(m)]
        _, pairs, input_text = split_messages(turns)
        instructions = text_of(request.get("system") or "")
        schema = None
        tools = None
        if forced is not None:
            schema = forced.get("input_schema") or {"type": "object"}
        elif request.get("tools") and (request.get("tool_choice") or {}).get("type") != "none":
            tools = _tools(request["tools"])  # with tool_choice none: a text answer
        # malformed and incomplete answers are spoiled here, as tool input (an object)
        own = fault if fault in ("refusal", "unknown_tool") else None
        ans = self._answer(Ask(model, instructions, pairs, input_text, schema, tools, own))
        tool = str(forced.get("name")) if forced is not None else None
        return message_body(f"msg_{uuid.uuid4().hex[:24]}", model, ans, tool, fault)
