"""Deleting evicted responses at the provider: after commit, retried until done, never lost.

A tick's evicted response ids go into ``.sim/pending_deletions.json`` as part of the tick's
atomic commit (with any still pending from earlier ticks). After the commit the runner tries
each deletion once; the file is then rewritten with the ones that failed (or removed), so a
deletion that fails is retried on a later tick and a crash at any point leaves the list
either before or after a deletion, never without an id that still needs deleting. A failed
deletion never blocks a tick. An id is only ever deleted through the provider that made it.
A 404 is a deletion already done (before a crash, say), except for a response the provider
made in this run (``response_missing``): that server does not keep what it is asked to,
which is reported (in the tick's notes), not taken as done; it is not retried.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from sim import safefs
from sim.errors import InputError
from sim.llm.errors import LLMAPIError, LLMError
from sim.llm.types import Adapter
from sim.storage.statefiles import PENDING_DELETIONS, deletions_problem

#: the pending list (``sim.storage.statefiles`` checks what it must hold)
PENDING = PENDING_DELETIONS

logger = logging.getLogger(__name__)

Entry = dict[str, Any]


def problem(root: Path) -> str | None:
    """Why the pending list cannot be read, or ``None`` (``sim check`` reports it)."""
    try:
        raw = safefs.read_optional(root, PENDING, 64 * 1024 * 1024)
    except (InputError, OSError) as exc:
        return str(exc)
    if raw is None:
        return None
    return deletions_problem(raw)


def load(root: Path) -> list[Entry]:
    """The deletions still pending from earlier ticks; a damaged list is set aside."""
    bad = problem(root)
    if bad is not None:
        logger.warning("%s: %s; its pending deletions are kept aside", PENDING, bad)
        os.replace(root / PENDING, root / (PENDING + ".bad"))  # moves a link, not its target
        return []
    raw = safefs.read_optional(root, PENDING)
    if raw is None:
        return []
    return [e for e in orjson.loads(raw).get("pending", []) if isinstance(e, dict)]


def encode(entries: list[Entry]) -> bytes | None:
    """The file's new content, ``None`` (delete it) when nothing is pending."""
    if not entries:
        return None
    return orjson.dumps({"pending": entries}, option=orjson.OPT_INDENT_2) + b"\n"


def merge(
    pending: list[Entry], provider: str, evicted: Iterable[tuple[str, str]], tick: int
) -> list[Entry]:
    out = list(pending)
    seen = {(e.get("provider"), e.get("response_id")) for e in out}
    for entity_key, response_id in evicted:
        if (provider, response_id) not in seen:
            seen.add((provider, response_id))
            out.append(
                {
                    "provider": provider,
                    "entity_key": entity_key,
                    "response_id": response_id,
                    "tick": tick,
                    "tries": 0,
                }
            )
    return out


async def flush(
    root: Path, adapter: Adapter, pending: list[Entry], missing: list[str] | None = None
) -> list[Entry]:
    """Try every pending deletion made by ``adapter``'s provider; keep the failures.

    Args:
        missing: where to report responses the server lost (404 for one this run made).

    Returns:
        What is still pending (also written to ``.sim/pending_deletions.json``).
    """
    if not pending:
        return []
    remaining: list[Entry] = []
    for entry in pending:
        if entry.get("provider") != adapter.name:
            remaining.append(entry)
            continue
        try:
            await adapter.delete_response(str(entry["response_id"]))
        except LLMAPIError as exc:
            if exc.code == "response_missing":  # lost by the server: said, not retried
                logger.warning("%s", exc.message)
                if missing is not None and exc.message not in missing:
                    missing.append(exc.message)
                continue
            if exc.status_code == 404:  # already gone (deleted before a crash): done
                continue
            remaining.append(
                {**entry, "tries": int(entry.get("tries", 0)) + 1, "last_error": exc.code}
            )
        except Exception as exc:  # never blocks the run: retried on a later tick
            reason = exc.code if isinstance(exc, LLMError) else repr(exc)
            remaining.append(
                {**entry, "tries": int(entry.get("tries", 0)) + 1, "last_error": str(reason)}
            )
    _write(root, encode(remaining))
    return remaining


def _write(root: Path, data: bytes | None) -> None:
    folder, _, name = PENDING.rpartition("/")
    with safefs.open_dir(root, folder.split("/"), create=True) as dir_fd:
        if data is None:
            safefs.unlink_at(dir_fd, name)
            return
        tmp = name + ".tmp"
        safefs.unlink_at(dir_fd, tmp)  # a planted link is removed, never written through
        safefs.write_at(dir_fd, tmp, root / PENDING, data)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
