"""In-world time (``[time]``): tick ``n`` happens at ``start + (n - 1) × tick``.

Standard library only: the config parses its fields with it, the phases
show the time it gives, and a phase's ``when`` asks it whether a tick is due.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

_DURATION = re.compile(r"(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_UNITS = (7 * 86400, 86400, 3600, 60, 1)
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_WHEN = re.compile(r"(?:(mon|tue|wed|thu|fri|sat|sun) )?([01]\d|2[0-3]):([0-5]\d)")
#: the longest span of in-world time sim keeps (datetime's range is years 1..9999)
_MAX_SECONDS = 1000 * 366 * 86400


def parse_duration(text: str) -> int:
    """``"1h"``, ``"30m"``, ``"1d12h"``, ``"2w"`` -> seconds (> 0).

    Raises:
        ValueError: anything else, naming the form expected.
    """
    match = _DURATION.fullmatch(text.strip())
    if not text.strip() or match is None:
        raise ValueError(f"expected a duration such as 1h, 30m, 1d12h or 2w (got {text!r})")
    seconds = sum(int(v) * unit for v, unit in zip(match.groups(), _UNITS, strict=True) if v)
    if not 0 < seconds <= _MAX_SECONDS:
        raise ValueError(f"expected a duration above 0 and at most 1000 years (got {text!r})")
    return seconds


def parse_start(text: str) -> datetime:
    """``"1340-05-01T06:00"`` (seconds optional) -> a naive datetime.

    Raises:
        ValueError: not that form.
    """
    for form in ("%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"):
        try:
            return datetime.strptime(text, form)
        except ValueError:
            continue
    raise ValueError(f"expected a date and time such as 1340-05-01T06:00 (got {text!r})")


def parse_when(text: str) -> tuple[int | None, int]:
    """``"18:00"`` (daily) or ``"sun 18:00"`` (weekly) -> (weekday or None, minute of day).

    Raises:
        ValueError: not that form.
    """
    match = _WHEN.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"expected HH:MM or a day and HH:MM, such as 'sun 18:00' (got {text!r})")
    day, hour, minute = match.groups()
    return (WEEKDAYS.index(day) if day else None), int(hour) * 60 + int(minute)


def part_of_day(hour: int) -> str:
    if 5 <= hour < 12:
        return "morning"
    if 12 <= hour < 17:
        return "afternoon"
    if 17 <= hour < 21:
        return "evening"
    return "night"


def _elapsed(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    parts = [f"{days}d"] if days else []
    if hours or (days and minutes):
        parts.append(f"{hours}h")
    if minutes:
        parts.append(f"{minutes}m")
    return " ".join(parts) or "0m"


@dataclass(frozen=True)
class Clock:
    """Ticks to in-world time: tick 1 at ``start``, each tick ``step`` seconds later."""

    start: datetime
    step: int

    def at(self, tick: int) -> datetime:
        """When tick ``tick`` happens (ticks before the first count back from ``start``)."""
        return self.start + timedelta(seconds=(tick - 1) * self.step)

    def view(self, tick: int) -> dict[str, Any]:
        """The time of a tick as inputs and templates show it."""
        now = self.at(tick)
        return {
            "now": now.strftime("%Y-%m-%dT%H:%M"),
            "date": now.strftime("%Y-%m-%d"),
            "weekday": _DAY_NAMES[now.weekday()],
            "time": now.strftime("%H:%M"),
            "part_of_day": part_of_day(now.hour),
            "elapsed": _elapsed(max(0, tick - 1) * self.step),
        }

    def due(self, tick: int, when: tuple[str, ...]) -> bool:
        """Whether one of ``when``'s times falls within this tick, [its time, + one step)."""
        begin = self.at(tick)
        end = begin + timedelta(seconds=self.step)
        for text in when:
            weekday, minute = parse_when(text)
            day = datetime(begin.year, begin.month, begin.day)
            # the first occurrence at or after the tick's start
            candidate = day + timedelta(minutes=minute)
            while candidate < begin or (weekday is not None and candidate.weekday() != weekday):
                candidate += timedelta(days=1)
            if candidate < end:
                return True
        return False
