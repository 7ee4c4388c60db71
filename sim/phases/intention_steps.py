"""Phase 1 in ``mode = "tools"`` over several turns: query tools before acting.

Besides the action tools (``move_to``, ``say``, ``act``, ``wait``) a character may call
``look(target)``, ``recall(topic)`` and ``inventory()``; the engine answers each from the
world as it is at the start of the tick, and the model is asked again with the
conversation so far. After ``[phase1] max_tool_steps`` query steps only the action tools
are offered, so every character ends with one action (or the fallback intention).

Each step is one call of the phase's client: one logged exchange with its own request id,
so replay and resume serve every step from the tick log and usage counts every step.
Steps run in rounds: all characters still looking are asked together, in one batch.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from sim.llm.client import LLMClient, LLMRequest
from sim.llm.tools import FunctionCall, FunctionResponse, LLMMessage, ToolCalls, ToolDeclaration
from sim.phases.intention_tools import TOOLS
from sim.world import Entity, World

QUERY_TOOLS: tuple[ToolDeclaration, ...] = (
    ToolDeclaration(
        name="look",
        description="Look closely at a person, an object or an exit here (or something "
        "you carry) before deciding.",
        parameters={
            "type": "object",
            "properties": {"target": {"type": "string", "description": "an id or name seen here"}},
            "required": ["target"],
        },
    ),
    ToolDeclaration(
        name="recall",
        description="Remember what you know about a topic (your memories and summary).",
        parameters={
            "type": "object",
            "properties": {"topic": {"type": "string", "description": "a word or name"}},
            "required": ["topic"],
        },
    ),
    ToolDeclaration(
        name="inventory",
        description="Check what you are carrying.",
        parameters={"type": "object", "properties": {}},
    ),
)
QUERY_NAMES = frozenset(tool.name for tool in QUERY_TOOLS)
ACTION_NAMES = frozenset(tool.name for tool in TOOLS)
#: how many memory cells ``recall`` returns at most
RECALL_LIMIT = 5


def _norm(text: object) -> str:
    return str(text or "").strip().lower()


def look(world: World, char: Entity, here: list[str], target: str) -> dict[str, Any]:
    """What ``target`` (a person present, an object here or carried, an exit) looks like."""
    want = _norm(target)
    loc = world.locations[char["state"]["location"]]
    for cid in here:
        other = world.characters[cid]
        if other is not char and want in (
            _norm(other["identity"]["id"]),
            _norm(other["identity"]["name"]),
        ):
            return {
                "kind": "person",
                "id": other["identity"]["id"],
                "name": other["identity"]["name"],
                "description": other["identity"]["description"],
                "mood": other["state"]["mood"],
            }
    for item in loc["state"]["objects"]:
        if _norm(item) == want:
            return {"kind": "object", "name": item, "where": "here"}
    for item in char["state"]["inventory"]:
        if _norm(item) == want:
            return {"kind": "object", "name": item, "where": "carried"}
    for lid in loc["state"]["connections"]:
        place = world.locations[lid]
        if want in (_norm(lid), _norm(place["identity"]["name"])):
            return {
                "kind": "exit",
                "id": lid,
                "name": place["identity"]["name"],
                "description": place["identity"]["description"],
            }
    return {
        "error": f"nothing called {target!r} here",
        "people": [
            world.characters[c]["identity"]["id"] for c in here if c != char["identity"]["id"]
        ],
        "objects": list(loc["state"]["objects"]),
        "exits": list(loc["state"]["connections"]),
    }


def recall(char: Entity, topic: str) -> dict[str, Any]:
    """The memory cells that mention ``topic`` (its words of 3+ letters), latest last."""
    words = {w for w in re.findall(r"\w+", _norm(topic)) if len(w) >= 3}
    cells = [
        f"tick {c['tick']}: {c['text']}"
        for c in char["memory"]["cells"]
        if words & set(re.findall(r"\w+", _norm(c["text"])))
    ]
    return {"summary": char["memory"]["summary"], "memories": cells[-RECALL_LIMIT:]}


def answer_query(world: World, char: Entity, here: list[str], call: FunctionCall) -> dict[str, Any]:
    """The engine's answer to one query-tool call."""
    args = call.arguments
    if call.name == "look":
        return look(world, char, here, str(args.get("target") or ""))
    if call.name == "recall":
        return recall(char, str(args.get("topic") or ""))
    return {"inventory": list(char["state"]["inventory"])}


def step_messages(
    world: World, char: Entity, here: list[str], calls: list[FunctionCall]
) -> tuple[LLMMessage, ...]:
    """The model's query calls and the engine's answers, as conversation messages."""
    messages: list[LLMMessage] = []
    for call in calls:
        messages.append(LLMMessage(role="assistant", function_call=call))
        messages.append(
            LLMMessage(
                role="function",
                function_response=FunctionResponse(
                    name=call.name,
                    call_id=call.call_id,
                    response=answer_query(world, char, here, call),
                ),
            )
        )
    return tuple(messages)


async def decide(
    world: World,
    client: LLMClient,
    chars: list[Entity],
    requests: list[LLMRequest],
    here: dict[str, list[str]],
    max_steps: int,
    action_tools: tuple[ToolDeclaration, ...] = TOOLS,
) -> tuple[list[Any], int]:
    """Ask every character, answering query calls, until each acts or runs out of steps.

    Args:
        chars, requests: the characters and their first requests (same order).
        here: location id -> the ids of the characters there.
        max_steps: query steps allowed before only the action tools are offered.
        action_tools: the action tools (the built-ins and the world's ``[actions]`` verbs).

    Returns:
        (each character's last answer: a ``ToolCalls`` or an ``LLMError``, calls made).
    """
    results: list[Any] = [None] * len(chars)
    conversations: list[tuple[LLMMessage, ...]] = [()] * len(chars)
    pending = list(range(len(chars)))
    calls = 0
    acting = frozenset(tool.name for tool in action_tools)
    for step in range(max_steps + 1):
        tools = (*action_tools, *QUERY_TOOLS) if step < max_steps else action_tools
        batch = [replace(requests[i], tools=tools, messages=conversations[i]) for i in pending]
        answers = await client.create_batch(batch)
        calls += len(batch)
        looking = []
        for i, answer in zip(pending, answers, strict=True):
            results[i] = answer
            if not isinstance(answer, ToolCalls) or step == max_steps:
                continue
            if any(c.name in acting for c in answer.calls):
                continue
            queries = [c for c in answer.calls if c.name in QUERY_NAMES]
            if queries:
                char = chars[i]
                where = here.get(char["state"]["location"], [])
                conversations[i] += step_messages(world, char, where, queries)
                looking.append(i)
        pending = looking
        if not pending:
            break
    return results, calls
