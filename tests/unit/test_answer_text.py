"""Reading a text answer into its schema (``validate_text``), small models' habits included."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from sim.llm.errors import LLMSchemaError
from sim.llm.types import Usage
from sim.providers._openai_common import escape_raw_controls, validate_text


class Line(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str
    count: int


USAGE = Usage(input_tokens=10, output_tokens=5)


def test_raw_control_characters_inside_strings_are_read_as_escapes() -> None:
    raw = '{"text": "one\ntwo\tthree\x01 \\"quoted\\"", "count": 2}'
    parsed, kept = validate_text(Line, raw, USAGE, "m")
    assert parsed == Line(text='one\ntwo\tthree\x01 "quoted"', count=2)
    assert kept == raw  # the answer as it came


def test_line_breaks_between_fields_were_always_valid() -> None:
    raw = '{\n  "text": "a",\n  "count": 1\n}'
    assert escape_raw_controls(raw) is None
    assert validate_text(Line, raw, USAGE, "m")[0] == Line(text="a", count=1)


@pytest.mark.parametrize(
    "raw",
    [
        '{"text": "a\nb", "count": "two"}',  # escaped, still the wrong type
        '{"text": "a", "count": \x01 1}',  # a control character outside a string
        '{"text": "a\nb", "count": 1',  # cut short
        "Sure! Here is the note:\nfine",  # not JSON at all
    ],
)
def test_anything_else_wrong_is_still_a_paid_schema_error(raw: str) -> None:
    with pytest.raises(LLMSchemaError) as info:
        validate_text(Line, raw, USAGE, "m")
    assert info.value.code == "schema_error"
    assert info.value.usage == USAGE


def test_an_unterminated_string_with_many_escaped_quotes_is_scanned_once() -> None:
    raw = '{"text": "' + '\\"\n' * 50_000  # never closed
    escaped = escape_raw_controls(raw)
    assert escaped is not None and "\n" not in escaped
    with pytest.raises(LLMSchemaError):
        validate_text(Line, raw, USAGE, "m")
