"""What a commit journal may hold: every file it would write checked before any is applied.

``sim.storage.journal`` refuses a journal whose *paths* are unsafe. A world folder is untrusted,
though, and ``.sim/journal.json`` is part of it: a journal that obeys the path rules could
still overwrite an entity with garbage, delete ``world.json`` or replace a committed log
with junk. So its *contents* must be what a commit writes. The commits that write one:

- a tick: ``world.json``, the entities it changed, response-store files, the pending
  deletions, the interventions file removed, and the tick's commit marker;
- ``sim inject`` / ``sim set``: the interventions file (and the entity set);
- ``sim tick --seed``: ``world.json``;
- ``sim rewind``: state files written or removed, and each later tick's log moved aside:
  its plain JSONL copy written to ``.sim/log/rewound-<k>/``, the log removed.

``journal_problems`` checks everything but the entities and ``world.json``'s content,
which ``Storage.load`` validates as it reads the world through the journal (blaming the
journal for a problem in a file it writes). Anything else is refused, and with it the
whole journal: nothing of it is applied.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from sim.errors import InputError, LogError
from sim.storage.statefiles import (
    PENDING_DELETIONS,
    deletions_problem,
    parse_pending,
    store_problem,
)
from sim.ticklog.format import INTERVENTIONS, LOG_DIR, STORE_DIR
from sim.ticklog.reader import parse_records, read_log_bytes
from sim.ticklog.records import CommitRecord, HeaderRecord

_MARKER = re.compile(rf"{re.escape(LOG_DIR)}/tick-([0-9]{{6,}})\.commit\.json")
_LOG = re.compile(rf"{re.escape(LOG_DIR)}/tick-([0-9]{{6,}})\.jsonl(?:\.gz|\.zst)?")
_MOVED = re.compile(rf"{re.escape(LOG_DIR)}/rewound-[0-9]+/tick-([0-9]{{6,}})\.jsonl")


def journal_problems(root: Path, files: Mapping[str, bytes | None]) -> list[str]:
    """Each file of a journal that no commit would write, as ``path: what is wrong``.

    ``files`` passed ``sim.storage.journal``'s path checks already (every path is one of
    ``COMMIT_PATHS``, with no link on it).
    """
    removed_logs: dict[int, list[str]] = {}
    moved: dict[int, tuple[str, bytes]] = {}
    problems: list[str] = []
    for rel, data in files.items():
        problem = _file_problem(rel, data)
        if problem is not None:
            problems.append(f"{rel}: {problem}")
            continue
        if (log := _LOG.fullmatch(rel)) is not None:
            removed_logs.setdefault(int(log.group(1)), []).append(rel)
        elif (copy := _MOVED.fullmatch(rel)) is not None and data is not None:
            tick = int(copy.group(1))
            if tick in moved:
                problems.append(f"{rel}: tick {tick}'s log is moved aside twice")
            moved[tick] = (rel, data)
    for tick, rels in removed_logs.items():
        if tick not in moved:
            problems.append(
                f"{rels[0]}: removes a committed tick log without moving it aside "
                "(only `sim rewind` removes one, keeping its copy in .sim/log/rewound-<k>/)"
            )
    for tick, (rel, data) in moved.items():
        if tick not in removed_logs:
            problems.append(f"{rel}: a copy of tick {tick}'s log, but that log is not moved")
            continue
        problem = _moved_log_problem(root, tick, removed_logs[tick], rel, data)
        if problem is not None:
            problems.append(f"{rel}: {problem}")
    return problems


def _file_problem(rel: str, data: bytes | None) -> str | None:
    """What is wrong with one file of a journal on its own, or ``None``."""
    if rel == "world.json":
        return "a commit never deletes world.json" if data is None else None
    if rel.startswith(("characters/", "locations/")):
        return None  # validated by Storage.load, through the journal
    if rel.startswith(STORE_DIR + "/"):
        return None if data is None else store_problem(data)
    if rel == PENDING_DELETIONS:
        return None if data is None else deletions_problem(data)
    if rel == INTERVENTIONS:
        if data is None:
            return None
        try:
            parse_pending(data, Path(rel))
        except InputError as exc:
            return f"not a pending interventions file: {exc.problem}"
        return None
    if (marker := _MARKER.fullmatch(rel)) is not None:
        if data is None:
            return "a commit never removes a commit marker"
        try:
            record = CommitRecord.model_validate_json(data)
        except ValidationError as exc:
            return f"not a commit marker ({str(exc).splitlines()[0]})"
        if record.tick != int(marker.group(1)):
            return f"the marker of tick {record.tick}, under another tick's name"
        return None
    if _LOG.fullmatch(rel) is not None:
        if data is not None:
            return "a commit never writes a committed tick log (a rewind only moves one aside)"
        return None
    if _MOVED.fullmatch(rel) is not None:
        return "a commit never removes a rewound log" if data is None else None
    return "not a file a commit writes"  # COMMIT_PATHS and this module disagree: refuse


def _moved_log_problem(
    root: Path, tick: int, removed: list[str], rel: str, data: bytes
) -> str | None:
    """A log moved aside must be that log: the same lines while it is still there, else
    (a crash removed it after the journal's commit point) a readable log of that tick."""
    for original in removed:
        path = root / original
        if os.path.lexists(path):
            try:
                same = read_log_bytes(path) == data
            except LogError as exc:
                return f"moves aside a log that cannot be read ({exc})"
            return None if same else f"is not the log it moves aside ({original})"
    try:
        records, torn = parse_records(data.splitlines(keepends=True), Path(rel))
    except LogError as exc:
        return f"not a tick log ({exc})"
    head = records[0] if records else None
    if torn or not isinstance(head, HeaderRecord) or head.tick != tick:
        return f"not a whole log of tick {tick}"
    return None


__all__ = ["journal_problems"]
