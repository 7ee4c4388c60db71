"""Deleting evicted responses at the provider: after commit, retried until done, never lost.

A tick's evicted response ids go into ``.sim/pending_deletions.json`` as part of the tick's
atomic commit (with any still pending from earlier ticks). After the commit the runner tries
each deletion once; the file is then rewritten with the ones that failed (or removed), so a
deletion that fails is retried on a later tick and a crash at any point leaves the list
either before or after a deletion, never without an id that still needs deleting. A failed
deletion never blocks a tick. An id is only ever deleted through the provider that made it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from sim.llm.errors import LLMAPIError, LLMError
from sim.llm.types import Adapter

PENDING = ".sim/pending_deletions.json"

logger = logging.getLogger(__name__)

Entry = dict[str, Any]


def load(root: Path) -> list[Entry]:
    """The deletions still pending from earlier ticks."""
    try:
        data = orjson.loads((root / PENDING).read_bytes())
    except FileNotFoundError:
        return []
    except orjson.JSONDecodeError:
        logger.warning("%s is not valid JSON; its pending deletions are kept aside", PENDING)
        (root / PENDING).rename(root / (PENDING + ".bad"))
        return []
    return [e for e in data.get("pending", []) if isinstance(e, dict)]


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


async def flush(root: Path, adapter: Adapter, pending: list[Entry]) -> list[Entry]:
    """Try every pending deletion made by ``adapter``'s provider; keep the failures.

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
    path = root / PENDING
    if data is None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
