"""Offline function calling: pick one of the offered tools and fill its arguments.

For sim's phase-1 tools (``move_to``, ``say``, ``act``, ``wait``) the choice is made by the
Intention skill and mapped onto whatever parameters the tools declare; any other tool set gets
a seeded choice and the generic schema filler.
"""

from __future__ import annotations

from collections.abc import Sequence
from random import Random
from typing import Any

from sim.offline import templates as T
from sim.offline.engine import Filler, loads, make_rng
from sim.offline.skills import ACTION_FOR_TOOL, MESSAGE, TOOL_FOR_ACTION, decide, pairs

Json = dict[str, Any]

_PHASE1 = frozenset(ACTION_FOR_TOOL)
_ARG_ROLES = {
    key: role
    for role, keys in {
        "target": (
            "location_id",
            "destination",
            "location",
            "target",
            "exit_id",
            "to",
            "character_id",
            "listener",
            "to_id",
            "target_id",
            "object",
            "item",
            "object_id",
        ),
        "content": ("words", "content", "message", "text", "utterance", "speech", "action", "what"),
        "reasoning": ("reasoning", "reason", "why", "rationale", "thought", "thinking"),
    }.items()
    for key in keys
}


def _tool_spec(tool: Json) -> tuple[str, Json]:
    fn = T.as_dict(tool.get("function")) or tool
    params = fn.get("parameters")
    return _s(fn.get("name")), params if isinstance(params, dict) else {"type": "object"}


def _s(value: object) -> str:
    return value if isinstance(value, str) else ""


def generate_tool_call(
    tools: list[Json],
    input_text: str,
    *,
    seed: str,
    history: Sequence[tuple[str, str]] = (),
) -> tuple[str, Json]:
    """Choose one tool and produce arguments valid for its parameter schema."""
    specs = [spec for t in tools if isinstance(t, dict) and (spec := _tool_spec(t))[0]]
    if not specs:
        return "", {}
    rng = make_rng(seed, "tool")
    by_name = dict(specs)
    phase1 = _PHASE1 & set(by_name)
    if len(phase1) >= 2:
        data = loads(input_text)
        if isinstance(data, dict):
            allowed = frozenset(ACTION_FOR_TOOL[n] for n in phase1)
            # a world's own verbs ([actions]): declared beside the phase-1 tools, with a target
            verbs = tuple(
                name
                for name, params in specs
                if name not in _PHASE1
                and name not in QUERY_TOOLS
                and "target" in T.as_dict(params.get("properties"))
            )
            contacts: list[tuple[str, str, str]] = []
            if MESSAGE in verbs and "contacts" in data:  # the message channel: to contacts
                contacts = pairs(data.get("contacts"))
                verbs = tuple(v for v in verbs if v != MESSAGE)
            try:
                choice = decide(data, rng, history, allowed, verbs, contacts)
                if choice is not None:
                    action = choice["action"]
                    tool = (
                        action if action in verbs or action == MESSAGE else TOOL_FOR_ACTION[action]
                    )
                    return tool, _tool_args(by_name[tool], choice, rng, input_text)
            except Exception:  # never raise: fall through to a generic call
                pass
    name, params = rng.choice(specs)
    try:
        args = Filler(params, rng, input_text).fill(params)
    except Exception:  # never raise on a malformed parameter schema
        args = None
    return name, args if isinstance(args, dict) else {}


def _tool_args(params: Json, choice: Json, rng: Random, input_text: str) -> Json:
    """Map an Intention (target/content/reasoning) onto a tool's declared parameters."""
    filler = Filler(params, rng, input_text)
    props = params.get("properties")
    props = props if isinstance(props, dict) else {}
    required = params.get("required")
    req = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set(props)
    args: Json = {}
    for key, sub in props.items():
        role = _ARG_ROLES.get(key)
        value = choice.get(role) if role else None
        if isinstance(value, str) and _accepts(filler, sub, value):
            args[key] = value
        elif key in req:
            args[key] = filler.fill(sub, 1, key)
    return args


def _accepts(filler: Filler, node: object, value: str) -> bool:
    """Whether a string ``value`` fits the (possibly optional / enum) schema ``node``."""
    if not isinstance(node, dict):
        return True
    node = filler.resolve_ref(node)
    options = node.get("anyOf") or node.get("oneOf")
    if isinstance(options, list):
        return any(
            _accepts(filler, o, value)
            for o in options
            if isinstance(o, dict) and o.get("type") != "null"
        )
    enum = node.get("enum")
    if isinstance(enum, list):
        return value in enum
    if "const" in node:
        return bool(node["const"] == value)
    kind = node.get("type")
    if kind not in ("string", None) and not (isinstance(kind, list) and "string" in kind):
        return False
    lo, hi = node.get("minLength", 0), node.get("maxLength")
    return (not isinstance(lo, int) or len(value) >= lo) and (
        not isinstance(hi, int) or len(value) <= hi
    )


#: sim's phase-1 query tools (``sim.phases.intention_steps``): asked before acting
QUERY_TOOLS = frozenset({"look", "recall", "inventory"})


def generate_query_call(
    offered: set[str], input_text: str, *, seed: str
) -> tuple[str, Json] | None:
    """A look/recall/inventory step for a character's situation, or ``None`` when no query
    tool is offered or the input is not a phase-1 situation.

    Looks at someone present (else an object, else an exit), or recalls a word of a goal,
    or checks the inventory when something is carried: a seeded choice among those.
    """
    data = loads(input_text)
    if not isinstance(data, dict) or not QUERY_TOOLS & offered:
        return None
    rng = make_rng(seed, "query")
    options: list[tuple[str, Json]] = []
    if "look" in offered:
        present = [p.get("id") for p in data.get("present") or () if isinstance(p, dict)]
        location = T.as_dict(data.get("location"))
        objects = location.get("objects")
        exits = [e.get("id") for e in data.get("exits") or () if isinstance(e, dict)]
        pools: list[list[Any]] = [present, objects if isinstance(objects, list) else [], exits]
        for pool in pools:
            names = [n for n in pool if isinstance(n, str) and n]
            if names:
                options.append(("look", {"target": rng.choice(names)}))
                break
    character = T.as_dict(data.get("character"))
    if "recall" in offered:
        goals = " ".join(g for g in character.get("goals") or () if isinstance(g, str))
        words = sorted({w for w in goals.replace(",", " ").split() if len(w) >= 5})
        if words:
            options.append(("recall", {"topic": rng.choice(words).strip(".;:!?").lower()}))
    if "inventory" in offered and character.get("inventory"):
        options.append(("inventory", {}))
    return rng.choice(options) if options else None
