"""Planning (off unless named in ``[tick] phases``; needs ``[time]``): once an in-world day
(at the first tick of a day the phase runs in, e.g. ``when = "06:00"``), each character
writes a daily plan, a list of timed intentions, kept in ``memory.plan``. The intentions
phase sees the plan's item for now (and the next) in its memory, and may depart from it."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field

from sim.llm.errors import LLMError
from sim.phases.base import (
    PhaseAnswer,
    TickContext,
    ask,
    character_view,
    exits_view,
    place_view,
    public,
    to_json,
)
from sim.world import Entity

NAME = "planning"
SECTION = "planning"
CHAIN = "planning"
_HHMM = re.compile(r"([01]\d|2[0-3]):[0-5]\d")


class PlanItem(PhaseAnswer, title="PlanItem"):
    at: str = Field(description="the in-world time, HH:MM (24-hour)")
    intention: str = Field(description="what the character means to do then, one sentence")


class Plan(PhaseAnswer, title="Plan"):
    items: list[PlanItem]


def planning_input(ctx: TickContext, char: Entity, memory: dict[str, Any]) -> str:
    loc = ctx.world.locations[char["state"]["location"]]
    return to_json(
        {
            "tick": ctx.tick,
            "world": ctx.world_view,
            "character": character_view(char),
            "memory": memory,
            "location": place_view(loc),
            "exits": exits_view(ctx.world, loc),
            "items": ctx.config.planning.items,
        }
    )


def plan_items(result: Plan, limit: int) -> list[dict[str, str]]:
    """The answer's items kept: well-formed times, sorted by time, at most ``limit``."""
    items = [
        {"at": item.at, "intention": item.intention.strip()}
        for item in result.items
        if _HHMM.fullmatch(item.at) and item.intention.strip()
    ]
    return sorted(items, key=lambda i: i["at"])[:limit]


async def run(ctx: TickContext) -> None:
    report = ctx.report(NAME)
    time = ctx.time
    assert time is not None  # resolve_phases refuses planning without [time]
    world = ctx.world
    chars = [
        c for c in ctx.characters() if (c["memory"].get("plan") or {}).get("date") != time["date"]
    ]
    client = ctx.client(SECTION, chars, NAME)
    where = world.characters_at()
    requests = []
    for char in chars:
        lid = char["state"]["location"]
        memory = ctx.memory_for(char, where.get(lid, []), ctx.happenings.here(lid), NAME)

        def context(char: Entity = char) -> dict[str, Any]:
            return {"character": public(char), "memory": char["memory"]}

        def default(char: Entity = char, memory: dict[str, Any] = memory) -> str:
            return planning_input(ctx, char, memory)

        key = f"{CHAIN}:{char['identity']['id']}"
        requests.append(ctx.request(NAME, Plan, key, context, default))
    results = await ask(client, requests, report)
    for char, request, result in zip(chars, requests, results, strict=True):
        if isinstance(result, LLMError):
            report.fail(str(request.entity_key), result)
            continue  # no plan today; asked again at the phase's next run
        items = plan_items(result, ctx.config.planning.items)
        char["memory"]["plan"] = {"date": time["date"], "items": items}
