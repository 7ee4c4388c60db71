"""Prompts a small model can follow (issue 25): the built-in phases' inputs are labelled
sections that read back exactly, the game master sees each character's goals, each
built-in prompt carries one worked example that fits its schema, and the output caps fit
the answers their schemas allow."""

from __future__ import annotations

import json
import re
from pathlib import Path

import orjson
import pytest
from conftest import DEMO
from pydantic import BaseModel

from sim import sections
from sim.config import Config
from sim.llm.tokens import estimate_tokens
from sim.phases.intentions import Intention, character_input
from sim.phases.memory import MemorySummary, memory_input
from sim.phases.narrative import Narrative
from sim.phases.resolution import Outcome, Resolution, location_input
from sim.phases.templates import Prompts
from sim.storage import Storage
from sim.world import World


@pytest.fixture(scope="module")
def demo() -> World:
    return Storage(DEMO).load()


def test_an_intention_input_is_labelled_sections(demo: World) -> None:
    where = demo.characters_at()
    char = next(iter(demo.characters.values()))
    here = where[char["state"]["location"]]
    text = character_input(demo, char, 3, here, {"name": "W", "description": "d"})
    titles = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert titles == [
        "Tick",
        "The world",
        "Who you are",
        "What you remember",
        "Where you are",
        "Exits (move: target one of these ids)",
        "Who is here (speak: target one of these ids)",
    ]
    assert not text.startswith("{")
    doc = sections.loads(text)
    assert doc is not None
    assert doc["character"]["id"] == char["identity"]["id"]
    assert [e["id"] for e in doc["exits"]] == demo.locations[char["state"]["location"]]["state"][
        "connections"
    ]
    assert sections.dumps(doc) == text  # exactly what the phase built


def test_the_game_master_sees_each_characters_goals(demo: World) -> None:
    where = demo.characters_at()
    lid, here = next((lid, ids) for lid, ids in where.items() if len(ids) >= 2)
    intentions = {cid: Intention.fallback() for cid in here}
    doc = sections.loads(location_input(demo, lid, 3, here, intentions))
    assert doc is not None
    for who in doc["characters"]:
        assert who["goals"] == demo.characters[who["id"]]["identity"]["goals"]
        assert who["intention"]["action"] == "wait"


def test_sections_read_back_every_value_exactly() -> None:
    doc = {
        "tick": 3,
        "world": {"name": "A: b", "n": "3", "blank": "", "text": "two\nlines", "x": None},
        "character": {"goals": ["a", "b"], "inventory": [], "age": 61, " pad": " x "},
        "present": [],
        "happenings": ["- a dash", "{not json"],
        "summary": "a lone string: with a colon",
    }
    assert sections.loads(sections.dumps(doc)) == doc
    assert sections.loads('{"a": 1}') == {"a": 1}  # a world's own JSON input still reads
    assert sections.loads("free text") is None


#: values a section may hold: text, JSON of every kind, JSON after JSON's whitespace,
#: non-ASCII first characters, near-JSON
READ_BACK = [
    "",
    " ",
    "a",
    "A: b",
    "free text",
    "3",
    "-1",
    "1e5",
    " 1",
    "\t[1]",
    "\n{}",
    "\r2",
    "true",
    "false",
    "null",
    "nul",
    "tru",
    "t",
    "n",
    "f",
    '"x"',
    '"',
    "{",
    "[",
    "{not json",
    '{"a": 1}',
    "[1, 2]",
    "- a dash",
    "é",
    "\u00a01",
    "\ufeff1",
    "\u20001",
    "１",
    "٣",
    "+1",
    ".5",
    "NaN",
    "Infinity",
    "(none)",
    "#",
    "'a'",
    "x 1",
    "[a]",
    "\x00",
]


@pytest.mark.parametrize("text", READ_BACK)
def test_a_value_reads_as_a_json_parse_of_it_would(text: str) -> None:
    """Reading a value skips the parse when its first character rules JSON out, and gives
    what parsing it (falling back to the text) gives."""
    try:
        expected = orjson.loads(text)
        is_json = True
    except orjson.JSONDecodeError:
        expected, is_json = text, False
    assert sections._read(text) == expected
    assert sections._is_json(text) is is_json


def test_a_section_is_a_list_only_when_every_row_is_an_item() -> None:
    assert sections.loads("## X\n- a\n- 2") == {"X": ["a", 2]}
    assert sections.loads("## X\n- a\nb: c") is None  # not all items, not all pairs
    assert sections.loads("## X\n- a\n-b") is None
    assert sections.loads("## X\nb: c\n- a") is None
    assert sections.loads("## X\na: - b\nc: - d") == {"X": {"a": "- b", "c": "- d"}}
    assert sections.loads("## X\n- a: 1\n- b") == {"X": ["a: 1", "b"]}


def test_memory_input_reads_back(demo: World) -> None:
    char = next(iter(demo.characters.values()))
    text = memory_input(char, [{"tick": 1, "text": "met Pell"}], 4)
    doc = sections.loads(text)
    assert doc is not None and doc["evicted"] == [{"tick": 1, "text": "met Pell"}]


SCHEMAS: dict[str, type[BaseModel]] = {
    "intentions": Intention,
    "resolution": Resolution,
    "narrative": Narrative,
    "memory": MemorySummary,
}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_each_builtin_prompt_has_one_worked_example_that_fits(name: str, tmp_path: Path) -> None:
    text = Prompts(tmp_path).render(f"{name}.md", {"actions": {}})
    assert text.count("Example: ") == 1
    example = text.split("Example: ", 1)[1]
    SCHEMAS[name].model_validate(json.loads(example))


def test_a_world_overrides_the_example_like_the_rest(tmp_path: Path) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "narrative.md").write_text("Tell it. Example: {}")
    assert Prompts(tmp_path).render("narrative.md", {}) == "Tell it. Example: {}"


def _tokens(answer: BaseModel) -> int:
    return estimate_tokens(answer.model_dump_json())


def test_output_caps_fit_the_answers_their_schemas_allow() -> None:
    config = Config()
    longest = Intention(action="speak", target="x" * 40, content="c" * 300, reasoning="r" * 300)
    assert _tokens(longest) <= config.phase1.max_output_tokens
    outcome = Outcome(
        character_id="x" * 20,
        outcome="o" * 300,
        moved_to="y" * 20,
        mood="m" * 40,
        gained=[],
        lost=[],
    )
    four = Resolution(outcomes=[outcome] * 4, location_update=None)
    assert _tokens(four) <= config.phase2a.max_output_tokens < 900  # the old cap let one ramble
    assert _tokens(Narrative(narrative="n" * 1200)) <= config.phase2b.max_output_tokens
    assert _tokens(MemorySummary(summary="s" * 1200)) <= config.phase4.max_output_tokens
