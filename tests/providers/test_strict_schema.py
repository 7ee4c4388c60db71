"""sim's own strict-schema conversion, pinned on the phase schemas.

The expected JSON was produced by the conversion the ``openai`` SDK ships (private, so it
is not imported here); a change in sim's copy that alters what is sent shows as a diff.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from sim.phases.intentions import Intention
from sim.phases.memory import MemorySummary
from sim.phases.narrative import Narrative
from sim.phases.resolution import Resolution
from sim.providers._strict_schema import to_strict_json_schema

PINNED = json.loads((Path(__file__).parent / "data" / "strict_schemas.json").read_text())


class Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


class Leaf(BaseModel):
    name: str
    weight: float | None = None


class Tricky(BaseModel):
    """Refs with siblings, optional defaults, nested lists and unions."""

    model_config = ConfigDict(title="Tricky")
    leaf: Leaf = Field(description="a described ref is unravelled")
    colour: Colour
    maybe: Leaf | None = None
    many: list[Leaf]
    either: int | str
    table: dict[str, int]


@pytest.mark.parametrize("model", [Intention, Resolution, Narrative, MemorySummary, Tricky])
def test_the_strict_form_is_pinned_key_order_included(model: type[BaseModel]) -> None:
    got = to_strict_json_schema(model)
    # the exact bytes matter: the body's digest is the call's idempotency key
    assert json.dumps(got) == json.dumps(PINNED[model.__name__])


def test_every_object_is_closed_and_requires_all_its_properties() -> None:
    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                assert node["additionalProperties"] is False
                assert node["required"] == list(node["properties"])
            assert not ("$ref" in node and len(node) > 1)
            assert node.get("default", 0) is not None
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(to_strict_json_schema(Tricky))


def test_the_models_own_schema_is_not_mutated() -> None:
    before = Tricky.model_json_schema()
    to_strict_json_schema(Tricky)
    assert Tricky.model_json_schema() == before


def test_a_non_model_is_refused() -> None:
    with pytest.raises(TypeError, match="pydantic model class"):
        to_strict_json_schema(dict)  # type: ignore[arg-type]
