"""Per-request schema enums and the reference checks of the built-in phases (issue 25)."""

from __future__ import annotations

import time

import pytest

from sim.llm.calls import schema_json
from sim.llm.enums import MAX_EACH, MAX_ENUM, EnumField, SchemaEnums, constrain
from sim.phases.intentions import Intention, intention_schema
from sim.phases.refs import IntentionRefs, ResolutionRefs, mode_for
from sim.phases.resolution import LocationUpdate, Outcome, Resolution
from sim.providers._openai_common import LOCAL_MAX_LENGTH, strict_schema

REFS = IntentionRefs(exits=("gate", "well"), people=("ann",), objects=("a lamp",))


def _string_branch(node: dict) -> dict:
    return next(b for b in node["anyOf"] if b.get("type") == "string")


def test_the_intention_schema_lists_this_requests_ids() -> None:
    base = strict_schema(Intention)
    sent = strict_schema(Intention, REFS.enums())
    assert _string_branch(sent["properties"]["target"])["enum"] == [
        "gate",
        "well",
        "ann",
        "a lamp",
    ]
    assert {"type": "null"} in sent["properties"]["target"]["anyOf"]  # wait: null
    assert "enum" not in _string_branch(base["properties"]["target"])  # the cache untouched
    assert strict_schema(Intention) is base
    # a world's verbs widen action; the target's enum is the same
    widened = strict_schema(intention_schema({"trade": "swap"}), REFS.enums())
    assert _string_branch(widened["properties"]["target"])["enum"][0] == "gate"


def test_the_resolution_schema_lists_characters_exits_and_objects() -> None:
    refs = ResolutionRefs(("ann", "bo"), ("gate",), ("a lamp",), frozenset())
    sent = strict_schema(Resolution, refs.enums())
    outcome = sent["$defs"]["Outcome"]["properties"]
    assert outcome["character_id"]["enum"] == ["ann", "bo"]
    assert _string_branch(outcome["moved_to"])["enum"] == ["gate"]
    update = sent["$defs"]["LocationUpdate"]["properties"]
    assert update["objects_removed"]["items"]["enum"] == ["a lamp"]
    assert "enum" not in update["objects_added"]["items"]
    # the plain JSON schema (gemini, anthropic) takes the same enums
    plain = constrain(schema_json(Resolution), refs.enums())
    assert plain["$defs"]["Outcome"]["properties"]["character_id"]["enum"] == ["ann", "bo"]
    assert "enum" not in schema_json(Resolution)["$defs"]["Outcome"]["properties"]["character_id"]


def test_no_ids_leaves_only_null_and_too_many_are_not_sent() -> None:
    sent = strict_schema(Intention, SchemaEnums((EnumField(("target",), ()),)))
    assert sent["properties"]["target"]["anyOf"] == [{"type": "null"}]
    many = tuple(f"c{i}" for i in range(MAX_ENUM + 1))
    sent = strict_schema(Intention, SchemaEnums((EnumField(("target",), many),)))
    assert "enum" not in _string_branch(sent["properties"]["target"])
    # a path the schema does not have changes nothing
    sent = strict_schema(Intention, SchemaEnums((EnumField(("nope", "*"), ("x",)),)))
    assert sent == strict_schema(Intention)


def test_openai_gets_no_length_keywords_local_servers_do() -> None:
    local = strict_schema(Outcome)
    hosted = strict_schema(Outcome, lengths=False)
    assert local["properties"]["outcome"]["maxLength"] > 0
    assert "maxLength" not in hosted["properties"]["outcome"]
    assert "maxLength" not in _string_branch(hosted["properties"]["mood"])


def test_a_local_server_gets_the_short_caps_its_grammar_can_hold() -> None:
    """A grammar holds a small model to a short cap (Gemma 3 270M rambled past an object's
    60 characters and an intention's 300, to schema errors and to the token cap); a long
    one (a narrative's 1,200) killed llama.cpp's server, so it is checked on the answer."""
    from sim.phases.narrative import Narrative

    local = strict_schema(Resolution, lengths=LOCAL_MAX_LENGTH)
    outcome = local["$defs"]["Outcome"]["properties"]
    assert outcome["outcome"]["maxLength"] == 300
    assert outcome["gained"]["items"]["maxLength"] == 60
    assert _string_branch(outcome["mood"])["maxLength"] == 40
    narrative = strict_schema(Narrative, lengths=LOCAL_MAX_LENGTH)
    assert all("maxLength" not in field for field in narrative["properties"].values())
    assert strict_schema(Narrative)["properties"]["narrative"]["maxLength"] == 1200


def test_intention_targets_follow_the_action() -> None:
    def intent(action: str, target: str | None) -> Intention:
        return Intention(action=action, target=target, content="", reasoning="")  # type: ignore[arg-type]

    assert REFS.problem(intent("move", "gate")) is None
    assert REFS.problem(intent("speak", "ann")) is None
    assert REFS.problem(intent("act", "a lamp")) is None
    assert REFS.problem(intent("wait", None)) is None
    moved = REFS.problem(intent("move", "place"))
    assert moved is not None and '"gate", "well"' in moved and "exit" in moved
    assert REFS.problem(intent("move", "ann")) is not None  # a person is not an exit
    spoke = REFS.problem(intent("speak", "me"))
    assert spoke is not None and '"ann"' in spoke
    assert REFS.problem(intent("wait", "")) is not None
    assert REFS.problem(intent("speak", None)) is not None  # someone is here to name
    nobody = IntentionRefs(exits=("gate",), people=(), objects=())
    assert nobody.problem(intent("speak", None)) is None
    assert "no one else is here" in str(nobody.problem(intent("speak", "ann")))
    alone = IntentionRefs(exits=(), people=(), objects=())
    stuck = alone.problem(intent("move", "gate"))
    assert stuck is not None and "no exit" in stuck


def test_resolution_references_are_checked() -> None:
    refs = ResolutionRefs(("ann", "bo"), ("gate",), ("a lamp",), frozenset({"gate", "Gate"}))

    def outcome(cid: str, moved_to: str | None = None) -> Outcome:
        return Outcome(
            character_id=cid, outcome="ok", moved_to=moved_to, mood=None, gained=[], lost=[]
        )

    good = Resolution(outcomes=[outcome("ann", "gate"), outcome("bo")], location_update=None)
    assert refs.problem(good) is None
    bad = Resolution(
        outcomes=[outcome("1"), outcome("ann", "nowhere"), outcome("ann")],
        location_update=LocationUpdate(
            atmosphere=None, objects_added=["Gate"], objects_removed=["a ghost"]
        ),
    )
    problem = refs.problem(bad)
    assert problem is not None
    for part in (
        "character_id '1' is not a character here",
        "moved_to 'nowhere'",
        "a second outcome for 'ann'",
        "objects_removed names 'a ghost'",
        "objects_added names 'Gate'",
        'character_id one of "ann", "bo"',
    ):
        assert part in problem


def test_auto_mode_per_provider() -> None:
    assert mode_for("auto", "chat") == "schema"
    assert mode_for("auto", "openai") == "validate"
    assert mode_for("auto", "some-plugin") == "validate"
    assert mode_for("schema", "openai") == "schema"


def test_a_per_request_schema_costs_far_less_than_a_class_per_request() -> None:
    """The enums are written into a copy of the cached schema, not a pydantic class made per
    request (create_model: milliseconds each; docs/providers.md)."""
    refs = ResolutionRefs(tuple(f"c{i}" for i in range(20)), ("a", "b"), ("x",), frozenset())
    enums = refs.enums()
    strict_schema(Resolution)
    started = time.process_time()
    for _ in range(200):
        strict_schema(Resolution, enums)
    per_call = (time.process_time() - started) / 200
    assert per_call < 0.002  # measured 0.12 ms on the 2-core machine (docs/providers.md)


def test_what_the_model_wrote_is_echoed_cut_short() -> None:
    problem = REFS.problem(Intention(action="move", target="x" * 10_000, content="", reasoning=""))
    assert problem is not None and len(problem) < 300 and "..." in problem


def _branches(sent: dict) -> dict[str, dict]:
    """The root branches of a schema sent with its cases, by the action each allows."""
    return {b["properties"]["action"]["enum"][0]: b["properties"]["target"] for b in sent["anyOf"]}


def test_a_local_server_gets_each_actions_own_targets() -> None:
    """With one flat enum a grammar lets a model pair ``move`` with a person (Gemma 3 270M
    did, in about half its intentions): sent with its cases, each action is a branch of
    the root that allows only its own ids."""
    sent = strict_schema(intention_schema({"trade": "swap"}), REFS.enums(), grammar=True)
    assert "properties" not in sent and sent["title"] == "Intention"  # the root: branches
    targets = _branches(sent)
    assert list(targets) == ["move", "speak", "act", "wait", "trade"]
    assert targets["move"]["enum"] == ["gate", "well"] and targets["move"]["type"] == "string"
    assert targets["speak"]["enum"] == ["ann"]
    assert targets["act"]["enum"] == ["a lamp"]
    assert targets["wait"] == {"description": targets["wait"]["description"], "type": "null"}
    # a world's own verb: anything here, or null (the flat enum)
    assert _string_branch(targets["trade"])["enum"] == ["gate", "well", "ann", "a lamp"]
    assert {"type": "null"} in targets["trade"]["anyOf"]
    for branch in sent["anyOf"]:  # each branch is still a strict object
        assert branch["additionalProperties"] is False
        assert branch["required"] == ["action", "target", "content", "reasoning"]
    # without cases (OpenAI's strict mode, Gemini, Anthropic): the flat enum, an object root
    flat = strict_schema(intention_schema({"trade": "swap"}), REFS.enums())
    assert flat["type"] == "object" and "anyOf" not in flat


def test_no_exit_means_no_move_and_no_one_here_means_speaking_to_no_one() -> None:
    alone = IntentionRefs(exits=(), people=(), objects=())
    targets = _branches(strict_schema(Intention, alone.enums(), grammar=True))
    assert "move" not in targets
    assert targets["speak"]["type"] == "null" and targets["act"]["type"] == "null"
    # what the schema allows, the check allows too
    for action in ("speak", "act", "wait"):
        answer = Intention(action=action, target=None, content="", reasoning="")
        assert alone.problem(answer) is None
    assert alone.problem(Intention(action="move", target=None, content="", reasoning=""))


def test_only_openais_own_api_gets_the_flat_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    from sim.providers.chat import ChatAdapter

    monkeypatch.setenv("SIM_TEST_NO_KEY", "sk-test")

    local = ChatAdapter(base_url="http://127.0.0.1:8080/v1", api_key_env="SIM_TEST_NO_KEY")
    hosted = ChatAdapter(base_url="https://api.openai.com/v1", api_key_env="SIM_TEST_NO_KEY")
    lookalike = ChatAdapter(
        base_url="http://127.0.0.1:9/api.openai.com/v1", api_key_env="SIM_TEST_NO_KEY"
    )
    assert not local.hosted and hosted.hosted and not lookalike.hosted


def test_a_local_server_gets_one_outcome_slot_per_character_present() -> None:
    """Gemma 3 270M gave outcomes to invented characters and none to those present: sent
    to a grammar-building server, the outcomes are a tuple, item i for the i-th character
    here, so the grammar makes one outcome for each and no other."""
    refs = ResolutionRefs(("ann", "bo", "cy"), ("gate",), ("a lamp",), frozenset())
    sent = strict_schema(Resolution, refs.enums(), grammar=True)
    outcomes = sent["properties"]["outcomes"]
    slots = outcomes["prefixItems"]
    assert [slot["properties"]["character_id"]["enum"] for slot in slots] == [
        ["ann"],
        ["bo"],
        ["cy"],
    ]
    assert outcomes["minItems"] == outcomes["maxItems"] == 3
    # no ``items`` after the tuple: llama.cpp's C++ builder would read it first
    assert "items" not in outcomes
    for slot in slots:  # each slot is the outcome's strict object, its exits limited too
        assert slot["additionalProperties"] is False
        assert _string_branch(slot["properties"]["moved_to"])["enum"] == ["gate"]
    # OpenAI's strict mode, Gemini, Anthropic: the flat enum in one item schema
    flat = strict_schema(Resolution, refs.enums())
    assert "prefixItems" not in flat["properties"]["outcomes"]
    assert flat["$defs"]["Outcome"]["properties"]["character_id"]["enum"] == ["ann", "bo", "cy"]
    # a crowd is not written out one slot each: the flat enum, and the check holds the rest
    crowd = tuple(f"c{i}" for i in range(MAX_EACH + 1))
    many = ResolutionRefs(crowd, ("gate",), (), frozenset())
    sent = strict_schema(Resolution, many.enums(), grammar=True)
    assert "prefixItems" not in sent["properties"]["outcomes"]
