"""The engine's state files under ``.sim`` and what each must hold to be one the engine
wrote: the pending deletions, the response store's files and the pending interventions.

These checks sit below ``sim.storage.store`` so that it can refuse a commit journal that would
write anything else (``sim.storage.journalcheck``); the modules that own each file
(``sim.engine.deletions``, ``sim.engine.repair``, ``sim.interventions``) use them too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from sim.errors import InputError
from sim.ticklog.records import InterventionRecord

#: the deletions of evicted responses still to be made (``sim.engine.deletions``)
PENDING_DELETIONS = ".sim/pending_deletions.json"
#: the longest event text ``sim inject`` takes
MAX_TEXT = 4000
#: the most interventions that may wait for one tick
MAX_PENDING = 1000
#: the pending interventions file's format version
PENDING_VERSION = 1


def deletions_problem(raw: bytes) -> str | None:
    """Why the pending list's bytes are not a list the engine writes, or ``None``."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return f"not valid JSON ({exc})"
    if not isinstance(data, dict) or not isinstance(data.get("pending", []), list):
        return 'expected {"pending": [...]}'
    return None


def _store_entry_ok(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("input"), str)
        and isinstance(value.get("output"), str)
    )


def store_problem(raw: bytes) -> str | None:
    """Why a response-store file's bytes are not one the engine wrote, or ``None``."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return f"not valid JSON ({exc})"
    if not isinstance(data, dict):
        return f"expected an object of exchanges by response id, got {type(data).__name__}"
    for rid, entry in data.items():
        if not _store_entry_ok(entry):
            return f"exchange {rid!r} is not an object with text 'input' and 'output'"
    return None


def parse_pending(raw: bytes, path: Path) -> list[InterventionRecord]:
    """The records of a pending file's bytes.

    Raises:
        InputError: not ``{"version": 1, "interventions": [...]}`` of intervention records.
    """
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(path, None, f"malformed JSON: {exc}") from None
    if (
        not isinstance(data, dict)
        or data.get("version") != PENDING_VERSION
        or not isinstance(data.get("interventions"), list)
    ):
        raise InputError(
            path, None, 'expected {"version": 1, "interventions": [...]} (written by sim)'
        )
    if len(data["interventions"]) > MAX_PENDING:
        raise InputError(path, "interventions", f"at most {MAX_PENDING} may wait for a tick")
    out: list[InterventionRecord] = []
    for i, item in enumerate(data["interventions"]):
        try:
            record = InterventionRecord.model_validate(item)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in (i, *err["loc"]))
            raise InputError(path, f"interventions.{where}", err["msg"].lower()) from None
        if record.kind == "inject" and not record.text:
            raise InputError(path, f"interventions.{i}.text", "an inject needs its text")
        if record.text is not None and len(record.text) > MAX_TEXT:
            raise InputError(path, f"interventions.{i}.text", f"at most {MAX_TEXT} characters")
        out.append(record)
    return out
