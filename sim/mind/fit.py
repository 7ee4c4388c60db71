"""A character's memory trimmed so its file fits ``[limits] max_entity_bytes``.

Loading refuses an entity file over the limit, so a tick must never commit one: a world
would stop there. Memory is what grows tick after tick (new cells, the long-term store,
a summary that failed calls extend), so a character whose file would pass the limit has
its memory compacted, least recent first: the oldest cells of the long-term store (its
summary already holds them), then the oldest part of the running summary, then the
oldest working cells. Each step drops only as much as the overflow needs, and the same
world always loses the same cells (no clock, no randomness). What cannot be made to fit
this way (a file too large without any memory) is left for the commit to refuse by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from sim.world import Entity

#: the serialised size of an entity, as its file would be written
Size = Callable[[Entity], int]


@dataclass(frozen=True, slots=True)
class Trimmed:
    """What one character's memory lost to fit the limit."""

    character: str
    archived: int = 0
    summary_chars: int = 0
    cells: int = 0
    #: the file's size afterwards (over ``limit`` when nothing more could go)
    size: int = 0
    limit: int = 0

    @property
    def fits(self) -> bool:
        return self.size <= self.limit

    def note(self) -> str:
        """One line for the tick's summary."""
        lost = [
            f"{n} {what}"
            for n, what in (
                (self.archived, "archived cell(s)"),
                (self.summary_chars, "character(s) of its summary"),
                (self.cells, "memory cell(s)"),
            )
            if n
        ]
        return (
            f"{self.character}'s memory was compacted to fit [limits] max_entity_bytes "
            f"({self.limit}): dropped the oldest " + ", ".join(lost)
        )


def _cell_bytes(cell: Any) -> int:
    # the compact form: a lower bound of what the cell takes in the indented file
    return len(orjson.dumps(cell))


def _drop_oldest(cells: list[Any], over: int) -> int:
    """Remove the fewest oldest cells whose compact size reaches ``over``; how many."""
    dropped, freed = 0, 0
    while dropped < len(cells) and freed < over:
        freed += _cell_bytes(cells[dropped])
        dropped += 1
    del cells[:dropped]
    return dropped


def fit_memory(char: Entity, limit: int, size: Size) -> Trimmed | None:
    """Compact ``char``'s memory (in place) until ``size(char) <= limit``.

    Returns:
        ``None`` when it already fits; else what was dropped, and whether it fits now.
    """
    current = size(char)
    if current <= limit:
        return None
    memory = char["memory"]
    archived = summary_chars = cells = 0
    archive = memory.get("archive")
    while current > limit and archive:
        archived += _drop_oldest(archive, current - limit)
        current = size(char)
    while current > limit and memory["summary"]:
        summary: str = memory["summary"]
        # at least as many characters as bytes over (a character is one byte or more)
        cut = min(len(summary), max(1, current - limit))
        memory["summary"] = summary[cut:].lstrip()
        summary_chars += len(summary) - len(memory["summary"])
        current = size(char)
    while current > limit and memory["cells"]:
        cells += _drop_oldest(memory["cells"], current - limit)
        current = size(char)
    return Trimmed(
        str(char["identity"]["id"]), archived, summary_chars, cells, size=current, limit=limit
    )


__all__ = ["Size", "Trimmed", "fit_memory"]
