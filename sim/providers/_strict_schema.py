"""A pydantic model's JSON schema in the strict form OpenAI-style structured outputs take.

Strict mode (``"strict": true`` on a ``json_schema`` format) accepts a subset of JSON
Schema: every object closed (``additionalProperties: false``) and every property listed in
``required`` (optional fields stay nullable through their ``anyOf`` with ``null``), no
``$ref`` beside other keys, no ``null`` defaults. This is sim's own copy of the conversion
the ``openai`` SDK keeps in a private module (``openai.lib._pydantic``, Apache-2.0), so a
change there cannot break both adapters at import; ``tests/providers/test_strict_schema.py``
pins its output on the phase schemas.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

__all__ = ["to_strict_json_schema", "without_lengths"]

_MISSING = object()


def to_strict_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema (pydantic's, mode "validation") made strict; a new dict.

    Raises:
        TypeError: ``model`` is not a pydantic model class, or its schema has a
            non-object where a schema is expected.
        ValueError: a ``$ref`` does not point inside the schema.
    """
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"expected a pydantic model class, got {model!r}")
    schema = copy.deepcopy(model.model_json_schema())
    return _strict(schema, path=(), root=schema)


def _strict(node: object, *, path: tuple[str, ...], root: dict[str, Any]) -> dict[str, Any]:
    """Make ``node`` (a schema inside ``root``) strict in place; returns it."""
    if not isinstance(node, dict):
        raise TypeError(f"expected a JSON schema object at {'/'.join(path) or '#'}, got {node!r}")
    for key in ("$defs", "definitions"):
        defs = node.get(key)
        if isinstance(defs, dict):
            for name, sub in defs.items():
                _strict(sub, path=(*path, key, name), root=root)

    if node.get("type") == "object" and "additionalProperties" not in node:
        node["additionalProperties"] = False

    properties = node.get("properties")
    if isinstance(properties, dict):
        node["required"] = list(properties)
        node["properties"] = {
            name: _strict(sub, path=(*path, "properties", name), root=root)
            for name, sub in properties.items()
        }

    items = node.get("items")
    if isinstance(items, dict):
        node["items"] = _strict(items, path=(*path, "items"), root=root)

    any_of = node.get("anyOf")
    if isinstance(any_of, list):
        node["anyOf"] = [
            _strict(sub, path=(*path, "anyOf", str(i)), root=root) for i, sub in enumerate(any_of)
        ]

    all_of = node.get("allOf")
    if isinstance(all_of, list):
        if len(all_of) == 1:
            node.update(_strict(all_of[0], path=(*path, "allOf", "0"), root=root))
            node.pop("allOf")
        else:
            node["allOf"] = [
                _strict(sub, path=(*path, "allOf", str(i)), root=root)
                for i, sub in enumerate(all_of)
            ]

    # a null default says nothing a nullable type does not already say
    if node.get("default", _MISSING) is None:
        node.pop("default")

    # strict mode rejects a $ref with siblings ({"$ref": ..., "description": ...}):
    # inline the target, the node's own keys winning, and make the result strict too
    ref = node.get("$ref")
    if ref and len(node) > 1:
        if not isinstance(ref, str):
            raise TypeError(f"$ref at {'/'.join(path) or '#'} is not a string: {ref!r}")
        target = _resolve(root, ref)
        node.update({**target, **node})
        node.pop("$ref")
        return _strict(node, path=path, root=root)
    return node


def _resolve(root: dict[str, Any], ref: str) -> dict[str, Any]:
    if not ref.startswith("#/"):
        raise ValueError(f"unexpected $ref {ref!r}: only local refs (#/...) are supported")
    node: object = root
    for key in ref[2:].split("/"):
        if not isinstance(node, dict) or key not in node:
            raise ValueError(f"$ref {ref!r} does not resolve inside the schema")
        node = node[key]
    if not isinstance(node, dict):
        raise ValueError(f"$ref {ref!r} resolves to {node!r}, not a schema object")
    return node


#: string keywords OpenAI's strict mode does not document (the answer is still validated
#: against them by the pydantic class)
_LENGTH_KEYWORDS = ("maxLength", "minLength")


def without_lengths(schema: dict[str, Any], keep_up_to: int = 0) -> dict[str, Any]:
    """``schema`` (strict) without the string length keywords over ``keep_up_to``
    characters (``0``: without any), for a server that does not take them or not that
    long; a new dict, ``schema`` unchanged. The class still validates the lengths, so a
    longer answer is a schema error fed back to the model."""
    out = copy.deepcopy(schema)
    _drop_lengths(out, keep_up_to)
    return out


def _drop_lengths(node: object, keep_up_to: int) -> None:
    if not isinstance(node, dict):
        return
    if node.get("type") == "string":
        for key in _LENGTH_KEYWORDS:
            if key in node and not (isinstance(node[key], int) and node[key] <= keep_up_to):
                del node[key]
    for key in ("$defs", "definitions", "properties"):
        sub = node.get(key)
        if isinstance(sub, dict):
            for child in sub.values():
                _drop_lengths(child, keep_up_to)
    _drop_lengths(node.get("items"), keep_up_to)
    for branch in node.get("anyOf") or ():
        _drop_lengths(branch, keep_up_to)
