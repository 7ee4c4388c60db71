"""Per-request enums: the values one request allows in some fields of its answer schema.

A phase's answer schema is one pydantic class for every request; the ids valid for one
request (the exits of this place, the characters present) differ from request to request.
Rather than a class per request (``pydantic.create_model`` costs milliseconds: measured in
``docs/providers.md``), a request carries ``SchemaEnums``: the fields, addressed by their path
from the root (property names, ``*`` for an array's items), and the values each allows.
``constrain`` writes them into a copy of the class's JSON Schema as ``enum``, which is what a
schema-enforcing server (llama.cpp and vLLM grammars, OpenAI strict mode) is sent; the
class itself still validates the answer, and the phase's answer check (``ModelRequest.check``)
rejects a value outside the enum whatever the server did.

A field whose list is longer than ``MAX_ENUM`` values is left unconstrained on the wire
(OpenAI's documented limits: 1,000 enum values in a schema, and a length cap on an enum of
more than 250): the answer check still holds it to the list.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]

#: the most values one field's enum is sent with (more: checked, not sent)
MAX_ENUM = 250


@dataclass(frozen=True, slots=True)
class EnumField:
    """One constrained field: where it is and what it may hold.

    Attributes:
        path: property names from the schema's root; ``*`` steps into an array's items.
        values: the strings the field may hold (a nullable field may also be null).
    """

    path: tuple[str, ...]
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SchemaEnums:
    """The constrained fields of one request's answer schema."""

    fields: tuple[EnumField, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.fields)


def constrain(schema: Json, enums: SchemaEnums | None) -> Json:
    """``schema`` with each field of ``enums`` limited to its values: a new dict when there
    is anything to write (``schema`` itself is never changed), else ``schema``.

    A nullable field keeps its ``null``; one with no values left is null only; a field
    with no values that cannot be null, or more than ``MAX_ENUM`` values, or a path the
    schema does not have, is left as it is (the answer check still holds it).
    """
    if not enums:
        return schema
    out = copy.deepcopy(schema)
    for field in enums.fields:
        if len(field.values) > MAX_ENUM:
            continue
        node = _find(out, out, field.path)
        if node is not None:
            _limit(node, field.values)
    return out


def _resolve(root: Json, node: Json) -> Json:
    """``node`` with a local ``$ref`` followed (pydantic puts nested models in ``$defs``)."""
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for key in ref[2:].split("/"):
            if not isinstance(target, dict) or key not in target:
                return node
            target = target[key]
        if isinstance(target, dict):
            return target
    return node


def _container(root: Json, node: Json) -> Json:
    """The object or array schema inside ``node`` (through a ``$ref``, or the non-null
    branch of an ``anyOf``)."""
    node = _resolve(root, node)
    for branch in node.get("anyOf") or ():
        if isinstance(branch, dict) and branch.get("type") != "null":
            return _resolve(root, branch)
    return node


def _find(root: Json, node: Json, path: tuple[str, ...]) -> Json | None:
    for step in path:
        node = _container(root, node)
        nxt = node.get("items") if step == "*" else (node.get("properties") or {}).get(step)
        if not isinstance(nxt, dict):
            return None
        node = nxt
    return node


def _limit(node: Json, values: tuple[str, ...]) -> None:
    """Write the enum into a string field (or the string branch of a nullable one)."""
    branches = node.get("anyOf")
    if isinstance(branches, list):
        nullable = any(isinstance(b, dict) and b.get("type") == "null" for b in branches)
        strings = [b for b in branches if isinstance(b, dict) and b.get("type") == "string"]
        if not strings:
            return
        if not values:
            if nullable:
                node["anyOf"] = [b for b in branches if b not in strings]
            return
        for branch in strings:
            branch["enum"] = list(values)
        return
    if node.get("type") == "string" and values:
        node["enum"] = list(values)


__all__ = ["MAX_ENUM", "EnumField", "SchemaEnums", "constrain"]
