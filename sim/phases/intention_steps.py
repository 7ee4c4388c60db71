"""Phase 1 in ``mode = "tools"`` over several turns: query tools before acting.

Besides the action tools (``move_to``, ``say``, ``act``, ``wait``) a character may call
``look(target)``, ``recall(topic)`` and ``inventory()``; the engine answers each from the
world as it is at the start of the tick, and the model is asked again with the
conversation so far. After ``[phase1] max_tool_steps`` query steps only the action tools
are offered, so every character ends with one action (or the fallback intention).

Each step is one call of the phase's client: one logged exchange with its own request id,
so replay and resume serve every step from the tick log and usage counts every step.
Steps run in rounds: all characters still looking are asked together, in one batch
(``sim.phases.tool_steps``, which declared phases naming ``tools`` use too).
"""

from __future__ import annotations

import re
from typing import Any

from sim.llm.client import LLMClient, LLMRequest
from sim.llm.tools import FunctionCall, LLMMessage, ToolDeclaration
from sim.mind.retrieve import candidates
from sim.phases.intention_tools import TOOLS
from sim.phases.tool_steps import converse, exchange
from sim.world import Entity, World

QUERY_TOOLS: tuple[ToolDeclaration, ...] = (
    ToolDeclaration.of_strings(
        "look",
        "Look closely at a person, an object or an exit here (or something "
        "you carry) before deciding.",
        target="an id or name seen here",
    ),
    ToolDeclaration.of_strings(
        "recall",
        "Remember what you know about a topic (your memories and summary).",
        topic="a word or name",
    ),
    ToolDeclaration.of_strings("inventory", "Check what you are carrying."),
)
QUERY_NAMES = frozenset(tool.name for tool in QUERY_TOOLS)
ACTION_NAMES = frozenset(tool.name for tool in TOOLS)
#: how many memory cells ``recall`` returns at most
RECALL_LIMIT = 5


def _norm(text: object) -> str:
    return str(text or "").strip().lower()


def look(world: World, char: Entity, here: list[str], target: str) -> dict[str, Any]:
    """What ``target`` (a person present, an object here or carried, an exit) looks like."""
    loc = world.locations[char["state"]["location"]]
    return look_from(world, loc, here, target, char["identity"]["id"], char["state"]["inventory"])


def look_from(
    world: World,
    loc: Entity,
    here: list[str],
    target: str,
    me: str | None = None,
    carried: list[str] | None = None,
) -> dict[str, Any]:
    """What ``target`` looks like from ``loc``: a person there (but ``me``), an object there
    or ``carried``, or an exit; else what there is to look at."""
    want = _norm(target)
    for cid in here:
        other = world.characters[cid]
        if cid != me and want in (
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
    for item in carried or ():
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
        "people": [world.characters[c]["identity"]["id"] for c in here if c != me],
        "objects": list(loc["state"]["objects"]),
        "exits": list(loc["state"]["connections"]),
    }


def recall(char: Entity, topic: str) -> dict[str, Any]:
    """The memory cells that mention ``topic`` (its words of 3+ letters), latest last; the
    long-term store's too (``[memory] mode = "retrieve"``)."""
    words = {w for w in re.findall(r"\w+", _norm(topic)) if len(w) >= 3}
    cells = [
        f"tick {c['tick']}: {c['text']}"
        for c in candidates(char["memory"])
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
    return exchange(calls, lambda call: answer_query(world, char, here, call))


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

    def answer(i: int, call: FunctionCall) -> dict[str, Any]:
        char = chars[i]
        return answer_query(world, char, here.get(char["state"]["location"], []), call)

    return await converse(
        client,
        requests,
        finals=action_tools,
        queries=QUERY_TOOLS,
        answer=answer,
        max_steps=max_steps,
    )
