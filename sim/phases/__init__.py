"""The phases of a tick, in the one order they run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sim.phases import apply, intentions, memory, narrative, resolution
from sim.phases.base import TickContext

PhaseRun = Callable[[TickContext], Awaitable[None]]

#: (name, run) in execution order: 1 intentions, 2a resolution, 2b narrative, 3 apply, 4 memory
PHASES: tuple[tuple[str, PhaseRun], ...] = (
    (intentions.NAME, intentions.run),
    (resolution.NAME, resolution.run),
    (narrative.NAME, narrative.run),
    (apply.NAME, apply.run),
    (memory.NAME, memory.run),
)

__all__ = ["PHASES", "TickContext"]
