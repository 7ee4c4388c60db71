"""Phase 2b, narrative: a short account of what happened at each occupied location."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from sim import sections
from sim.llm.errors import LLMError
from sim.phases.base import PhaseAnswer, TickContext, ask, place_view
from sim.phases.conversation import dialogues_at
from sim.phases.resolution import Outcome, Resolution, template_context
from sim.world import World

NAME = "narrative"
SECTION = "phase2b"
CHAIN = "narrative"


class Narrative(PhaseAnswer, title="Narrative"):
    narrative: str = Field(description="three to six sentences of prose", max_length=1200)


def narrative_input(ctx: TickContext, world: World, location_id: str) -> str:
    loc = world.locations[location_id]
    resolution = ctx.resolutions.get(location_id, Resolution.empty())
    outcomes: dict[str, Outcome] = {}
    for item in resolution.outcomes:
        outcomes.setdefault(item.character_id, item)
    events = []
    for cid in ctx.occupancy[location_id]:
        outcome = outcomes.get(cid)
        events.append(
            {
                "id": cid,
                "name": world.characters[cid]["identity"]["name"],
                "intention": ctx.intentions[cid].model_dump(),
                "outcome": outcome.outcome if outcome else "",
                "moved_to": outcome.moved_to if outcome else None,
            }
        )
    doc: dict[str, Any] = {
        "tick": ctx.tick,
        "world": ctx.world_view,
        "location": place_view(loc, objects=False),
        "events": events,
    }
    happenings = ctx.happenings.here(location_id)
    if happenings:  # injected by `sim inject`; left out when none, so inputs stay as they were
        doc["happenings"] = happenings
    conversations = dialogues_at(ctx, location_id)
    if conversations:  # the conversation phase's dialogues here, to quote from
        doc["conversations"] = conversations
    return sections.dumps(doc)


async def run(ctx: TickContext) -> None:
    report = ctx.report(NAME)
    world = ctx.world
    occupied = list(ctx.occupancy)
    client = ctx.client(SECTION, [world.locations[lid] for lid in occupied], NAME)
    requests = []
    for lid in occupied:

        def context(lid: str = lid) -> dict[str, Any]:
            resolution = ctx.resolutions.get(lid, Resolution.empty())
            return {**template_context(ctx, lid), "resolution": resolution.model_dump()}

        def default(lid: str = lid) -> str:
            return narrative_input(ctx, world, lid)

        requests.append(ctx.request(NAME, Narrative, f"{CHAIN}:{lid}", context, default))
    results = await ask(client, requests, report)
    for lid, request, result in zip(occupied, requests, results, strict=True):
        if isinstance(result, LLMError):
            report.fail(str(request.entity_key), result)
            continue  # fallback: no narrative for this place this tick
        ctx.narratives[lid] = result.narrative
