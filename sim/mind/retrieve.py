"""Retrieval: the ``k`` cells of a character's memory (window and long-term store) that score
highest by recency, importance and relevance to its situation (Generative Agents' memory
stream). Each part is scaled to 0..1 (recency ``decay ** age``, importance ``(i - 1) / 9``,
relevance divided by the best cell's) and weighted by ``[memory] weights``; ties go to the
later cell. The cells come back oldest first. The scoring (``sim.mind.scoring``) is array
arithmetic over all of a character's cells at once; a few cells are scored in a loop
(``sim.mind.loop``), to the same result. Relevance reads a cell's text, where the
names of the people and places it mentions are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sim.config import MemoryConfig
from sim.mind import loop
from sim.mind.loop import SMALL
from sim.world import Entity, World

if TYPE_CHECKING:
    from sim.mind.strategy import Recall
    from sim.mind.vectors import VectorCache


@dataclass(frozen=True)
class Situation:
    """What a character's memories are weighed against: now, and what is around it."""

    tick: int
    #: the place, the people present, the happenings, the goals, as one text
    text: str


def situation(
    world: World, char: Entity, here: Iterable[str], happenings: Sequence[str], tick: int
) -> Situation:
    """A character's situation: its place (id, name, objects), who is present (ids and
    names), the events injected there, and its goals."""
    loc = world.locations[char["state"]["location"]]
    parts = [loc["identity"]["id"], loc["identity"]["name"], *map(str, loc["state"]["objects"])]
    me = char["identity"]["id"]
    for cid in here:
        if cid != me:
            parts += [cid, world.characters[cid]["identity"]["name"]]
    parts += happenings
    parts += map(str, char["identity"]["goals"])
    return Situation(tick, " ".join(parts))


def candidates(memory: dict[str, Any]) -> list[dict[str, Any]]:
    """Every cell retrieval may pick: the long-term store, then the window."""
    return [*(memory.get("archive") or ()), *memory["cells"]]


def retrieve(
    memory: dict[str, Any],
    now: Situation,
    config: MemoryConfig,
    vectors: VectorCache | None = None,
) -> list[dict[str, Any]]:
    """The ``config.k`` best cells for this situation, oldest first (``vectors``: a
    provider's embeddings, ``sim.mind.vectors``)."""
    cells = candidates(memory)
    if len(cells) <= config.k:
        return cells
    if len(cells) < SMALL:  # a few cells: a loop is faster than arrays
        return [cells[i] for i in loop.best(cells, now.tick, now.text, config, vectors)]
    from sim.mind.scoring import best  # numpy: loaded only where a phase retrieves many

    return [cells[i] for i in best(cells, now.tick, now.text, config, vectors)]


def recall_view(
    memory: dict[str, Any],
    now: Situation,
    config: MemoryConfig,
    vectors: VectorCache | None = None,
) -> list[str]:
    """The retrieved cells as a phase's input shows them, one line each (as the window's)."""
    return [f"tick {c['tick']}: {c['text']}" for c in retrieve(memory, now, config, vectors)]


class RetrieveMemory:
    """``[memory] mode = "retrieve"``: the ``k`` best-scored cells for the situation (window
    and long-term store), under ``recall``; evicted cells are kept in the store."""

    name = "retrieve"
    keeps_evicted = True
    uses_situation = True

    def recall(self, request: Recall) -> dict[str, list[str]]:
        assert request.situation is not None  # uses_situation: the phase built it
        return {
            "recall": recall_view(
                request.memory, request.situation, request.config, request.vectors
            )
        }
