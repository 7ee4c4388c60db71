"""The layout of a compressed log: which of its lines come last, and the order undone.

The compressed layout: the header, then a ``layout`` line (``{"type": "layout", "lines":
N, "detail": [...], "state": [...]}``: how many lines follow it, and the indices, in the
order the tick wrote them, of the call detail and of the state snapshot), then the tick's
other records in order (interventions, phases, usage, commit), then the state snapshot,
then the call detail (``call`` and ``instructions`` records). ``read_log(path,
calls=False, state=False)`` (the report, for most ticks) decompresses only up to the
snapshot, ``calls=False`` up to the end of the snapshot, and a full read restores the
order the tick wrote. gzip logs of earlier sims (``tick-000004.jsonl.gz``) have a
``layout`` line without ``state``: their snapshot is second, among the other records.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path

import orjson

from sim.errors import LogError

#: the call detail: the lines a compressed log keeps last and ``read_log(path, calls=False)``
#: leaves unread
CALL_DETAIL = (b'{"type":"call"', b'{"type":"instructions"')
#: a compressed log's second line: where its call-detail lines were (``in_order``)
LAYOUT = b'{"type":"layout"'
STATE = b'{"type":"state_before"'


def _detail_last(lines: list[bytes]) -> list[bytes]:
    """A committed log's lines (without newlines) as its compressed form orders them: the
    header, a ``layout`` line saying where the moved lines were, the other records in
    order, then the state snapshot, then the call detail. Reading the tick without its
    calls (the report, ``sim log --tick N``, rewind) then stops decompressing at the
    snapshot, or just after it when the state is wanted."""
    lines = [line for line in lines if line.strip()]
    rest = lines[1:]
    detail = [i for i, line in enumerate(rest) if line.startswith(CALL_DETAIL)]
    late = [i for i, line in enumerate(rest) if line.startswith(STATE)]
    if not detail and not late:
        return lines
    moved = set(detail) | set(late)
    front = [line for i, line in enumerate(rest) if i not in moved]
    return [
        lines[0],
        layout_line(len(rest), detail, late),
        *front,
        *(rest[i] for i in late),
        *(rest[i] for i in detail),
    ]


def layout_line(total: int, detail: list[int], late: list[int]) -> bytes:
    """A compressed log's second line: how many lines follow it and, by their index in the
    order the tick wrote them, which were moved behind the others: ``state`` (its state
    snapshot, first) and ``detail`` (its call detail, last). A log compressed before
    ``state`` was moved has no ``state`` key: its snapshot is among the others."""
    return orjson.dumps({"type": "layout", "lines": total, "detail": detail, "state": late})


@dataclass(frozen=True)
class Layout:
    """A ``layout`` line read: ``total`` lines follow it; ``detail`` and ``state`` are the
    indices (in the order written) of the lines moved to the end, state before detail."""

    total: int
    detail: list[int]
    state: list[int]

    @property
    def front(self) -> int:
        """How many lines come before the moved ones."""
        return self.total - len(self.detail) - len(self.state)


def _indices(value: object, total: int) -> bool:
    """``value`` is a strictly increasing list of line indices below ``total``."""
    # checked by C loops: a layout lists every call of a big tick
    return (
        isinstance(value, list)
        and set(map(type, value)) <= {int}
        and value == sorted(set(value))
        and (not value or (value[0] >= 0 and value[-1] < total))
    )


def parse_layout(line: bytes, path: Path) -> Layout:
    """A ``layout`` line, checked against what it may say."""
    try:
        data = orjson.loads(line)
        total, detail, state = data["lines"], data["detail"], data.get("state", [])
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise LogError(f"{path}: line 2: not a valid layout record") from None
    if (
        not isinstance(total, int)
        or not _indices(detail, total)
        or not _indices(state, total)
        or set(detail) & set(state)
    ):
        raise LogError(f"{path}: line 2: the layout record does not fit the log")
    return Layout(total, detail, state)


def in_order(
    lines: list[bytes], path: Path, complete: bool = True, layout: Layout | None = None
) -> list[bytes]:
    """A compressed log's lines in the order the tick wrote them (undoes ``_detail_last``).

    ``complete=False``: ``lines`` are only the first ones of the log (at least up to its
    moved lines); what was not read is left out. ``layout``: its layout line, if read.
    """
    if len(lines) < 2 or not lines[1].startswith(LAYOUT):
        return lines
    if layout is None:
        layout = parse_layout(lines[1], path)
    rest = lines[2:]
    short = len(rest) < layout.front if not complete else len(rest) != layout.total
    if short:
        raise LogError(f"{path}: the log has {len(rest)} lines, its layout says {layout.total}")
    moved = [*layout.state, *layout.detail]
    if not complete and not layout.state:
        return [lines[0], *rest[: layout.front]]  # the front lines are in order already
    # each line read at the index the tick wrote it at (C loops: a big tick's log is
    # hundreds of thousands of lines)
    front_at = sorted(set(range(layout.total)).difference(moved))
    placed = [
        *zip(front_at, rest[: layout.front], strict=True),
        *zip(moved, rest[layout.front :], strict=False),  # only those read
    ]
    placed.sort(key=itemgetter(0))
    return [lines[0], *(line for _, line in placed)]


__all__ = [
    "CALL_DETAIL",
    "LAYOUT",
    "STATE",
    "Layout",
    "in_order",
    "layout_line",
    "parse_layout",
]
