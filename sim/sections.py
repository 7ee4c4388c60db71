"""Labelled sections: how the built-in phases write a model's input, and how it is read back.

A small model follows short labelled sections ("Who you are", "Where you are", "Who is
here") better than one compact JSON document. ``dumps`` writes a document (a dict built by
a phase) as sections, one per top-level key, titled from ``TITLES``:

- a mapping: one ``key: value`` line per entry;
- a list: one ``- item`` line per item;
- anything else: the value on its own line, as JSON.

A string is written as it is when it reads back as itself (one line, no surrounding space,
not itself JSON); any other value is JSON (``["a lamp", "a net"]``, ``{"id": "quay",
"name": "The Quay"}``, ``"3"``). So ``loads(dumps(doc)) == doc`` for the documents the
phases build, and the offline model (``sim.offline``) and tests read inputs back with
``loads``, which also takes plain JSON (a world's own ``*.input.md`` may write either).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

#: section title -> the document key it holds (titles are unique across the phases)
TITLES: dict[str, str] = {
    "tick": "Tick",
    "world": "The world",
    "character": "Who you are",
    "memory": "What you remember",
    "location": "Where you are",
    "exits": "Exits (move: target one of these ids)",
    "present": "Who is here (speak: target one of these ids)",
    "happenings": "Just happened here",
    "relationships": "Who you know (your relationships)",
    "contacts": "Contacts (message: target one of these ids, wherever they are)",
    "messages": "Messages you received",
    "characters": "Characters here, with what they intend",
    "events": "What each character meant to do, and what happened",
    "summary": "Their memory so far",
    "evicted": "Memories to fold in",
}
_KEYS = {title: key for key, title in TITLES.items()}
_HEAD = "## "


#: the ASCII characters a JSON text can begin with (a text with no surrounding space)
_JSON_STARTS = frozenset('{["-0123456789tfn')


def _value(value: Any) -> str:
    if isinstance(value, str) and value and value == value.strip() and "\n" not in value:
        first = value[0]
        if first.isascii() and first not in _JSON_STARTS:
            return value  # cannot be JSON: reads back as itself (most text; no parse tried)
        try:
            orjson.loads(value)
        except orjson.JSONDecodeError:
            return value  # reads back as itself
    return orjson.dumps(value).decode()


#: what JSON may put before a value
_JSON_SPACE = frozenset(" \t\n\r")
#: the ASCII characters a JSON text can begin with, its whitespace included
_MAYBE_JSON = _JSON_STARTS | _JSON_SPACE


def _read(text: str) -> Any:
    # a text whose first character is ASCII and can begin no JSON text (most text) is read
    # as itself without a parse: a failed parse raised a JSONDecodeError, ~5 µs each
    first = text[:1]
    if not first or (first.isascii() and first not in _MAYBE_JSON):
        return text
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _is_json(text: str) -> bool:
    first = text[:1]
    if not first or (first.isascii() and first not in _MAYBE_JSON):
        return False
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def dumps(doc: Mapping[str, Any]) -> str:
    """``doc`` as labelled sections, in its key order."""
    lines: list[str] = []
    for key, value in doc.items():
        if lines:
            lines.append("")
        lines.append(_HEAD + TITLES.get(key, key))
        if isinstance(value, Mapping):
            lines.extend(f"{k}: {_value(v)}" for k, v in value.items())
        elif isinstance(value, list):
            lines.extend(f"- {_value(item)}" for item in value)
            if not value:
                lines.append("(none)")
        else:
            lines.append(orjson.dumps(value).decode())  # a lone value is always JSON
    return "\n".join(lines)


def loads(text: str) -> dict[str, Any] | None:
    """A document back from ``dumps``'s sections, or from JSON; ``None`` when it is
    neither (free text)."""
    if text[:1] in "{[":
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        return data if isinstance(data, dict) else None
    if not text.startswith(_HEAD):
        return None
    doc: dict[str, Any] = {}
    for block in text.split("\n\n" + _HEAD):
        title, _, body = block.removeprefix(_HEAD).partition("\n")
        key = _KEYS.get(title, title)
        rows = body.split("\n") if body else []
        if rows == ["(none)"]:
            doc[key] = []
        elif body.startswith("- ") and body.count("\n") == body.count("\n- "):
            # every row starts with "- " (the first, and each one after a newline)
            doc[key] = [_read(row[2:]) for row in rows]
        elif len(rows) == 1 and _is_json(rows[0]):
            doc[key] = orjson.loads(rows[0])
        else:
            part: dict[str, Any] = {}
            for row in rows:
                name, sep, value = row.partition(": ")
                if not sep:
                    return None
                part[name] = _read(value)
            doc[key] = part
    return doc


__all__ = ["TITLES", "dumps", "loads"]
