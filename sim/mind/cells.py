"""Writing memory cells: the tick, the importance (rated or by rule) and the ids mentioned."""

from __future__ import annotations

from typing import Any

from sim.config import Config, MemoryConfig
from sim.mind.words import terms
from sim.world import World

#: the longest name (in words) looked for in a cell's text
_MAX_NAME_WORDS = 4


def retrieving(memory: MemoryConfig) -> bool:
    """Whether any phase's memory strategy keeps evicted cells (in the long-term store)."""
    from sim.mind.strategy import memory_strategy

    modes = {memory.mode, *(p.mode for p in memory.phases.values() if p.mode is not None)}
    return any(memory_strategy(mode).keeps_evicted for mode in sorted(modes))


def mind_on(config: Config) -> bool:
    """Whether cells are rated and kept: retrieval anywhere, or the reflection phase."""
    return retrieving(config.memory) or "reflection" in config.tick.phases


def rated_by_model(config: Config) -> bool:
    """Whether the resolution rates each outcome's importance (its schema asks for it)."""
    return mind_on(config) and config.memory.rate == "model"


def rule_importance(text: str, memory: MemoryConfig) -> int:
    """A cell's importance by the declared rules: the highest one its text matches, else
    ``[memory] importance``."""
    lowered = text.lower()
    found = [r.importance for r in memory.rules if r.contains.lower() in lowered]
    return max(found, default=memory.importance)


class Mentions:
    """Finds the characters and locations a text names (by id or by name, any case)."""

    def __init__(self, world: World) -> None:
        names: dict[tuple[str, ...], str] = {}
        for kind in (world.characters, world.locations):
            for eid, entity in kind.items():
                names.setdefault((eid,), eid)
                key = tuple(terms(str(entity["identity"]["name"])))
                if key:
                    names.setdefault(key, eid)
        self._names = names

    def __call__(self, text: str) -> list[str]:
        words = terms(text)
        found: set[str] = set()
        for i in range(len(words)):
            for n in range(1, _MAX_NAME_WORDS + 1):
                eid = self._names.get(tuple(words[i : i + n]))
                if eid is not None:
                    found.add(eid)
        return sorted(found)


def new_cell(
    tick: int,
    text: str,
    memory: MemoryConfig,
    mentions: Mentions,
    importance: int | None = None,
    sources: list[int] | None = None,
) -> dict[str, Any]:
    """A cell as stored: tick, text, importance (the model's, else the rule's), mentions."""
    cell: dict[str, Any] = {
        "tick": tick,
        "text": text,
        "importance": importance if importance is not None else rule_importance(text, memory),
        "mentions": mentions(text),
    }
    if sources is not None:
        cell["sources"] = sources
    return cell


def archive(memory: dict[str, Any], evicted: list[dict[str, Any]], limit: int) -> None:
    """Keep evicted cells in the long-term store (``memory.archive``), at most ``limit``."""
    kept = list(memory.get("archive") or ())
    kept.extend(evicted)
    memory["archive"] = kept[-limit:] if limit else []


def remember(memory: dict[str, Any], cell: dict[str, Any]) -> None:
    """Add a new cell to a character's memory, and its importance to what awaits reflection."""
    memory["cells"].append(cell)
    memory["unreflected"] = int(memory.get("unreflected") or 0) + int(cell["importance"])
