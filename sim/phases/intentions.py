"""Phase 1, intentions: each character says what it means to do this tick."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sim.llm.client import LLMRequest
from sim.llm.errors import LLMError
from sim.llm.tools import ToolCalls
from sim.phases import intention_steps
from sim.phases.base import TickContext, exits_view, place_view, to_json
from sim.phases.intention_tools import TOOLS, intention_data
from sim.world import Entity, World

NAME = "intentions"
SECTION = "phase1"
CHAIN = "intention"
RECENT_CELLS = 3


class Intention(BaseModel):
    """What a character means to do: move, speak, act on something, or wait."""

    model_config = ConfigDict(extra="forbid", title="Intention")

    action: Literal["move", "speak", "act", "wait"]
    target: str | None = Field(
        description="move: a connected location id; speak: a present character id; "
        "act: an object here or carried; wait: null"
    )
    content: str = Field(description="speak: the words said; act: what is done; move, wait: how")
    reasoning: str = Field(description="why, in a sentence")

    @classmethod
    def fallback(cls) -> Intention:
        """The spec's idle intention, used when the call failed."""
        return cls(action="wait", target=None, content="", reasoning="LLM error, using fallback")


def character_input(world: World, char: Entity, tick: int, here: list[str]) -> str:
    """The model's view of one character at the start of a tick.

    Args:
        here: ids of every character at the same location (including this one).
    """
    identity, state, memory = char["identity"], char["state"], char["memory"]
    loc = world.locations[state["location"]]
    present = [
        {
            "id": other["identity"]["id"],
            "name": other["identity"]["name"],
            "mood": other["state"]["mood"],
        }
        for other in (world.characters[cid] for cid in here)
        if other is not char
    ]
    return to_json(
        {
            "tick": tick,
            "world": world.meta["name"],
            "character": {
                "id": identity["id"],
                "name": identity["name"],
                "description": identity["description"],
                "personality": identity["personality"],
                "goals": identity["goals"],
                "mood": state["mood"],
                "inventory": state["inventory"],
            },
            "memory": {
                "summary": memory["summary"],
                "recent": [
                    f"tick {c['tick']}: {c['text']}" for c in memory["cells"][-RECENT_CELLS:]
                ],
            },
            "location": place_view(loc),
            "exits": exits_view(world, loc),
            "present": present,
        }
    )


async def run(ctx: TickContext) -> None:
    report = ctx.report(NAME)
    world = ctx.world
    chars = list(world.characters.values())
    client = ctx.client(SECTION, chars, NAME)
    instructions = ctx.prompt(NAME)
    tools = TOOLS if ctx.config.phase1.mode == "tools" else None
    requests = [
        LLMRequest(
            instructions,
            character_input(world, char, ctx.tick, ctx.occupancy[char["state"]["location"]]),
            Intention,
            f"{CHAIN}:{char['identity']['id']}",
            tools=tools,
        )
        for char in chars
    ]
    if tools is not None and ctx.config.phase1.max_tool_steps > 0:  # look before acting
        results, calls = await intention_steps.decide(
            world, client, chars, requests, ctx.occupancy, ctx.config.phase1.max_tool_steps
        )
        report.entities += len(chars)
    else:
        results, calls = await client.create_batch(requests), len(requests)
    report.calls += calls
    for char, request, result in zip(chars, requests, results, strict=True):
        cid = char["identity"]["id"]
        if isinstance(result, ToolCalls):
            try:
                result = Intention.model_validate(intention_data(result))
            except LLMError as exc:
                result = exc
        if isinstance(result, LLMError):
            report.fail(str(request.entity_key), result)
            result = Intention.fallback()
        ctx.intentions[cid] = result
