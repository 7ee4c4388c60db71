"""Unit tests for the offline model (``sim.offline``): determinism, schema validity, and the
sim skills' rules (valid ids, one outcome per character, bounded memory summaries)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from sim.offline import estimate_tokens, generate, generate_tool_call
from sim.offline.templates import first_sentence

ROOT = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------- output models


class Intention(BaseModel):
    action: Literal["move", "speak", "act", "wait"]
    target: str | None
    content: str
    reasoning: str


class Outcome(BaseModel):
    character_id: str
    outcome: str
    moved_to: str | None
    mood: str | None
    gained: list[str]
    lost: list[str]


class LocationUpdate(BaseModel):
    atmosphere: str | None
    objects_added: list[str]
    objects_removed: list[str]


class Resolution(BaseModel):
    outcomes: list[Outcome]
    location_update: LocationUpdate | None


class Narrative(BaseModel):
    narrative: str


class MemorySummary(BaseModel):
    summary: str


# --------------------------------------------------------------------------- inputs

MARA = {
    "id": "mara",
    "name": "Mara",
    "description": "A young smuggler with quick hands.",
    "personality": "curious and restless",
    "mood": "restless",
    "inventory": ["rope"],
    "goals": ["Find the brass key hidden near the Old Mill", "Win Tomas's trust"],
}
TOMAS = {
    "id": "tomas",
    "name": "Tomas",
    "description": "An aging miller.",
    "personality": "Gruff but kind-hearted. Slow to trust.",
    "mood": "tired",
    "goals": ["Keep the mill running"],
    "inventory": ["flour sack"],
}
SQUARE = {
    "id": "square",
    "name": "Town Square",
    "description": "A cobbled square.",
    "atmosphere": "tense and watchful",
    "objects": ["old well", "broken lantern", "notice board"],
}
EXITS = [{"id": "mill", "name": "Old Mill"}, {"id": "docks", "name": "the Docks"}]


def intention_input(present: bool = True, exits: list[dict[str, str]] | None = None) -> str:
    return json.dumps(
        {
            "tick": 3,
            "world": "A river town",
            "character": MARA,
            "memory": {"summary": "", "recent": []},
            "location": SQUARE,
            "exits": EXITS if exits is None else exits,
            "present": [{"id": "tomas", "name": "Tomas", "mood": "tired"}] if present else [],
        }
    )


def resolution_input() -> str:
    def char(c: dict[str, Any], intent: dict[str, Any]) -> dict[str, Any]:
        keep = ("id", "name", "personality", "mood", "inventory")
        return {**{k: c[k] for k in keep}, "intention": intent}

    return json.dumps(
        {
            "tick": 3,
            "world": "A river town",
            "location": SQUARE,
            "exits": EXITS,
            "characters": [
                char(
                    MARA,
                    {
                        "action": "act",
                        "target": "broken lantern",
                        "content": "Pick up the broken lantern.",
                        "reasoning": "curious",
                    },
                ),
                char(
                    TOMAS,
                    {
                        "action": "speak",
                        "target": "mara",
                        "content": "Go home, Mara.",
                        "reasoning": "gruff",
                    },
                ),
                {
                    "id": "ilse",
                    "name": "Ilse",
                    "personality": "precise",
                    "mood": "wary",
                    "inventory": [],
                    "intention": {
                        "action": "move",
                        "target": "docks",
                        "content": "Leave.",
                        "reasoning": "duty",
                    },
                },
            ],
        }
    )


def narrative_input(events: list[dict[str, Any]] | None = None) -> str:
    evs = (
        events
        if events is not None
        else [
            {
                "id": "mara",
                "name": "Mara",
                "intention": {"action": "act", "target": "old well"},
                "outcome": "Mara peered into the old well and found nothing.",
                "moved_to": None,
            },
            {
                "id": "ilse",
                "name": "Ilse",
                "intention": {"action": "move", "target": "docks"},
                "outcome": "Ilse slipped out of Town Square, bound for the Docks.",
                "moved_to": "docks",
            },
        ]
    )
    return json.dumps({"tick": 3, "world": "A river town", "location": SQUARE, "events": evs})


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


# --------------------------------------------------------------------------- basics


def test_estimate_tokens() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("a") == 1
    assert estimate_tokens("abcd" * 25) == 25


def test_same_seed_same_output_and_seeds_vary() -> None:
    schema, text = schema_of(Intention), intention_input()
    assert generate(schema, text, seed="s1") == generate(schema, text, seed="s1")
    outputs = {json.dumps(generate(schema, text, seed=f"s{i}")) for i in range(20)}
    assert len(outputs) > 5
    nested = schema_of(Nested)
    assert generate(nested, "harbor", seed="x") == generate(nested, "harbor", seed="x")


# --------------------------------------------------------------------------- intention


def test_intention_valid_and_targets_exist() -> None:
    schema = schema_of(Intention)
    exit_ids = {e["id"] for e in EXITS}
    things = set(SQUARE["objects"]) | set(MARA["inventory"])
    seen = set()
    for i in range(200):
        out = Intention.model_validate(generate(schema, intention_input(), seed=f"t{i}"))
        seen.add(out.action)
        assert out.content and out.reasoning
        if out.action == "move":
            assert out.target in exit_ids
        elif out.action == "speak":
            assert out.target == "tomas"
            assert "Tomas" in out.content
        elif out.action == "act":
            assert out.target in things
        else:
            assert out.target is None
    assert seen == {"move", "speak", "act", "wait"}


def test_intention_alone_never_speaks_and_no_exits_never_moves() -> None:
    schema = schema_of(Intention)
    for i in range(100):
        alone = Intention.model_validate(
            generate(schema, intention_input(present=False), seed=f"a{i}")
        )
        assert alone.action != "speak"
        stuck = Intention.model_validate(generate(schema, intention_input(exits=[]), seed=f"b{i}"))
        assert stuck.action != "move"


def test_most_characters_move_within_ten_ticks() -> None:
    schema = schema_of(Intention)
    movers = 0
    for who in range(20):
        history: list[tuple[str, str]] = []
        moved = False
        for tick in range(10):
            text = intention_input(present=who % 2 == 0)
            out = generate(schema, text, seed=f"w:{tick}:{who}", history=history[-4:])
            history.append((text, json.dumps(out)))
            moved = moved or out["action"] == "move"
        movers += moved
    assert movers >= 15


def test_intention_history_changes_output() -> None:
    schema = schema_of(Intention)
    text = intention_input()
    prev = json.dumps({"action": "wait", "target": None, "content": "", "reasoning": ""})
    history = [(text, prev)] * 4
    differs = sum(
        generate(schema, text, seed=f"h{i}")
        != generate(schema, text, seed=f"h{i}", history=history)
        for i in range(20)
    )
    assert differs > 10


def test_bad_input_falls_back_to_generic() -> None:
    for text in ("not json at all", "{}", "[1, 2]", '{"character": 5}'):
        Intention.model_validate(generate(schema_of(Intention), text, seed="z"))
        Resolution.model_validate(generate(schema_of(Resolution), text, seed="z"))
        Narrative.model_validate(generate(schema_of(Narrative), text, seed="z"))
        MemorySummary.model_validate(generate(schema_of(MemorySummary), text, seed="z"))


# --------------------------------------------------------------------------- resolution


def test_resolution_one_outcome_per_character_with_valid_ids() -> None:
    schema = schema_of(Resolution)
    text = resolution_input()
    took = False
    for i in range(60):
        out = Resolution.model_validate(generate(schema, text, seed=f"r{i}"))
        assert [o.character_id for o in out.outcomes] == ["mara", "tomas", "ilse"]
        mara, tomas, ilse = out.outcomes
        assert "Mara" in mara.outcome and "Tomas" in tomas.outcome and "Ilse" in ilse.outcome
        assert mara.moved_to is None and tomas.moved_to is None
        assert ilse.moved_to in (None, "docks")
        assert "Mara" in tomas.outcome  # the listener is named
        if mara.gained:
            took = True
            assert mara.gained == ["broken lantern"]
            assert out.location_update is not None
            assert out.location_update.objects_removed == ["broken lantern"]
    assert took


def test_resolution_recalls_previous_turn() -> None:
    schema = schema_of(Resolution)
    text = resolution_input()
    prev = json.dumps(generate(schema, text, seed="p"))
    plain = [generate(schema, text, seed=f"q{i}") for i in range(10)]
    deep = [generate(schema, text, seed=f"q{i}", history=[(text, prev)]) for i in range(10)]
    assert plain != deep
    assert any(
        "not the first time" in o["outcome"] or "earlier words" in o["outcome"]
        for r in deep
        for o in r["outcomes"]
    )


# --------------------------------------------------------------------------- narrative


def test_narrative_names_people_and_place() -> None:
    schema = schema_of(Narrative)
    for i in range(30):
        out = Narrative.model_validate(generate(schema, narrative_input(), seed=f"n{i}"))
        assert "Town Square" in out.narrative
        assert "Mara" in out.narrative and "Ilse" in out.narrative
        sentences = out.narrative.count(". ") + 1
        assert 3 <= sentences <= 7


def test_narrative_quiet_and_crowded() -> None:
    schema = schema_of(Narrative)
    quiet = Narrative.model_validate(generate(schema, narrative_input([]), seed="q"))
    assert quiet.narrative.count(".") >= 3
    crowd = [
        {
            "id": f"c{i}",
            "name": f"Person{i}",
            "intention": {"action": "wait"},
            "outcome": f"Person{i} waited.",
            "moved_to": None,
        }
        for i in range(9)
    ]
    out = Narrative.model_validate(generate(schema, narrative_input(crowd), seed="c"))
    assert "Person0" in out.narrative and "Person8" not in out.narrative


def test_narrative_echoes_previous_cast() -> None:
    schema = schema_of(Narrative)
    before = narrative_input()
    prev = json.dumps(generate(schema, before, seed="p"))
    now = narrative_input([])
    texts = [
        generate(schema, now, seed=f"e{i}", history=[(before, prev)])["narrative"]
        for i in range(10)
    ]
    assert all("Mara" in t or "Ilse" in t for t in texts)


# --------------------------------------------------------------------------- memory


def test_memory_summary_grows_and_stays_bounded() -> None:
    schema = schema_of(MemorySummary)
    summary = ""
    lengths = []
    places = ["Old Mill", "Town Square", "the Docks", "Salt Market"]
    for tick in range(40):
        text = json.dumps(
            {
                "tick": tick,
                "character": {k: MARA[k] for k in ("id", "name", "personality", "goals")},
                "summary": summary,
                "evicted": [
                    {
                        "tick": tick,
                        "text": f"Mara met Tomas at {places[tick % 4]} and "
                        f"traded a story about the river.",
                    }
                ],
            }
        )
        summary = MemorySummary.model_validate(generate(schema, text, seed=f"m{tick}")).summary
        lengths.append(len(summary))
        assert len(summary) <= 620
    assert lengths[0] > 0 and lengths[5] > lengths[0]
    assert "Tomas" in summary and "Old Mill" in summary and "Salt Market" in summary


# --------------------------------------------------------------------------- generic filler


class Pet(BaseModel):
    name: str
    kind: Literal["cat", "dog", "owl"]
    age: int = Field(ge=0, le=30)


class Nested(BaseModel):
    title: str
    tags: list[str] = Field(min_length=1, max_length=4)
    pets: list[Pet]
    owner: Pet | None
    score: float = Field(gt=0, lt=1)
    flags: dict[str, bool]
    ok: bool
    pair: tuple[int, str]
    code: str = Field(min_length=3, max_length=5)


class Tree(BaseModel):
    label: Literal["node"] = "node"
    children: list[Tree] = []
    extra: Any = None


def test_generic_filler_validates_nested_models() -> None:
    for model in (Nested, Pet, Tree):
        schema = schema_of(model)
        for i in range(25):
            value = generate(schema, "The harbor lantern glows over Salt Market.", seed=f"g{i}")
            model.model_validate(value)


def test_generic_strings_come_from_input() -> None:
    out = generate(schema_of(Pet), "lantern harbor willow", seed="w")
    assert set(out["name"].lower().split()) <= {"lantern", "harbor", "willow"}


#: schemas that demand an answer too big to build (any schema reaches the offline model:
#: ``sim ask``, a plugin's phase, ``sim check``'s sample answers)
BOMBS: dict[str, dict[str, Any]] = {
    "minItems": {"type": "array", "items": {"type": "string"}, "minItems": 100_000_000},
    "minLength": {"type": "string", "minLength": 500_000_000},
    "minProperties": {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "minProperties": 100_000_000,
    },
    "nested": {
        "type": "array",
        "minItems": 1000,
        "items": {
            "type": "array",
            "minItems": 1000,
            "items": {"type": "array", "minItems": 1000, "items": {"type": "integer"}},
        },
    },
    "doubling": {"$ref": "#/$defs/pair"},
}


def test_the_generic_filler_is_bounded_whatever_the_schema_demands() -> None:
    """Each answer is short (it does not fit the bomb: nothing could), and comes soon: in a
    child process with a deadline, so that a hang is a failure, not a stuck suite."""
    code = (
        "import json, sys\n"
        "from sim.offline import generate\n"
        "schema = json.loads(sys.stdin.read())\n"
        "out = generate(schema, 'lantern harbor', seed='bomb')\n"
        "print(len(json.dumps(out)))\n"
    )
    defs = {"pair": {"type": "array", "prefixItems": [{"$ref": "#/$defs/pair"}] * 2}}
    for name, node in BOMBS.items():
        schema = {"type": "object", "properties": {"a": node}, "required": ["a"], "$defs": defs}
        done = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps(schema),
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            timeout=120,
        )
        assert int(done.stdout) < 20_000_000, name


# --------------------------------------------------------------------------- tool calls


def tool(name: str, *params: str) -> dict[str, Any]:
    props = {p: {"type": "string"} for p in params}
    return {
        "name": name,
        "description": f"The {name} action.",
        "parameters": {"type": "object", "properties": props, "required": list(params)},
    }


PHASE1_TOOLS = [
    tool("move_to", "location_id", "reasoning"),
    tool("say", "character_id", "words", "reasoning"),
    tool("act", "object", "action", "reasoning"),
    tool("wait", "reasoning"),
]


class MoveTo(BaseModel):
    location_id: str
    reasoning: str


class Say(BaseModel):
    character_id: str
    words: str
    reasoning: str


class Act(BaseModel):
    object: str
    action: str
    reasoning: str


class Wait(BaseModel):
    reasoning: str


def test_phase1_tool_calls_use_intention_logic() -> None:
    models: dict[str, type[BaseModel]] = {"move_to": MoveTo, "say": Say, "act": Act, "wait": Wait}
    seen = set()
    for i in range(80):
        name, args = generate_tool_call(PHASE1_TOOLS, intention_input(), seed=f"k{i}")
        assert (name, args) == generate_tool_call(PHASE1_TOOLS, intention_input(), seed=f"k{i}")
        parsed = models[name].model_validate(args)
        seen.add(name)
        if isinstance(parsed, MoveTo):
            assert parsed.location_id in {"mill", "docks"}
        elif isinstance(parsed, Say):
            assert parsed.character_id == "tomas"
        elif isinstance(parsed, Act):
            assert parsed.object in {"old well", "broken lantern", "notice board", "rope"}
    assert seen == set(models)


def test_tool_call_reads_parameter_schemas() -> None:
    move = {
        "name": "move_to",
        "parameters": {
            "type": "object",
            "required": ["destination", "urgency"],
            "properties": {
                "destination": {"enum": ["mill", "docks"]},
                "urgency": {"type": "integer", "minimum": 1, "maximum": 3},
            },
        },
    }
    for i in range(30):
        name, args = generate_tool_call([move, PHASE1_TOOLS[3]], intention_input(), seed=f"d{i}")
        if name == "move_to":
            assert args["destination"] in ("mill", "docks") and 1 <= args["urgency"] <= 3


def test_never_raises_on_odd_schemas() -> None:
    loop = {
        "title": "Loop",
        "type": "object",
        "required": ["next"],
        "properties": {"next": {"$ref": "#"}},
    }
    assert isinstance(generate(loop, "", seed="l"), dict)
    assert generate({"title": "Odd", "type": "object", "properties": 5}, "x", seed="o") == {}


def test_tool_call_subset_and_generic_tools() -> None:
    only_two = [t for t in PHASE1_TOOLS if t["name"] in ("move_to", "wait")]
    for i in range(20):
        name, _ = generate_tool_call(only_two, intention_input(), seed=f"o{i}")
        assert name in ("move_to", "wait")
    wrapped = [{"type": "function", "function": {"name": "adopt", "parameters": schema_of(Pet)}}]
    for i in range(10):
        name, args = generate_tool_call(wrapped, "a quiet owl", seed=f"p{i}")
        assert name == "adopt"
        Pet.model_validate(args)


def test_output_is_stable_across_processes() -> None:
    """String hashing is salted per process; the offline model must not depend on it."""
    code = (
        "import json, sys; from sim.offline import generate; "
        "print(json.dumps(generate({'title': 'Intention'}, sys.stdin.read(), seed='fixed')))"
    )
    outputs = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-c", code],
            input=intention_input(),
            env=env,
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        outputs.add(done.stdout)
    here = generate({"title": "Intention"}, intention_input(), seed="fixed")
    outputs.add(json.dumps(here) + "\n")
    assert len(outputs) == 1


def test_a_declared_schema_is_answered_plausibly_from_the_subjects_words() -> None:
    from pathlib import Path

    from sim.offline import generate
    from sim.phases.schema import model_from_schema

    model = model_from_schema(
        {
            "type": "object",
            "properties": {
                "stance": {"type": "string", "enum": ["sell", "keep", "undecided"]},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                "votes": {"type": "integer", "minimum": 3, "maximum": 5},
                "reason": {"type": "string", "maxLength": 200},
                "mood": {"type": "string"},
            },
            "required": ["stance", "confidence", "votes", "reason", "mood"],
        },
        "vote",
        Path("vote.json"),
    )
    text = (
        '{"character": {"name": "Marta Oyelaran", "secret_goal": '
        '"She has already decided to vote no, whatever it costs her."}}'
    )
    answers = [generate(model.model_json_schema(), text, seed=f"s{i}") for i in range(20)]
    for answer in answers:
        model.model_validate(answer)
        assert 0 <= answer["confidence"] <= 1 and 3 <= answer["votes"] <= 5
        assert answer["reason"] == "She has already decided to vote no, whatever it costs her."
    assert len({a["stance"] for a in answers}) > 1
    assert generate(model.model_json_schema(), text, seed="s1") == answers[1]


def _first_sentence_by_char(text: str) -> str:
    """The reference: ``first_sentence`` as it was written first, one character at a time."""
    quoted = False
    n = len(text)
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
            if not quoted and i > 0 and text[i - 1] in ".!?" and (i + 1 == n or text[i + 1] == " "):
                return text[: i + 1]
        elif ch in ".!?" and not quoted and (i + 1 == n or text[i + 1] == " "):
            return text[: i + 1]
    text = text.strip()
    return text if text[-1:] in '.!?"' else text + "."


def test_first_sentence_visits_only_marks_with_the_same_result() -> None:
    """Finding the marks by regular expression ends every text where the character scan
    did: quotes, stops inside and outside them, at the end or before a space."""
    rng = random.Random(7)
    alphabet = 'ab .!?" \n'
    texts = [
        "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 30))) for _ in range(20000)
    ]
    texts += ['He said "stop." Then left.', '"Go!" she cried', "No stop at all", "", "  "]
    for text in texts:
        assert first_sentence(text) == _first_sentence_by_char(text), repr(text)
