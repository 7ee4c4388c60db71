"""What was injected into a tick (``sim inject``): the events its phases' inputs show."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sim.ticklog.records import InterventionRecord


@dataclass(frozen=True)
class Happenings:
    """The injected events of a tick: everywhere, and by location, in the order made."""

    everywhere: tuple[str, ...] = ()
    at: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: every event as (location id or ``None`` for everywhere, text), in order
    all: tuple[tuple[str | None, str], ...] = ()

    @classmethod
    def of(cls, records: Iterable[InterventionRecord]) -> Happenings:
        everywhere: list[str] = []
        at: dict[str, list[str]] = {}
        ordered: list[tuple[str | None, str]] = []
        for record in records:
            if record.kind != "inject" or record.text is None:
                continue
            ordered.append((record.location, record.text))
            if record.location is None:
                everywhere.append(record.text)
            else:
                at.setdefault(record.location, []).append(record.text)
        return cls(tuple(everywhere), {k: tuple(v) for k, v in at.items()}, tuple(ordered))

    def here(self, location_id: str) -> list[str]:
        """What happens at ``location_id`` this tick (everywhere ones included), in order."""
        if not self.all:
            return []
        return [text for where, text in self.all if where is None or where == location_id]

    def __bool__(self) -> bool:
        return bool(self.all)
