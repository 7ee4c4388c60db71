"""What a world file's text may be beyond its JSON: nested at most ``MAX_DEPTH`` levels, no
key repeated within one object (orjson keeps the last silently, and a save would lose the
first), no integer beyond 64 bits (orjson reads one as a float, which a save would change).

``sim.storage.store`` runs these on every entity file and ``world.json`` it loads, before
pydantic's checks; each is cheap in the common case (a file in the form a commit writes).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

#: deepest nesting kept in an entity file: orjson writes at most 254 levels, and deeper
#: input would load and validate but fail the save after the tick's calls were paid for
MAX_DEPTH = 200


# orjson reads integers beyond 64 bits as floats, which would silently change them on save:
# files with a long run of digits are checked with the stdlib parser (cheap pre-filter).
DIGITS_ONLY = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))
LONG_DIGITS = b"0" * 19


def find_big_int(value: Any, path: str = "") -> str | None:
    """The dotted path of the first integer outside the signed 64-bit range, if any."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return path if not -(2**63) <= value < 2**64 else None
    items: Any = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        found = find_big_int(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


#: bytes that, present, send the duplicate-key check to the exact (slower) parse: a unicode
#: escape, or blank space just before a colon (a key not written as ``"key":``)
_UNICODE_ESCAPE = b"\\u"
_BLANK_COLON = (b" :", b"\t:", b"\n:", b"\r:")


def _depth(data: Any) -> int:
    """Deepest nesting of parsed JSON, without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in value.values() if isinstance(v, (dict, list)))
        elif isinstance(value, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in value if isinstance(v, (dict, list)))
    return deepest


def _first_duplicate(raw: bytes) -> tuple[str, str] | None:
    """(dotted path of the object, key) of the first key repeated within one object."""
    found: list[tuple[str, str]] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen and not found:
                found.append(("", key))
            seen.add(key)
        return dict(items)

    json.loads(raw, object_pairs_hook=pairs)
    return found[0] if found else None


def _is_dump(raw: bytes, data: dict[str, Any]) -> bool:
    """Whether ``raw`` is ``dump_json(data)``, the one format of world files (what a commit
    writes): then it holds each key of ``data`` once, no key repeated (about 1 µs a KB,
    half the counts below)."""
    dumped = orjson.dumps(data, option=orjson.OPT_INDENT_2)
    return len(raw) == len(dumped) + 1 and raw.startswith(dumped) and raw.endswith(b"\n")


def shape_problem(raw: bytes, data: dict[str, Any]) -> tuple[str | None, str] | None:
    """(field, problem) if the file nests too deep or repeats a key within an object.

    Cheap in the common case: the bracket count bounds the depth; a file in the format a
    commit writes is the dump of ``data`` (``_is_dump``); and when every key in the text
    is written ``"key":`` with no unicode escape, the text holds as many ``":`` as orjson's
    compact dump of the parsed data unless a key was repeated (orjson silently keeps the
    last value), because text inside strings appears identically in both. Otherwise the
    file is parsed again keeping every pair.
    """
    if raw.count(b"{") + raw.count(b"[") > MAX_DEPTH:
        deepest = _depth(data)
        if deepest > MAX_DEPTH:
            return None, f"nested {deepest} levels deep; at most {MAX_DEPTH} are kept"
    if _is_dump(raw, data):
        return None
    keys = raw.count(b'":')
    plain = _UNICODE_ESCAPE not in raw and (
        raw.count(b":") == keys or not any(m in raw for m in _BLANK_COLON)
    )
    suspect = not plain or keys > orjson.dumps(data).count(b'":')
    if suspect:
        duplicate = _first_duplicate(raw)
        if duplicate is not None:
            return None, (
                f"key {duplicate[1]!r} appears twice in one object; the first value would "
                "be lost on save: keep one"
            )
    return None
