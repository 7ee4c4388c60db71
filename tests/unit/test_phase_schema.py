"""A declared phase's JSON Schema becomes a pydantic model; unsupported features are named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sim.errors import InputError
from sim.phases.schema import model_from_schema

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
