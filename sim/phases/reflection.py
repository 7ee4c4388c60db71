"""Reflection (off unless named in ``[tick] phases``): a character whose memories have
gathered enough importance since its last reflection (``[reflection] threshold``) is asked
for a few higher-level insights drawn from its retrieved cells; they are stored as cells
that cite their sources (the ticks of the cells they rest on)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from sim.llm.errors import LLMError
from sim.mind.cells import Mentions, new_cell
from sim.mind.retrieve import retrieve, situation
from sim.phases.base import PhaseAnswer, TickContext, ask, character_view, public, to_json
from sim.world import Entity, World

NAME = "reflection"
SECTION = "reflection"
CHAIN = "reflection"


class Insight(PhaseAnswer, title="Insight"):
    text: str = Field(description="one higher-level insight, one sentence, third person")
    sources: list[int] = Field(description="the numbers (n) of the memories it rests on")
    importance: int = Field(ge=1, le=10, description="1 mundane .. 10 life-changing")


class Reflection(PhaseAnswer, title="Reflection"):
    insights: list[Insight]


def due(char: Entity, threshold: int) -> bool:
    """Whether a character's unreflected importance has reached the threshold."""
    return int(char["memory"].get("unreflected") or 0) >= threshold


def people_in(world: World, char: Entity, cells: list[dict[str, Any]]) -> list[str]:
    """The names of the other characters the cells mention, in order of first mention."""
    me = char["identity"]["id"]
    ids = dict.fromkeys(cid for c in cells for cid in c.get("mentions") or ())
    return [
        world.characters[cid]["identity"]["name"]
        for cid in ids
        if cid != me and cid in world.characters
    ]


def reflection_input(
    world: World,
    char: Entity,
    cells: list[dict[str, Any]],
    tick: int,
    insights: int,
    view: dict[str, Any],
) -> str:
    """The character (without mood or inventory), its numbered memories, the people they
    mention, and how many insights to give."""
    return to_json(
        {
            "tick": tick,
            "world": view,
            "character": character_view(char, full=False),
            "memories": [
                {"n": n, "tick": c["tick"], "text": c["text"]} for n, c in enumerate(cells, 1)
            ],
            "people": people_in(world, char, cells),
            "insights": insights,
        }
    )


def insight_cells(
    ctx: TickContext, result: Reflection, cells: list[dict[str, Any]], mentions: Mentions
) -> list[dict[str, Any]]:
    """The answer's insights as cells (at most ``[reflection] insights``); a source number
    outside the list is dropped, an insight citing none is kept without sources."""
    out = []
    for insight in result.insights[: ctx.config.reflection.insights]:
        text = insight.text.strip()
        if not text:
            continue
        ticks = sorted({int(cells[n - 1]["tick"]) for n in insight.sources if 1 <= n <= len(cells)})
        memory = ctx.config.memory
        out.append(new_cell(ctx.tick, text, memory, mentions, insight.importance, ticks))
    return out


async def run(ctx: TickContext) -> None:
    report = ctx.report(NAME)
    world, config = ctx.world, ctx.config.reflection
    chars = [c for c in ctx.characters() if due(c, config.threshold)]
    client = ctx.client(SECTION, chars, NAME)
    memory = ctx.config.memory.for_phase(NAME).model_copy(update={"k": config.cells})
    where = world.characters_at()
    vectors = ctx.vectors_for(NAME)
    view = ctx.world_view
    chosen: list[list[dict[str, Any]]] = []
    requests = []
    for char in chars:
        lid = char["state"]["location"]
        now = situation(world, char, where.get(lid, []), ctx.happenings.here(lid), ctx.tick)
        cells = retrieve(char["memory"], now, memory, vectors)
        chosen.append(cells)

        def context(char: Entity = char, cells: list[dict[str, Any]] = cells) -> dict[str, Any]:
            return {"character": public(char), "memory": char["memory"], "memories": cells}

        def default(char: Entity = char, cells: list[dict[str, Any]] = cells) -> str:
            return reflection_input(world, char, cells, ctx.tick, config.insights, view)

        key = f"{CHAIN}:{char['identity']['id']}"
        requests.append(ctx.request(NAME, Reflection, key, context, default))
    results = await ask(client, requests, report)
    mentions = Mentions(world) if chars else None
    for char, cells, request, result in zip(chars, chosen, requests, results, strict=True):
        if isinstance(result, LLMError):
            report.fail(str(request.entity_key), result)
            continue  # nothing learned; it is still due next tick
        assert mentions is not None
        char["memory"]["cells"].extend(insight_cells(ctx, result, cells, mentions))
        char["memory"]["unreflected"] = 0
