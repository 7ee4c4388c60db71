"""Phase 4, memory: a character whose memory cells overflow its capacity has the oldest
cells evicted and folded into its running summary by the model. Retrieving
(``[memory] mode = "retrieve"``), the evicted cells are also kept in the character's
long-term store (``memory.archive``), where retrieval still finds them."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from sim import sections
from sim.llm.errors import LLMError
from sim.mind.cells import archive, retrieving
from sim.phases.base import PhaseAnswer, TickContext, ask, character_view, public
from sim.world import Entity

NAME = "memory"
SECTION = "phase4"
CHAIN = "memory"


class MemorySummary(PhaseAnswer, title="MemorySummary"):
    summary: str = Field(
        description="the running summary with the evicted memories folded in", max_length=1200
    )


def memory_input(
    char: Entity,
    evicted: list[dict[str, object]],
    tick: int,
    view: dict[str, Any] | None = None,
) -> str:
    document: dict[str, Any] = {"tick": tick}
    if view is not None:
        document["world"] = view
    return sections.dumps(
        {
            **document,
            "character": character_view(char, full=False),
            "summary": char["memory"]["summary"],
            "evicted": evicted,
        }
    )


def fallback_summary(summary: str, evicted: list[dict[str, object]]) -> str:
    """When the call failed: the old summary with the raw evicted cells appended."""
    parts = [summary] if summary else []
    parts.extend(f"(tick {cell['tick']}) {cell['text']}" for cell in evicted)
    return " ".join(parts)


async def run(ctx: TickContext) -> None:
    report = ctx.report(NAME)
    overflowing: list[tuple[Entity, list[dict[str, object]]]] = []
    for char in ctx.characters():
        memory = char["memory"]
        excess = len(memory["cells"]) - memory["capacity"]
        if excess > 0:
            overflowing.append((char, memory["cells"][:excess]))
    client = ctx.client(SECTION, [char for char, _ in overflowing], NAME)
    view = ctx.world_view
    requests = []
    for char, evicted in overflowing:

        def context(
            char: Entity = char, evicted: list[dict[str, object]] = evicted
        ) -> dict[str, Any]:
            return {"character": public(char), "memory": char["memory"], "evicted": evicted}

        def default(char: Entity = char, evicted: list[dict[str, object]] = evicted) -> str:
            return memory_input(char, evicted, ctx.tick, view)

        key = f"{CHAIN}:{char['identity']['id']}"
        requests.append(ctx.request(NAME, MemorySummary, key, context, default))
    results = await ask(client, requests, report)
    keep = retrieving(ctx.config.memory)
    for (char, evicted), request, result in zip(overflowing, requests, results, strict=True):
        memory = char["memory"]
        if isinstance(result, LLMError):
            report.fail(str(request.entity_key), result)
            memory["summary"] = fallback_summary(memory["summary"], evicted)
        else:
            memory["summary"] = result.summary
        if keep:  # retrieval reads evicted cells from the long-term store
            archive(memory, evicted, ctx.config.memory.max_archive)
        del memory["cells"][: len(evicted)]
