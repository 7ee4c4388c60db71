"""The structured-output forms: request fields, answer extraction, rejection detection and
``auto``'s one-way switching."""

from __future__ import annotations

import json

from sim.llm.errors import LLMAPIError
from sim.providers._structured import (
    AUTO_ORDER,
    FormSelector,
    answer_text,
    fits_shape,
    instructions_for,
    rejects_form,
    request_fields,
)

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def error(status: int, body: object, message: str = "HTTP error") -> LLMAPIError:
    return LLMAPIError(message, status_code=status, response_body=body)


def test_request_fields_per_form() -> None:
    assert request_fields("json_schema", "A", SCHEMA)["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "A", "schema": SCHEMA, "strict": True},
    }
    assert request_fields("json_object_schema", "A", SCHEMA) == {
        "response_format": {"type": "json_object", "schema": SCHEMA}
    }
    tool = request_fields("tool", "A", SCHEMA)
    assert tool["tool_choice"] == {"type": "function", "function": {"name": "A"}}
    assert tool["tools"][0]["function"]["parameters"] == SCHEMA
    assert request_fields("prompt", "A", SCHEMA) == {}
    assert instructions_for("json_schema", "Be brief.", SCHEMA) == "Be brief."
    prompted = instructions_for("prompt", "Be brief.", SCHEMA)
    assert (
        prompted.startswith("Be brief.") and json.dumps(SCHEMA, separators=(",", ":")) in prompted
    )


def test_answer_text_per_form() -> None:
    call = {"tool_calls": [{"function": {"name": "A", "arguments": '{"a": 1}'}}]}
    assert answer_text("tool", call) == '{"a": 1}'
    assert answer_text("tool", {"tool_calls": [{"function": {"arguments": {"a": 2}}}]}) == (
        '{"a": 2}'
    )
    assert answer_text("tool", {"content": '{"a": 3}'}) == '{"a": 3}'  # answered in text
    fenced = {"content": 'Here:\n```json\n{"a": 4}\n```'}
    assert answer_text("prompt", {"content": '```json\n{"a": 4}\n```'}) == '{"a": 4}'
    assert answer_text("prompt", fenced) == fenced["content"]  # prose around: left to validation
    assert answer_text("json_schema", {"content": ' {"a": 5} '}) == ' {"a": 5} '


def test_rejection_is_a_4xx_or_500_naming_the_form() -> None:
    llama = {
        "message": "... ('body', 'response_format', 'type') ...",
        "type": "internal_server_error",
    }
    assert rejects_form(error(500, llama), "json_schema")
    assert rejects_form(error(400, {"error": {"param": "response_format"}}), "json_object_schema")
    assert rejects_form(error(422, "response_format: unknown variant"), "json_schema")
    assert not rejects_form(error(500, {"message": "out of memory"}), "json_schema")
    assert not rejects_form(error(503, llama), "json_schema")  # overloaded, not a refusal
    assert not rejects_form(error(429, llama), "json_schema")
    assert rejects_form(error(400, {"message": "tool_choice is not supported"}), "tool")
    assert not rejects_form(error(400, {"message": "tool_choice"}), "prompt")


def test_selector_switches_once_per_form_and_remembers() -> None:
    selector = FormSelector("http://127.0.0.1:8080/v1")
    assert selector.form("auto") == "json_schema"
    assert selector.form("tool") == "tool"  # a fixed form is never switched
    rejected = error(500, "response_format")
    made = selector.switch("json_schema", rejected)
    assert made is not None and (made.old, made.new) == ("json_schema", "json_object_schema")
    assert "http://127.0.0.1:8080/v1 rejected json_schema" in made.note()
    assert selector.switch("json_schema", rejected) is None  # a late rejection: no 2nd switch
    assert selector.form("auto") == "json_object_schema"
    for form in AUTO_ORDER[1:-1]:
        selector.switch(form, rejected)
    assert selector.form("auto") == "prompt"
    assert selector.switch("prompt", rejected) is None  # nothing after prompt
    assert [s.new for s in selector.switches] == list(AUTO_ORDER[1:])


def test_fits_shape_is_the_schema_top_level() -> None:
    schema = {
        "type": "object",
        "properties": {"text": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["text", "count"],
        "additionalProperties": False,
    }
    assert fits_shape('{"text": "fog", "count": 2}', schema)
    assert fits_shape('{"text": 3, "count": "x"}', schema)  # content: the validator's
    assert not fits_shape('{"text": "fog"}', schema)  # a required key missing
    assert not fits_shape('{"text": "fog", "count": 2, "name": "x"}', schema)  # an extra key
    assert fits_shape(
        '{"text": "fog", "count": 2, "name": "x"}', {**schema, "additionalProperties": True}
    )
    assert not fits_shape('["text", "count"]', schema)
    assert not fits_shape("The fog is thick.", schema)
