"""A declared phase's answer schema: a JSON Schema file turned into a pydantic model.

The structured-output path validates answers with a pydantic model, so a world's JSON Schema
becomes one with ``create_model``. Only a subset is supported, the one every structured-output
provider accepts: ``object`` (``properties``, ``required``, ``additionalProperties: false``),
``string`` (``enum``, ``minLength``, ``maxLength``), ``number`` and ``integer`` (``minimum``,
``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``, ``enum``), ``boolean``, ``array``
(``items``, ``minItems``, ``maxItems``) and nested objects, with ``title`` and
``description`` anywhere. Anything else is refused by name, so a schema never means more to
the user than to the engine.

A string without ``maxLength`` is capped at ``MAX_STRING`` characters (a model's answer is
written into the world). What a schema may demand is bounded, so that no schema makes an
answer (the offline model's, or ``sim check``'s sample) too big to build: ``minItems`` and
``maxItems`` at most ``MAX_ITEMS``, ``minLength`` and ``maxLength`` at most ``MAX_LENGTH``,
nesting at most ``MAX_DEPTH`` levels, at most ``MAX_NODES`` schemas in all, and the least
answer that fills every field at most ``MAX_LEAST_ANSWER`` characters of JSON
(``least_answer_chars``); a schema past one is refused by file and field, as is a minimum
above its maximum (no answer could fit).

One keyword of sim's own: ``"x-sim-ref"`` on a string marks it as a reference to
something in the world (``REF_KINDS``): the ids valid for each request are sent as its
``enum`` (or only checked; ``[llm] constrain_refs``) and an answer naming anything else is
re-asked, then falls back (``sim.phases.refs``). ``ref_fields`` lists the marked fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, create_model

from sim.errors import InputError

_COMMON = {"type", "title", "description"}
ALLOWED = {
    "object": _COMMON | {"properties", "required", "additionalProperties"},
    "string": _COMMON | {"enum", "minLength", "maxLength", "x-sim-ref"},
    "number": _COMMON | {"enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "integer": _COMMON | {"enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "boolean": _COMMON,
    "array": _COMMON | {"items", "minItems", "maxItems"},
}
_ROOT_EXTRA = {"$schema", "$id"}
#: the keyword marking a string as a reference, and what it may name: any character or
#: location of the world, the characters at the subject's place (``present``), its exits
#: (``exit``), the objects there and those a character subject carries (``object``)
REF_KEYWORD = "x-sim-ref"
REF_KINDS = ("character", "location", "present", "exit", "object")
#: titles the offline model answers with sim's own skills; a declared schema never uses one
RESERVED_TITLES = frozenset(
    {
        "Intention",
        "Resolution",
        "Narrative",
        "MemorySummary",
        "Reflection",
        "Utterance",
        "Plan",
        "ToolCalls",
    }
)
#: how deep a schema may nest (the root is level 0)
MAX_DEPTH = 8
#: the length cap of a string whose schema sets none (``maxLength``): what a model writes
#: into the world is bounded, and a grammar-bound model cannot ramble past it
MAX_STRING = 2000
#: the most ``minItems``/``maxItems`` may say
MAX_ITEMS = 1000
#: the most ``minLength``/``maxLength`` may say
MAX_LENGTH = 100_000
#: the most nodes (every property's and every array's items' schema, at every level) a
#: schema may hold: each object becomes a model, and a schema file of 1 MB could otherwise
#: hold tens of thousands
MAX_NODES = 1000
#: the most characters (of JSON) the least answer filling every field may take: each array
#: at its ``minItems``, each string at its ``minLength``, every property present
MAX_LEAST_ANSWER = 200_000


def _at(where: str, key: str) -> str:
    """The dotted path of ``key`` inside the node at ``where`` ("" is the root)."""
    return f"{where}.{key}" if where else key


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.replace("-", "_").split("_")) or "Answer"


class _Builder:
    def __init__(self, source: Path) -> None:
        self.source = source
        self.nodes = 0
        #: every model made, in the order made (the root last)
        self.made: list[type[BaseModel]] = []

    def fail(self, where: str, problem: str) -> InputError:
        return InputError(self.source, where or "(root)", problem)

    def node(self, node: Any, where: str, name: str, depth: int) -> Any:
        """The Python type for one schema node."""
        if depth > MAX_DEPTH:
            raise self.fail(where, f"nested deeper than {MAX_DEPTH} levels")
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.fail(
                where, f"more than {MAX_NODES:,} schemas in one (properties and items, nested)"
            )
        if not isinstance(node, dict):
            raise self.fail(where, "expected a JSON Schema object")
        kind = node.get("type")
        if not isinstance(kind, str) or kind not in ALLOWED:
            raise self.fail(
                _at(where, "type"),
                f"expected one of {', '.join(ALLOWED)} (got {kind!r}); "
                "type lists, $ref, anyOf, oneOf and allOf are not supported",
            )
        allowed = ALLOWED[kind] | (_ROOT_EXTRA if depth == 0 else set())
        for key in node:
            if key not in allowed:
                raise self.fail(
                    _at(where, key),
                    f"unsupported JSON Schema keyword {key!r} for type {kind!r}",
                )
        if REF_KEYWORD in node and node[REF_KEYWORD] not in REF_KINDS:
            raise self.fail(
                _at(where, REF_KEYWORD),
                f"expected one of {', '.join(REF_KINDS)} (got {node[REF_KEYWORD]!r})",
            )
        if "enum" in node:
            values = node["enum"]
            py: tuple[type, ...] = {"string": (str,), "number": (int, float), "integer": (int,)}[
                kind
            ]
            if (
                not isinstance(values, list)
                or not values
                or not all(isinstance(v, py) and not isinstance(v, bool) for v in values)
            ):
                raise self.fail(_at(where, "enum"), f"expected a non-empty list of {kind} values")
            return Literal[tuple(values)]
        if kind == "string":
            low, high = self._range(node, "minLength", "maxLength", MAX_LENGTH, where)
            return Annotated[str, Field(min_length=low, max_length=high or MAX_STRING)]
        if kind in ("number", "integer"):
            bounds: dict[str, Any] = {}
            for key, arg in (
                ("minimum", "ge"),
                ("maximum", "le"),
                ("exclusiveMinimum", "gt"),
                ("exclusiveMaximum", "lt"),
            ):
                if key in node:
                    value = node[key]
                    if isinstance(value, bool) or not isinstance(value, int | float):
                        raise self.fail(_at(where, key), "expected a number")
                    bounds[arg] = value
            base: type = int if kind == "integer" else float
            return Annotated[base, Field(**bounds)]
        if kind == "boolean":
            return bool
        if kind == "array":
            if "items" not in node:
                raise self.fail(where, "an array needs 'items'")
            low, high = self._range(node, "minItems", "maxItems", MAX_ITEMS, where)
            item = self.node(node["items"], _at(where, "items"), name, depth + 1)
            return Annotated[
                list[item],  # type: ignore[valid-type]
                Field(min_length=low, max_length=high),
            ]
        return self.model(node, where, name, depth)

    def _int(self, node: dict[str, Any], key: str, where: str, limit: int) -> int | None:
        value = node.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(_at(where, key), "expected a non-negative integer")
        if value > limit:
            raise self.fail(_at(where, key), f"at most {limit:,} (got {value:,})")
        return value

    def _range(
        self, node: dict[str, Any], low_key: str, high_key: str, limit: int, where: str
    ) -> tuple[int | None, int | None]:
        """A bounded ``(minimum, maximum)`` pair of counts (``minItems``, ``maxItems``)."""
        low = self._int(node, low_key, where, limit)
        high = self._int(node, high_key, where, limit)
        if low is not None and high is not None and low > high:
            raise self.fail(
                _at(where, low_key), f"above {high_key} ({low:,} > {high:,}): no answer fits"
            )
        return low, high

    def model(self, node: dict[str, Any], where: str, name: str, depth: int) -> type[BaseModel]:
        props = node.get("properties", {})
        if not isinstance(props, dict) or not props:
            raise self.fail(_at(where, "properties"), "an object needs at least one property")
        if node.get("additionalProperties", False) is not False:
            raise self.fail(
                _at(where, "additionalProperties"), "only false is supported (answers are closed)"
            )
        required = node.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise self.fail(_at(where, "required"), "expected a list of property names")
        for key in required:
            if key not in props:
                raise self.fail(_at(where, "required"), f"{key!r} is not a property")
        fields: dict[str, Any] = {}
        for key, sub in props.items():
            if not key.isidentifier():
                raise self.fail(
                    _at(where, f"properties.{key}"), "property names must be identifiers"
                )
            path = _at(where, f"properties.{key}")
            kind = self.node(sub, path, f"{name}_{key}", depth + 1)
            description = sub.get("description") if isinstance(sub, dict) else None
            attribute = key if _plain(key) else _attribute(key, props, fields)
            alias = None if attribute == key else key
            if key in required:
                fields[attribute] = (kind, Field(description=description, alias=alias))
            else:
                fields[attribute] = (kind | None, Field(None, description=description, alias=alias))
        title = node.get("title") if isinstance(node.get("title"), str) else _camel(name)
        if title in RESERVED_TITLES:
            title = f"{title}Answer"
        model: type[BaseModel] = create_model(
            _camel(name),
            # a property aliased (below) is read and written by its own name
            __config__=ConfigDict(extra="forbid", title=title, serialize_by_alias=True),
            **fields,
        )
        if isinstance(node.get("description"), str):
            model.__doc__ = node["description"]
        self.made.append(model)
        return model


def _plain(key: str) -> bool:
    """Whether a property can be a pydantic field of its own name: not private (``_x``),
    not in pydantic's namespace (``model_*``), not an attribute of every model (``copy``,
    ``json``, ``schema``)."""
    return not key.startswith(("_", "model_")) and not hasattr(BaseModel, key)


def _attribute(key: str, props: dict[str, Any], taken: dict[str, Any]) -> str:
    """The attribute a property that cannot be a field of its own name is kept under (its
    name is the field's alias): one no property and no other field has."""
    n = 0
    while (attribute := f"field_{n}") in props or attribute in taken:
        n += 1
    return attribute


def answer_field(model: type[BaseModel], name: str) -> str | None:
    """The attribute of ``model`` holding the answer's property ``name`` (an aliased one's
    differs: ``model_config`` is kept as ``field_0``), ``None`` when it has none."""
    for attribute, info in model.model_fields.items():
        if (info.alias or attribute) == name:
            return attribute
    return None


def model_from_schema(
    schema: Any, name: str, source: Path, made: list[type[BaseModel]] | None = None
) -> type[BaseModel]:
    """A pydantic model validating exactly what ``schema`` (the supported subset) allows.

    Args:
        schema: the parsed JSON Schema; its root must be an object.
        name: the phase name (the model's class name and default title).
        source: the schema file, named in errors.
        made: given, gets every model made (its objects' too), in the order made.

    Raises:
        InputError: the schema uses an unsupported keyword or is malformed (file and field).
    """
    builder = _Builder(source)
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise builder.fail("type", 'the schema\'s root must be {"type": "object", ...}')
    model = builder.model(schema, "", name, 0)
    least_answer_chars(schema, source)
    if made is not None:
        made.extend(builder.made)
    return model


def least_answer_chars(schema: Any, source: Path, where: str = "") -> int:
    """How many characters of JSON the least answer filling every field of a (checked)
    schema takes: every property present, each array at its ``minItems`` of least items,
    each string at its ``minLength``. Counted from the innermost node out, so the field
    named by the error is the one whose own least answer first passes the bound.

    Raises:
        InputError: past ``MAX_LEAST_ANSWER`` (the file and the field).
    """
    node: dict[str, Any] = schema
    kind = node.get("type")
    if "enum" in node:
        size = min(len(orjson.dumps(v)) for v in node["enum"])
    elif kind == "string":
        size = 2 + (node.get("minLength") or 0)
    elif kind == "array":
        item = least_answer_chars(node["items"], source, _at(where, "items"))
        count = node.get("minItems") or 0
        size = 2 + count * item + max(count - 1, 0)  # [a,b]
    elif kind == "object":
        props = node["properties"]
        size = 1 + sum(  # {"k":v,"l":w}
            len(orjson.dumps(key))
            + 2
            + least_answer_chars(sub, source, _at(where, f"properties.{key}"))
            for key, sub in props.items()
        )
    else:
        size = 4 if kind == "boolean" else 1  # true, or one digit
    if size > MAX_LEAST_ANSWER:
        raise InputError(
            source,
            where or "(root)",
            f"the least answer that fills every field takes {size:,} characters; "
            f"at most {MAX_LEAST_ANSWER:,} (lower minItems or minLength)",
        )
    return size


#: each model ``load_schema`` made (its objects' too) -> how to make it again
#: (``made_model``): a class made at run time is not found by its name, so a process that
#: receives one, or an answer of one (``sim tick --workers``), rebuilds it
#: (``sim.engine.wire``)
MADE: dict[type[BaseModel], tuple[bytes, str, str, int]] = {}
_LOADED: dict[tuple[bytes, str, str], list[type[BaseModel]]] = {}


def load_schema(data: bytes, name: str, source: Path) -> type[BaseModel]:
    """Parse a JSON Schema file and build its model (see ``model_from_schema``): the same
    class each time for the same bytes, name and file in one process."""
    key = (data, name, str(source))
    made = _LOADED.get(key)
    if made is None:
        try:
            schema = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise InputError(source, None, f"not valid JSON: {exc}") from None
        made = []
        model_from_schema(schema, name, source, made)
        _LOADED[key] = made
        for i, model in enumerate(made):
            MADE[model] = (*key, i)
    return made[-1]


def made_model(data: bytes, name: str, source: str, index: int) -> type[BaseModel]:
    """The ``index``-th model ``load_schema(data, name, source)`` makes (``MADE``)."""
    load_schema(data, name, Path(source))
    return _LOADED[data, name, source][index]


def ref_fields(schema: Any) -> tuple[tuple[tuple[str, ...], str], ...]:
    """The fields of a (checked) schema marked ``x-sim-ref``: (path, kind) each, the path
    as property names from the root with ``*`` for an array's items (``sim.llm.enums``)."""
    found: list[tuple[tuple[str, ...], str]] = []

    def walk(node: Any, path: tuple[str, ...]) -> None:
        if not isinstance(node, dict):
            return
        kind = node.get(REF_KEYWORD)
        if isinstance(kind, str):
            found.append((path, kind))
        for key, sub in (node.get("properties") or {}).items():
            walk(sub, (*path, key))
        if "items" in node:
            walk(node["items"], (*path, "*"))

    walk(schema, ())
    return tuple(found)


def without_refs(schema: Any) -> Any:
    """``schema`` without sim's ``x-sim-ref`` keyword (what a provider is sent)."""
    if isinstance(schema, dict):
        return {k: without_refs(v) for k, v in schema.items() if k != REF_KEYWORD}
    if isinstance(schema, list):
        return [without_refs(v) for v in schema]
    return schema
