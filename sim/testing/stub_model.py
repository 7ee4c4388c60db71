"""The stub server's model: OpenAI-shaped bodies written by the offline engine.

Pure functions of a parsed request body; the HTTP side (``stub_server``) adds faults,
latency, storage and counters.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from sim.offline import estimate_tokens, generate, generate_tool_call

Json = dict[str, Any]
Pair = tuple[str, str]

#: faults that change the answer rather than the HTTP status
ANSWER_FAULTS = frozenset(
    {"malformed", "raw_newline", "refusal", "incomplete", "unknown_tool", "wrong_ids"}
)
REFUSAL = "I'm sorry, but I can't help with that."


def text_of(content: Any) -> str:
    """The text of a message's ``content`` (a string or a list of typed parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text") or part.get("refusal") or "")
            for part in content
            if isinstance(part, dict)
        )
    return ""


def pair_turns(turns: Iterable[tuple[str, str]], reply_role: str) -> tuple[list[Pair], str | None]:
    """(role, text) turns as (user, reply) pairs, a user turn without a reply paired with
    ""; and the last user text still waiting for its reply (``None`` when there is none)."""
    pairs: list[Pair] = []
    pending: str | None = None
    for role, text in turns:
        if role == "user":
            if pending is not None:
                pairs.append((pending, ""))
            pending = text
        elif role == reply_role and pending is not None:
            pairs.append((pending, text))
            pending = None
    return pairs, pending


def split_messages(messages: Sequence[Any]) -> tuple[str, list[Pair], str]:
    """(system text, earlier (user, assistant) pairs, the last user text) of a message list."""
    system: list[str] = []
    turns: list[tuple[str, str]] = []
    for message in messages:
        if isinstance(message, str):
            message = {"role": "user", "content": message}
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        text = text_of(message.get("content"))
        if role in ("system", "developer"):
            system.append(text)
        else:
            turns.append((str(role), text))
    pairs, pending = pair_turns(turns, "assistant")
    return "\n".join(system), pairs, pending or ""


@dataclass(slots=True)
class StubAnswer:
    """What the model produced for one request."""

    text: str
    call: tuple[str, Json] | None
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    fault: str | None


@dataclass(frozen=True, slots=True)
class Ask:
    """One request as the stub model reads it, whatever API it came in by: the model, the
    instructions, the earlier (user, answer) pairs, the input, the answer's JSON Schema or
    the tools, and an answer-level fault to apply (``ANSWER_FAULTS``)."""

    model: str
    instructions: str
    history: Sequence[Pair]
    input_text: str
    schema: Json | None = None
    tools: list[Json] | None = None
    fault: str | None = None


def _raw_newline(text: str) -> str:
    """``text`` with a raw line break opening its first string value (orjson writes
    ``"key":"value"`` with no space), as small models write one; unchanged without one."""
    at = text.find('":"')
    return text if at < 0 else f"{text[: at + 3]}\n{text[at + 3 :]}"


def wrong_ids(data: Any) -> Any:
    """``data`` (a generated answer) with its references made wrong the way small models
    make them (issue 25): an intention's ``target`` becomes ``"place"`` (and a ``wait`` a
    ``move``, so the target matters), an outcome's ``character_id`` ``"1"``, ``"2"``...,
    ``moved_to`` ``"nowhere"``, removed objects ``["a ghost"]``. The answer still fits
    the schema's types; only the ids are wrong."""
    if isinstance(data, list):
        return [wrong_ids(item) for item in data]
    if not isinstance(data, dict):
        return data
    out = {key: wrong_ids(value) for key, value in data.items()}
    if "target" in out and "action" in out:
        out["target"] = "place"
        if out["action"] == "wait":
            out["action"] = "move"
    if "moved_to" in out:
        out["moved_to"] = "nowhere"
    if "objects_removed" in out:
        out["objects_removed"] = ["a ghost"]
    outcomes = out.get("outcomes")
    if isinstance(outcomes, list):
        for n, item in enumerate(outcomes, 1):
            if isinstance(item, dict) and "character_id" in item:
                item["character_id"] = str(n)
    return out


def answer(ask: Ask, *, seed: int, cached_prefix: bool) -> StubAnswer:
    """Generate the answer to one request, with an answer-level fault applied if any."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (
        str(seed),
        ask.model,
        ask.instructions,
        ask.input_text,
        *(out for _, out in ask.history),
    ):
        digest.update(part.encode())
        digest.update(b"\x00")
    key = digest.hexdigest()
    call: tuple[str, Json] | None = None
    if ask.tools:
        name, args = generate_tool_call(
            ask.tools, ask.input_text, seed=key, history=list(ask.history)
        )
        if ask.fault == "unknown_tool":
            name = "teleport"
        call = (name, args)
        text = ""
        out_len = len(name) + len(orjson.dumps(args))
    else:
        if ask.schema is not None:
            data = generate(
                ask.schema,
                ask.input_text,
                seed=key,
                history=list(ask.history),
                instructions=ask.instructions,
            )
            if ask.fault == "wrong_ids":
                data = wrong_ids(data)
            text = orjson.dumps(data).decode()
        else:
            text = "Understood."
        if ask.fault in ("malformed", "incomplete"):
            text = text[: max(1, len(text) // 2)]
        elif ask.fault == "raw_newline":  # a small model's habit: a line break as itself
            text = _raw_newline(text)
        out_len = len(text)
    prompt = (
        estimate_tokens(ask.instructions)
        + estimate_tokens(ask.input_text)
        + sum(estimate_tokens(a) + estimate_tokens(b) for a, b in ask.history)
    )
    return StubAnswer(
        text=text,
        call=call,
        input_tokens=prompt,
        output_tokens=(out_len + 3) // 4,
        cached_tokens=estimate_tokens(ask.instructions) if cached_prefix else 0,
        fault=ask.fault,
    )


def response_body(rid: str, model: str, request: Json, ans: StubAnswer, store: bool) -> Json:
    """A Responses API ``response`` object."""
    output: list[Json] = []
    if ans.call is not None:
        name, args = ans.call
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{rid[5:]}",
                "call_id": f"call_{rid[5:]}",
                "name": name,
                "arguments": orjson.dumps(args).decode(),
                "status": "completed",
            }
        )
    else:
        part: Json = (
            {"type": "refusal", "refusal": REFUSAL}
            if ans.fault == "refusal"
            else {"type": "output_text", "text": ans.text, "annotations": []}
        )
        output.append(
            {
                "type": "message",
                "id": f"msg_{rid[5:]}",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    incomplete = ans.fault == "incomplete"
    return {
        "id": rid,
        "object": "response",
        "created_at": time.time(),
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "model": model,
        "instructions": request.get("instructions"),
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": request.get("previous_response_id"),
        "store": store,
        "temperature": request.get("temperature"),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": request.get("tools") or [],
        "top_p": 1.0,
        "usage": {
            "input_tokens": ans.input_tokens,
            "input_tokens_details": {"cached_tokens": ans.cached_tokens},
            "output_tokens": ans.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": ans.input_tokens + ans.output_tokens,
        },
    }


def chat_body(cid: str, model: str, ans: StubAnswer) -> Json:
    """A chat-completions ``chat.completion`` object."""
    message: Json = {"role": "assistant", "content": ans.text or None, "refusal": None}
    finish = "stop"
    if ans.call is not None:
        name, args = ans.call
        message["tool_calls"] = [
            {
                "id": f"call_{cid[9:]}",
                "type": "function",
                "function": {"name": name, "arguments": orjson.dumps(args).decode()},
            }
        ]
        finish = "tool_calls"
    if ans.fault == "refusal":
        message["content"] = None
        message["refusal"] = REFUSAL
    elif ans.fault == "incomplete":
        finish = "length"
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": ans.input_tokens,
            "completion_tokens": ans.output_tokens,
            "total_tokens": ans.input_tokens + ans.output_tokens,
            "prompt_tokens_details": {"cached_tokens": ans.cached_tokens},
        },
    }


def _pieces(text: str, size: int = 12) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def chat_chunks(body: Json, include_usage: bool) -> list[tuple[str | None, Json]]:
    """A ``chat.completion`` as the ``chat.completion.chunk`` events that stream it."""
    choice = body["choices"][0]
    message = choice["message"]
    base = {"id": body["id"], "object": "chat.completion.chunk", "model": body["model"]}

    def chunk(delta: Json, finish: str | None = None) -> tuple[str | None, Json]:
        return None, {
            **base,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    events = [chunk({"role": "assistant", "content": ""})]
    if message.get("refusal"):
        events.append(chunk({"refusal": message["refusal"]}))
    for call_index, call in enumerate(message.get("tool_calls") or ()):
        function = call["function"]
        for n, piece in enumerate(_pieces(function["arguments"])):
            head = {"id": call["id"], "type": "function"} if n == 0 else {}
            fn = {"name": function["name"], "arguments": piece} if n == 0 else {"arguments": piece}
            events.append(chunk({"tool_calls": [{"index": call_index, **head, "function": fn}]}))
    if message.get("content"):
        events.extend(chunk({"content": piece}) for piece in _pieces(message["content"]))
    events.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        events.append((None, {**base, "choices": [], "usage": body["usage"]}))
    return events


def responses_events(body: Json) -> list[tuple[str | None, Json]]:
    """A Responses API ``response`` as the events that stream it."""
    events: list[tuple[str | None, Json]] = []

    def event(kind: str, **data: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": len(events), **data}))

    event("response.created", response={**body, "status": "in_progress", "output": []})
    for index, item in enumerate(body["output"]):
        # (event kind, streamed text, fields between output_index and delta) per item
        deltas: list[tuple[str, str, Json]]
        if item["type"] == "function_call":
            deltas = [("response.function_call_arguments.delta", item["arguments"], {})]
        else:
            deltas = [
                ("response.output_text.delta", part["text"], {"content_index": 0})
                for part in item["content"]
                if part["type"] == "output_text"
            ]
        for kind, text, fields in deltas:
            for piece in _pieces(text):
                event(kind, item_id=item["id"], output_index=index, **fields, delta=piece)
    final = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
    event(final, response=body)
    return events


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> Json:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
