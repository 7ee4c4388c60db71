"""Sim-specific offline "authors": the character's Intention, plus shared input helpers.

Each skill takes the parsed input dict, a seeded RNG, the chain window and the target schema,
and returns an output dict — or ``None`` when the input lacks what the skill needs (the engine
then falls back to the generic schema filler). The game master (Resolution) lives in
``resolution``; Narrative and MemorySummary in ``story``; the registry in ``engine``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from random import Random
from typing import Any

from sim import sections
from sim.offline import templates as T

Json = dict[str, Any]

ACTIONS = ("move", "speak", "act", "wait")
#: the message channel's action (``sim.messages``): its targets are the input's contacts
MESSAGE = "message"
_ALL_ACTIONS = frozenset(ACTIONS)
TOOL_FOR_ACTION = {"move": "move_to", "speak": "say", "act": "act", "wait": "wait"}
ACTION_FOR_TOOL = {v: k for k, v in TOOL_FOR_ACTION.items()}
_TARGET_KEYS = ("target", "location_id", "character_id", "object")
_ARG_ACTION = (("location_id", "move"), ("character_id", "speak"), ("object", "act"))
_RESTLESS = ("restless", "anxious", "curious", "eager", "bored", "impatient", "angry", "excited")
_SLUGGISH = ("tired", "calm", "content", "sad", "weary", "sleepy", "melancholy", "pensive")


def text_of(value: object) -> str:
    return value if isinstance(value, str) else ""


def strings(value: object) -> list[str]:
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, str) and v]


def pairs(value: object, extra: str = "") -> list[tuple[str, str, str]]:
    """``[{"id", "name", extra?}]`` → ``[(id, name, extra value)]``, skipping malformed entries."""
    out: list[tuple[str, str, str]] = []
    if isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                ident = item.get("id")
                if isinstance(ident, str) and ident:
                    name = item.get("name")
                    more = item.get(extra) if extra else ""
                    out.append(
                        (
                            ident,
                            name if isinstance(name, str) and name else ident,
                            more if isinstance(more, str) else "",
                        )
                    )
    return out


def loads(text: str) -> object:
    """A document: labelled sections (an input) or a JSON object (an answer)."""
    return sections.loads(text)


def prev_action(out: object) -> tuple[str, str | None] | None:
    """The (action, target) an earlier Intention output or phase-1 tool call recorded."""
    if not isinstance(out, dict):
        return None
    action = out.get("action")
    if action in ACTIONS:
        target = out.get("target")
        return str(action), target if isinstance(target, str) else None
    name = out.get("name") or out.get("tool")
    args = out.get("arguments", out.get("args"))
    if isinstance(name, str) and name in ACTION_FOR_TOOL and isinstance(args, dict):
        for key in _TARGET_KEYS:
            if isinstance(args.get(key), str):
                return ACTION_FOR_TOOL[name], args[key]
        return ACTION_FOR_TOOL[name], None
    for key, act in _ARG_ACTION:  # bare phase-1 tool arguments
        if isinstance(out.get(key), str):
            return act, out[key]
    if set(out) == {"reasoning"}:
        return "wait", None
    return None


@lru_cache(maxsize=4096)
def _prev_text(out: str) -> tuple[str, str | None] | None:
    return prev_action(loads(out))


@lru_cache(maxsize=4096)
def _pull(goals_lc: str, items: tuple[str, ...]) -> tuple[str, ...]:
    """The items whose distinctive word occurs in the (lowercased) goals."""
    if not goals_lc:
        return ()
    return tuple(i for i in items if (k := T.keyword(i)) and k in goals_lc)


def _clause(text: str, names_blob: str) -> str:
    first = text.lstrip().split(" ", 1)[0]
    return T.clause(text, keep=bool(first) and first in names_blob)


def _weighted(rng: Random, weights: dict[str, float]) -> str | None:
    total = sum(weights.values())
    if total <= 0:
        return None
    roll = rng.random() * total
    for key, weight in weights.items():
        roll -= weight
        if roll < 0 and weight > 0:
            return key
    return next(k for k, w in weights.items() if w > 0)


def _world_verb(
    verb: str,
    name: str,
    ch: Json,
    present: list[tuple[str, str, str]],
    goals: list[str],
    rng: Random,
) -> Json:
    """An intention to use one of the world's own verbs, in the character's own words."""
    target, label = rng.choice(present)[:2]
    goal = rng.choice(goals) if goals else text_of(ch.get("personality")).split(".", 1)[0]
    goal = goal.rstrip(".") if goal else "it has to be done"
    content = f"{name} means to {verb} {label}."
    reasoning = T.cap(f"{goal[:1].lower()}{goal[1:]}; to {verb} {label} serves that.")
    return {"action": verb, "target": target, "content": content, "reasoning": reasoning}


def _action_enum(schema: Json) -> list[Any] | None:
    """The values the schema's ``action`` may take: its enum, or, for a schema sent as one
    branch per action (``sim.llm.enums``), every branch's."""
    branches = schema.get("anyOf")
    if isinstance(branches, list):
        values = [value for branch in branches for value in _action_enum(branch) or ()]
        return values or None
    prop = schema.get("properties", {}).get("action", {})
    enum = prop.get("enum") if isinstance(prop, dict) else None
    return enum if isinstance(enum, list) else None


def _allowed_actions(schema: Json) -> frozenset[str]:
    enum = _action_enum(schema)
    if enum:
        return _allowed_from(tuple(a for a in enum if isinstance(a, str)))
    return _ALL_ACTIONS


@lru_cache(maxsize=64)
def _allowed_from(enum: tuple[str, ...]) -> frozenset[str]:
    return frozenset(a for a in enum if a in ACTIONS)


@lru_cache(maxsize=1024)
def _mood_bias(mood: str) -> tuple[bool, bool]:
    """(restless, sluggish) for a mood word or phrase."""
    low = mood.lower()
    return any(m in low for m in _RESTLESS), any(m in low for m in _SLUGGISH)


def intention(
    data: Json, rng: Random, history: Sequence[tuple[str, str]], schema: Json
) -> Json | None:
    verbs = _world_verbs(schema)
    contacts: list[tuple[str, str, str]] = []
    if MESSAGE in verbs and "contacts" in data:  # the channel on, with someone to reach
        contacts = pairs(data.get("contacts"))
        verbs = tuple(v for v in verbs if v != MESSAGE)
    return decide(data, rng, history, _allowed_actions(schema), verbs, contacts)


def _message(
    name: str,
    place: str,
    goals: list[str],
    contacts: list[tuple[str, str, str]],
    inbox: object,
    rng: Random,
) -> Json:
    """A message to a contact: passing on the last one received (now and then), else news
    of the sender's goal."""
    target, other = rng.choice(contacts)[:2]
    received = [m for m in inbox if isinstance(m, dict)] if isinstance(inbox, list) else []
    last = received[-1] if received else None
    heard = text_of(last.get("text")) if last is not None else ""
    if heard and rng.random() < 0.7:
        sender = text_of(last.get("name")) if last is not None else ""
        content = f"{T.address(other)}, word from {sender or 'a friend'}: {heard}"[:300]
        reasoning = f"{other} should hear what {sender or 'a friend'} wrote."
    else:
        goal = T.clause(rng.choice(goals)) if goals else "keep in touch"
        content = f"{T.address(other)}, it is {name} at {place}. I mean to {goal}."[:300]
        reasoning = T.cap(f"{other} is far off, and a message reaches them anywhere.")
    return {"action": MESSAGE, "target": target, "content": content, "reasoning": reasoning}


def _world_verbs(schema: Json) -> tuple[str, ...]:
    """The verbs a world declares in ``[actions]``: the action enum's non-built-in values."""
    enum = _action_enum(schema)
    if enum is None:
        return ()
    return tuple(a for a in enum if isinstance(a, str) and a not in _ALL_ACTIONS)


def decide(
    data: Json,
    rng: Random,
    history: Sequence[tuple[str, str]],
    allowed: frozenset[str],
    verbs: tuple[str, ...] = (),
    contacts: Sequence[tuple[str, str, str]] = (),
) -> Json | None:
    """Choose what a character does this tick. See the module docstring of ``sim.offline``.

    ``verbs`` are the world's own actions: chosen now and then, aimed at someone present
    (else at an object), with their outcome left to the game master as for ``act``.
    ``contacts``: whom a ``message`` may reach (the channel on); one is sent now and then,
    more often with a message to pass on or no one here.
    """
    ch, loc = data.get("character"), data.get("location")
    if not isinstance(ch, dict) or not isinstance(loc, dict):
        return None
    name = text_of(ch.get("name")) or text_of(ch.get("id")) or "Someone"
    here = text_of(loc.get("id"))
    place = text_of(loc.get("name")) or "this place"
    exits = pairs(data.get("exits"))
    present = pairs(data.get("present"), "mood")
    objects, held = strings(loc.get("objects")), strings(ch.get("inventory"))
    goals = strings(ch.get("goals"))
    restless, sluggish = _mood_bias(text_of(ch.get("mood")))
    names_blob = "|".join([name, place, *(e[1] for e in exits), *(p[1] for p in present)])
    goals_lc = " ".join(goals).lower()
    exit_pull = _pull(goals_lc, tuple(e[1] for e in exits))
    obj_pull = _pull(goals_lc, (*objects, *held))
    person_pull = _pull(goals_lc, tuple(p[1] for p in present))

    prev = [a for _, out in history if (a := _prev_text(out)) is not None]
    stuck = 0
    for act, tgt in reversed(prev):
        if act == "move" and tgt == here:
            break
        stuck += 1
    last = prev[-1] if prev else None
    just_arrived = last is not None and last[0] == "move" and last[1] == here

    alone = not present
    w = {
        "move": (4.0 if alone else 2.0) if exits else 0.0,
        "speak": 0.0 if alone else 5.0,
        "act": (3.0 if alone else 1.5) if objects or held else 0.0,
        "wait": 0.7 if alone else 1.0,
    }
    if exit_pull:
        w["move"] += 3.0
    if obj_pull:
        w["act"] += 2.5
    if person_pull:
        w["speak"] += 3.0
    if restless and exits:
        w["move"] += 1.5
    if sluggish:
        w["wait"] += 1.0
    if stuck >= 2 and exits:
        w["move"] += 2.0 * (stuck - 1)
    if last is not None and last[0] == "wait":
        w["wait"] *= 0.4
    if just_arrived:
        w["move"] *= 0.5
    for key in ACTIONS:
        if key not in allowed:
            w[key] = 0.0
    for verb in verbs:  # the world's own verbs are aimed at people: only with company
        w[verb] = 0.0 if alone else 2.0
    if contacts:  # after the others: a world without the channel draws as before
        w[MESSAGE] = (2.0 if alone else 1.0) + (1.5 if data.get("messages") else 0.0)
    action = _weighted(rng, w)
    if action is None:
        return None
    if action in verbs:
        return _world_verb(action, name, ch, present, goals, rng)
    if action == MESSAGE:
        return _message(name, place, goals, list(contacts), data.get("messages"), rng)

    goal = _clause(rng.choice(goals), names_blob) if goals else ""
    persona = text_of(ch.get("personality")).split(".", 1)[0]
    persona = _clause(persona, names_blob) or "restless by nature"
    kw: dict[str, Any] = {
        "name": name,
        "place": place,
        "atmos": text_of(loc.get("atmosphere")) or "quiet",
        "persona": persona,
        "goal": goal,
        "exit": "",
        "other": "someone",
        "omood": "tired",
        "obj": T.the(rng.choice(objects)) if objects else "the way things are going",
        "n": stuck,
    }
    kw["Obj"] = T.cap(kw["obj"])

    def goal_for(item: str) -> None:
        k = T.keyword(item)
        for g in goals:
            if k and k in g.lower():
                kw["goal"] = _clause(g, names_blob)
                return

    target: str | None = None
    recall: tuple[str, ...] = ()
    if action == "move":
        if exit_pull and rng.random() < 0.75:
            ename = rng.choice(exit_pull)
            target = next(e[0] for e in exits if e[1] == ename)
            goal_for(ename)
        else:
            target, ename = rng.choice(exits)[:2]
        kw["exit"] = ename
        pool = T.MOVE_GOAL + T.MOVE_PLAIN if kw["goal"] else T.MOVE_PLAIN
        content = rng.choice(pool).format(**kw)
        why = T.WHY_MOVE if kw["goal"] and rng.random() < 0.6 else T.WHY_MOVE_P
        if stuck >= 2:
            recall = T.RECALL_STUCK
    elif action == "speak":
        again = last is not None and last[0] == "speak" and any(p[0] == last[1] for p in present)
        if again and last is not None and rng.random() < 0.6:
            who = next(p for p in present if p[0] == last[1])
            pool = T.SPEAK_AGAIN
            recall = T.RECALL_SPOKE
        else:
            if person_pull and rng.random() < 0.7:
                pname = rng.choice(person_pull)
                who = next(p for p in present if p[1] == pname)
                goal_for(pname)
            else:
                who = rng.choice(present)
            pool = T.SPEAK_GOAL + T.SPEAK_PLAIN if kw["goal"] else T.SPEAK_PLAIN
        target, kw["other"], kw["omood"] = who[0], who[1], who[2] or "tired"
        said = kw["goal"]
        if who[1] in said:  # addressing the person the goal is about
            said = said.replace(who[1] + "'s", "your").replace(who[1], "you")
        content = rng.choice(pool).format(**{**kw, "goal": said, "other": T.address(who[1])})
        why = T.WHY_SPEAK if kw["goal"] and rng.random() < 0.6 else T.WHY_SPEAK_P
    elif action == "act":
        if obj_pull and rng.random() < 0.7:
            target = rng.choice(obj_pull)
            goal_for(target)
        else:
            target = rng.choice(objects + held)
        kw["obj"] = T.the(target)
        kw["Obj"] = T.cap(kw["obj"])
        if target in objects:
            pool = T.ACT_HERE_GOAL + T.ACT_HERE if kw["goal"] else T.ACT_HERE
        else:
            pool = T.ACT_HELD_GOAL + T.ACT_HELD if kw["goal"] else T.ACT_HELD
        content = rng.choice(pool).format(**kw)
        why = T.WHY_ACT if kw["goal"] and rng.random() < 0.6 else T.WHY_ACT_P
        if last is not None and last[0] == "act" and last[1] == target:
            recall = T.RECALL_ACTED
    else:
        content = rng.choice(T.WAIT).format(**kw)
        why = T.WHY_WAIT if kw["goal"] and rng.random() < 0.6 else T.WHY_WAIT_P
    if not recall and history:
        if just_arrived:
            recall = T.RECALL_MOVED
        elif last is not None and last[0] == "wait" and action != "wait":
            recall = T.RECALL_WAITED
        elif stuck >= 3 and rng.random() < 0.5:
            recall = T.RECALL_STUCK
    reasoning = T.cap(rng.choice(why).format(**kw))
    if recall:
        reasoning = T.cap(rng.choice(recall).format(**kw)) + " " + reasoning
    return {"action": action, "target": target, "content": content, "reasoning": reasoning}
