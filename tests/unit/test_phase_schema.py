"""A declared phase's JSON Schema becomes a pydantic model; unsupported features are named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from sim.errors import InputError
from sim.phases.schema import (
    MAX_ITEMS,
    MAX_LEAST_ANSWER,
    MAX_LENGTH,
    MAX_NODES,
    answer_field,
    least_answer_chars,
    model_from_schema,
)

SOURCE = Path("schemas/opinion.json")


def build(schema: dict[str, Any]) -> Any:
    return model_from_schema(schema, "opinion", SOURCE)


def test_the_supported_subset_validates_what_it_says() -> None:
    model = build(
        {
            "type": "object",
            "properties": {
                "stance": {"type": "string", "enum": ["for", "against"]},
                "mood": {"type": "string", "minLength": 1, "maxLength": 10},
                "confidence": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
                "count": {"type": "integer", "enum": [1, 2]},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                "detail": {
                    "type": "object",
                    "properties": {"ok": {"type": "boolean"}},
                    "required": ["ok"],
                    "additionalProperties": False,
                },
                "note": {"type": "string"},
            },
            "required": ["stance", "mood", "confidence", "count", "tags", "detail"],
            "additionalProperties": False,
        }
    )
    good = {
        "stance": "for",
        "mood": "calm",
        "confidence": 0.5,
        "count": 2,
        "tags": ["a"],
        "detail": {"ok": True},
    }
    assert model.model_validate(good).note is None
    for bad in (
        {"stance": "maybe"},
        {"mood": ""},
        {"confidence": 1},
        {"count": 3},
        {"tags": ["a", "b", "c"]},
        {"detail": {}},
        {"extra": 1},
    ):
        with pytest.raises(ValidationError):
            model.model_validate({**good, **bad})
    assert model.model_json_schema()["title"] == "Opinion"


@pytest.mark.parametrize(
    ("schema", "field", "problem"),
    [
        ({"type": "array", "items": {}}, "type", "root must be"),
        (
            {"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}},
            "properties.a.pattern",
            "unsupported JSON Schema keyword 'pattern'",
        ),
        ({"type": "object", "properties": {"a": {"$ref": "#/x"}}}, "properties.a.type", "$ref"),
        (
            {"type": "object", "properties": {"a": {"type": ["string", "null"]}}},
            "properties.a.type",
            "type lists",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "additionalProperties": True,
            },
            "additionalProperties",
            "only false",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
            "required",
            "'b' is not a property",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string", "enum": [1]}}},
            "properties.a.enum",
            "string values",
        ),
        ({"type": "object", "properties": {}}, "properties", "at least one"),
    ],
)
def test_unsupported_or_malformed_schemas_are_named(
    schema: dict[str, Any], field: str, problem: str
) -> None:
    with pytest.raises(InputError) as caught:
        build(schema)
    assert caught.value.field == field
    assert problem in caught.value.problem


def test_a_title_the_offline_skills_use_is_not_taken() -> None:
    model = build({"type": "object", "title": "Intention", "properties": {"a": {"type": "string"}}})
    assert model.model_json_schema()["title"] == "IntentionAnswer"


def _with(node: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": node}, "required": ["a"]}


@pytest.mark.parametrize(
    ("node", "field", "problem"),
    [
        (
            {"type": "array", "items": {"type": "string"}, "minItems": 100_000_000},
            "properties.a.minItems",
            f"at most {MAX_ITEMS:,} (got 100,000,000)",
        ),
        (
            {"type": "array", "items": {"type": "string"}, "maxItems": MAX_ITEMS + 1},
            "properties.a.maxItems",
            f"at most {MAX_ITEMS:,}",
        ),
        (
            {"type": "string", "minLength": 500_000_000},
            "properties.a.minLength",
            f"at most {MAX_LENGTH:,} (got 500,000,000)",
        ),
        (
            {"type": "string", "maxLength": MAX_LENGTH + 1},
            "properties.a.maxLength",
            f"at most {MAX_LENGTH:,}",
        ),
        (
            {"type": "string", "minLength": 5, "maxLength": 4},
            "properties.a.minLength",
            "no answer fits",
        ),
        (
            {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 2},
            "properties.a.minItems",
            "no answer fits",
        ),
        (  # each count allowed, their product not: the array of arrays is named
            {
                "type": "array",
                "minItems": 1000,
                "items": {"type": "array", "minItems": 1000, "items": {"type": "boolean"}},
            },
            "properties.a",
            f"at most {MAX_LEAST_ANSWER:,}",
        ),
        (  # a string at its longest minimum in a long list
            {"type": "array", "minItems": 2, "items": {"type": "string", "minLength": MAX_LENGTH}},
            "properties.a",
            "least answer",
        ),
    ],
)
def test_a_schema_demanding_too_much_is_refused(
    node: dict[str, Any], field: str, problem: str
) -> None:
    with pytest.raises(InputError) as caught:
        build(_with(node))
    assert caught.value.field == field
    assert problem in caught.value.problem
    assert caught.value.path == SOURCE


def test_the_least_answer_counts_every_field_as_json() -> None:
    schema = {
        "type": "object",
        "properties": {
            "s": {"type": "string", "minLength": 3},
            "n": {"type": "integer"},
            "b": {"type": "boolean"},
            "e": {"type": "string", "enum": ["long", "ab"]},
            "l": {"type": "array", "minItems": 2, "items": {"type": "string"}},
        },
    }
    least = '{"s":"xxx","n":0,"b":true,"e":"ab","l":["",""]}'
    assert least_answer_chars(schema, SOURCE) == len(least)


def test_a_property_named_like_pydantics_own_is_kept_as_written() -> None:
    """``model_config`` was taken for the model's settings (the property vanished),
    ``model_validate`` ended in a ValueError: a property is data, whatever its name."""
    names = ("model_validate", "model_dump", "model_config", "copy", "json", "_x", "field_0")
    model = build(
        {
            "type": "object",
            "properties": {name: {"type": "string"} for name in names},
            "required": list(names),
            "additionalProperties": False,
        }
    )
    assert list(model.model_json_schema()["properties"]) == list(names)
    answer = {name: name.upper() for name in names}
    parsed = model.model_validate(answer)
    assert parsed.model_dump(mode="json") == answer
    assert orjson.loads(parsed.model_dump_json()) == answer
    assert getattr(parsed, answer_field(model, "model_config") or "") == "MODEL_CONFIG"
    assert answer_field(model, "field_0") == "field_0" and answer_field(model, "nope") is None
    with pytest.raises(ValidationError):  # the attribute an alias is kept under is no name
        model.model_validate({**answer, "field_1": "x"})


def test_a_schema_of_too_many_parts_is_refused_before_they_are_built() -> None:
    """Each object becomes a model: a 1 MB file of 14,000 objects took seconds to build."""
    props = {
        f"a{i}": {"type": "object", "properties": {"x": {"type": "boolean"}}}
        for i in range(MAX_NODES)
    }
    with pytest.raises(InputError) as caught:
        build({"type": "object", "properties": props})
    assert caught.value.field == f"properties.a{MAX_NODES // 2}"  # the 1,001st
    assert f"more than {MAX_NODES:,} schemas" in caught.value.problem
    build({"type": "object", "properties": {f"a{i}": {"type": "boolean"} for i in range(999)}})


def test_a_loaded_schema_and_its_answers_cross_to_another_process_as_the_same_class() -> None:
    """``sim tick --workers``: a declared phase's request carries its answer model, and an
    answer comes back as an instance of it (nested objects too). Classes made at run time
    are not found by name; they cross as the call that makes them again, which gives the
    receiving process its own class, the one its phase validates with."""
    import pickle
    import subprocess
    import sys

    from sim.engine.wire import dumps
    from sim.phases.schema import load_schema

    schema = {
        "title": "Opinion",
        "type": "object",
        "properties": {
            "stance": {"type": "string", "enum": ["for", "against"]},
            "detail": {
                "type": "object",
                "properties": {"why": {"type": "string"}},
                "required": ["why"],
                "additionalProperties": False,
            },
        },
        "required": ["stance", "detail"],
        "additionalProperties": False,
    }
    data = orjson.dumps(schema)
    model = load_schema(data, "opinion", SOURCE)
    assert load_schema(data, "opinion", SOURCE) is model  # one class per schema file
    answer = model.model_validate({"stance": "for", "detail": {"why": "the well"}})
    sent = dumps((model, answer))
    back_class, back = pickle.loads(sent)
    assert back_class is model and type(back) is model and back == answer
    # in a fresh process, which made no class of it yet
    code = (
        "import pickle, sys\n"
        "cls, answer = pickle.loads(sys.stdin.buffer.read())\n"
        "print(cls.__name__, answer.model_dump_json())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], input=sent, capture_output=True, check=True)
    assert done.stdout.decode().split() == [
        "Opinion",
        '{"stance":"for","detail":{"why":"the',
        'well"}}',
    ]
