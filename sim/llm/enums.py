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

Some fields' valid values depend on another field: an intention's target is an exit when
the action is ``move``, someone present when it is ``speak``. ``SchemaEnums.cases`` says so
(``EnumCases``), and ``constrain(..., grammar=True)`` writes the schema as one branch per value
of the deciding field (a root ``anyOf`` of objects, each with its action and that action's
targets), so a grammar-bound model cannot pair an action with another action's id (Gemma 3
270M did in about half its intentions with one flat enum). A root ``anyOf`` is what
llama.cpp's and vLLM's grammar builders compile; OpenAI's strict mode, Gemini's and
Anthropic's tool schemas want an object at the root, so they get the flat enum
(``grammar=False``) and the answer check pairs them instead.

Some arrays should hold one item per id: a resolution gives one outcome to each
character present. ``SchemaEnums.each`` says so (``EnumEach``), and
``constrain(..., grammar=True)`` writes the array as a tuple (``prefixItems``), item ``i``
naming the ``i``-th id, so a grammar-bound model can neither skip a character nor invent
one (Gemma 3 270M gave outcomes to ``"1"`` and ``"2"`` and none to those present). OpenAI's
strict mode does not take ``prefixItems``; there the answer check holds the array to the
ids, and asks again naming them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]

#: the most values one field's enum is sent with (more: checked, not sent)
MAX_ENUM = 250
#: the most items an ``EnumEach`` array is sent as a tuple with (each item a copy of the
#: item schema; more: the flat enum is sent, and the answer check holds the rest)
MAX_EACH = 32


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
class EnumCases:
    """A root field whose values depend on another root field's value.

    Attributes:
        key: the deciding field (``action``); its values are read from the schema's
            ``enum`` (or ``const``).
        field: the field that depends on it (``target``).
        cases: per value of ``key``, the values ``field`` may then hold; an empty tuple:
            null only. A value of ``key`` not listed keeps ``field`` as the flat enum has
            it (a world's own verbs: anything here, or null).
        omit: values of ``key`` that no answer may take here (``move`` with no exit).
    """

    key: str
    field: str
    cases: tuple[tuple[str, tuple[str, ...]], ...]
    omit: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EnumEach:
    """An array that holds one item for each of some ids, in their order.

    Attributes:
        path: the array's path from the root (as ``EnumField.path``).
        field: the item's field that names the id (``character_id``).
        values: the ids, one item each.
    """

    path: tuple[str, ...]
    field: str
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SchemaEnums:
    """The constrained fields of one request's answer schema, the pairing of two of them
    where one decides the other (``cases``), and an array of one item per id (``each``)."""

    fields: tuple[EnumField, ...] = ()
    cases: EnumCases | None = None
    each: EnumEach | None = None

    def __bool__(self) -> bool:
        return bool(self.fields)


def constrain(schema: Json, enums: SchemaEnums | None, *, grammar: bool = False) -> Json:
    """``schema`` with each field of ``enums`` limited to its values: a new dict when there
    is anything to write (``schema`` itself is never changed), else ``schema``.

    A nullable field keeps its ``null``; one with no values left is null only; a field
    with no values that cannot be null, or more than ``MAX_ENUM`` values, or a path the
    schema does not have, is left as it is (the answer check still holds it).

    Args:
        grammar: also write the forms a server that builds a grammar from the schema
            compiles (llama.cpp, vLLM): ``enums.cases`` as a root ``anyOf`` of one branch
            per value of its key, ``enums.each`` as a tuple (see the module doc);
            ``False``: the flat enums only.
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
    if grammar and enums.each is not None:
        _tuple(out, enums.each)
    if grammar and enums.cases is not None:
        return _branched(out, enums.cases)
    return out


def _tuple(root: Json, each: EnumEach) -> None:
    """Write ``each``'s array as a tuple of one item per id: ``prefixItems``, each a copy
    of the item schema with ``each.field`` that id alone, and as many items as ids. Left
    as it is when the array is not found, its item has no such field, or there are more
    than ``MAX_EACH`` ids."""
    if len(each.values) > MAX_EACH:
        return
    node = _find(root, root, each.path)
    if node is None:
        return
    array = _container(root, node)
    items = array.get("items")
    if array.get("type") != "array" or not isinstance(items, dict):
        return
    item = _resolve(root, items)
    props = item.get("properties")
    if not isinstance(props, dict) or not isinstance(props.get(each.field), dict):
        return
    tuple_items = []
    for value in each.values:
        one = copy.deepcopy(item)
        kept = {k: v for k, v in props[each.field].items() if k == "description"}
        one["properties"][each.field] = {**kept, "type": "string", "enum": [value]}
        tuple_items.append(one)
    for name in ("items", "minItems", "maxItems"):
        array.pop(name, None)
    # no ``items: false`` after them: llama.cpp's C++ grammar builder reads ``items``
    # before ``prefixItems`` and would compile ``false`` as the item; the bounds say it
    array["prefixItems"] = tuple_items
    array["minItems"] = array["maxItems"] = len(tuple_items)


def _branched(schema: Json, cases: EnumCases) -> Json:
    """``schema`` (an object) as a root ``anyOf``: one branch per value of ``cases.key``,
    each with that value alone and ``cases.field`` limited to its case; ``schema`` as it
    is when it has not both fields, or a key without an ``enum`` of strings."""
    props = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(props, dict):
        return schema
    key, field = props.get(cases.key), props.get(cases.field)
    if not isinstance(key, dict) or not isinstance(field, dict):
        return schema
    values = key.get("enum", [key["const"]] if "const" in key else None)
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return schema
    table = dict(cases.cases)
    defs = schema.get("$defs")
    body = {name: part for name, part in schema.items() if name != "$defs"}
    branches: list[Json] = []
    for value in values:
        if value in cases.omit:
            continue
        branch = copy.deepcopy(body)
        branch["properties"][cases.key] = {**key, "enum": [value]}
        allowed = table.get(value)
        if allowed is not None:
            branch["properties"][cases.field] = _only(field, allowed)
        branches.append(branch)
    if not branches:
        return schema
    out: Json = {"anyOf": branches}
    if "title" in schema:  # what the answer is (the offline model and stub read it)
        out["title"] = schema["title"]
    if defs is not None:
        out["$defs"] = defs
    return out


def _only(field: Json, values: tuple[str, ...]) -> Json:
    """A field that holds one of ``values`` (none: null only), keeping its description."""
    kept = {name: part for name, part in field.items() if name == "description"}
    if not values:
        return {**kept, "type": "null"}
    if len(values) > MAX_ENUM:
        return {**kept, "type": "string"}
    return {**kept, "type": "string", "enum": list(values)}


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


__all__ = [
    "MAX_EACH",
    "MAX_ENUM",
    "EnumCases",
    "EnumEach",
    "EnumField",
    "SchemaEnums",
    "constrain",
]
