"""The ``window`` memory strategy: a phase's input shows a character's last ``k`` cells;
evicted cells are summarised and dropped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sim.mind.strategy import Recall


def recent_lines(memory: dict[str, Any], k: int) -> list[str]:
    """The last ``k`` cells, one line each."""
    return [f"tick {c['tick']}: {c['text']}" for c in memory["cells"][-k:]]


class WindowMemory:
    """``[memory] mode = "window"``: the last ``k`` cells, under ``recent``."""

    name = "window"
    keeps_evicted = False
    uses_situation = False

    def recall(self, request: Recall) -> dict[str, list[str]]:
        return {"recent": recent_lines(request.memory, request.config.k)}


__all__ = ["WindowMemory", "recent_lines"]
