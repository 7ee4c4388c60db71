"""Sim-specific offline "authors": the character (Intention) and the game master (Resolution).

Each skill takes the parsed input dict, a seeded RNG, the chain window and the target schema,
and returns an output dict — or ``None`` when the input lacks what the skill needs (the engine
then falls back to the generic schema filler). Narrative and memory live in ``story``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from random import Random
from typing import Any

import orjson

from sim.llm.offline import templates as T
from sim.llm.offline.story import narrate, summarize

Json = dict[str, Any]
Skill = Callable[[Json, Random, Sequence[tuple[str, str]], Json], Json | None]

ACTIONS = ("move", "speak", "act", "wait")
TOOL_FOR_ACTION = {"move": "move_to", "speak": "say", "act": "act", "wait": "wait"}
ACTION_FOR_TOOL = {v: k for k, v in TOOL_FOR_ACTION.items()}
_TARGET_KEYS = ("target", "location_id", "character_id", "object")
_RESTLESS = ("restless", "anxious", "curious", "eager", "bored", "impatient", "angry", "excited")
_SLUGGISH = ("tired", "calm", "content", "sad", "weary", "sleepy", "melancholy", "pensive")
_FIXED = frozenset(
    (
        "table", "door", "well", "altar", "statue", "fountain", "bed", "fireplace", "hearth",
        "counter", "bar", "window", "shelf", "shelves", "bench", "gate", "wall", "tree", "anvil",
        "forge", "wagon", "cart", "stall", "piano", "organ", "boat", "ship", "throne", "pillar",
        "stove", "oven", "loom", "desk", "wardrobe", "bookcase", "bookshelf", "mirror", "cauldron",
        "furnace", "press", "mill", "wheel",
    )
)


def _s(value: object) -> str:
    return value if isinstance(value, str) else ""


def _strs(value: object) -> list[str]:
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, str) and v]


def _pairs(value: object, *extra: str) -> list[tuple[str, ...]]:
    """``[{"id", "name", ...}]`` → ``[(id, name, *extra)]``, skipping malformed entries."""
    out: list[tuple[str, ...]] = []
    if isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                ident = item.get("id")
                if isinstance(ident, str) and ident:
                    name = _s(item.get("name")) or ident
                    out.append((ident, name, *(_s(item.get(k)) for k in extra)))
    return out


def _loads(text: str) -> object:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


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
    if name in ACTION_FOR_TOOL and isinstance(args, dict):
        for key in _TARGET_KEYS:
            if isinstance(args.get(key), str):
                return ACTION_FOR_TOOL[str(name)], args[key]
        return ACTION_FOR_TOOL[str(name)], None
    return None


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


def _allowed_actions(schema: Json) -> frozenset[str]:
    prop = schema.get("properties", {}).get("action", {})
    enum = prop.get("enum") if isinstance(prop, dict) else None
    if isinstance(enum, list) and enum:
        return frozenset(a for a in enum if a in ACTIONS)
    return frozenset(ACTIONS)


def intention(
    data: Json, rng: Random, history: Sequence[tuple[str, str]], schema: Json
) -> Json | None:
    return decide(data, rng, history, _allowed_actions(schema))


def decide(
    data: Json, rng: Random, history: Sequence[tuple[str, str]], allowed: frozenset[str]
) -> Json | None:
    """Choose what a character does this tick. See the module docstring of ``sim.llm.offline``."""
    ch, loc = data.get("character"), data.get("location")
    if not isinstance(ch, dict) or not isinstance(loc, dict):
        return None
    name = _s(ch.get("name")) or _s(ch.get("id")) or "Someone"
    here = _s(loc.get("id"))
    place = _s(loc.get("name")) or "this place"
    exits = _pairs(data.get("exits"))
    present = _pairs(data.get("present"), "mood")
    objects, held = _strs(loc.get("objects")), _strs(ch.get("inventory"))
    goals = _strs(ch.get("goals"))
    mood = _s(ch.get("mood")).lower()
    proper = frozenset(n.split(" ", 1)[0] for n in [name, place] + [e[1] for e in exits + present])
    goals_lc = " ".join(goals).lower()

    def pulled(items: list[str]) -> list[str]:
        return [i for i in items if (k := T.keyword(i)) and k in goals_lc] if goals_lc else []

    exit_pull = pulled([e[1] for e in exits])
    obj_pull = pulled(objects + held)
    person_pull = pulled([p[1] for p in present])

    prev = [a for _, out in history if (a := prev_action(_loads(out))) is not None]
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
    if any(m in mood for m in _RESTLESS) and exits:
        w["move"] += 1.5
    if any(m in mood for m in _SLUGGISH):
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
    action = _weighted(rng, w)
    if action is None:
        return None

    goal = T.clause(rng.choice(goals), proper) if goals else ""
    persona = T.clause(_s(ch.get("personality")).split(".")[0], proper) or "restless by nature"
    kw: dict[str, Any] = {
        "name": name, "place": place, "atmos": _s(loc.get("atmosphere")) or "quiet",
        "persona": persona, "goal": goal, "exit": "", "other": "someone", "omood": "tired",
        "obj": T.the(rng.choice(objects)) if objects else "the way things are going", "n": stuck,
    }
    kw["Obj"] = T.cap(kw["obj"])

    def goal_for(item: str) -> None:
        k = T.keyword(item)
        for g in goals:
            if k and k in g.lower():
                kw["goal"] = T.clause(g, proper)
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
        if who[1] in kw["goal"]:  # addressing the person the goal is about
            said = kw["goal"].replace(who[1] + "'s", "your").replace(who[1], "you")
            content = rng.choice(pool).format(**{**kw, "goal": said})
        else:
            content = rng.choice(pool).format(**kw)
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
    return {"action": action, "target": target, "content": content,
            "reasoning": reasoning}


# --------------------------------------------------------------------------- resolution


def _last_resolution(
    history: Sequence[tuple[str, str]],
) -> tuple[dict[str, tuple[Any, Any]], dict[str, str], list[str]]:
    """From the previous exchange: intentions by character id, names by id, removed objects."""
    intents: dict[str, tuple[Any, Any]] = {}
    names: dict[str, str] = {}
    removed: list[str] = []
    if not history:
        return intents, names, removed
    prev_in, prev_out = _loads(history[-1][0]), _loads(history[-1][1])
    if isinstance(prev_in, dict):
        for c in prev_in.get("characters") or ():
            if isinstance(c, dict) and isinstance(c.get("id"), str):
                names[c["id"]] = _s(c.get("name")) or c["id"]
                it = c.get("intention")
                if isinstance(it, dict):
                    intents[c["id"]] = (it.get("action"), it.get("target"))
    if isinstance(prev_out, dict) and isinstance(prev_out.get("location_update"), dict):
        removed = _strs(prev_out["location_update"].get("objects_removed"))
    return intents, names, removed


def resolve(
    data: Json, rng: Random, history: Sequence[tuple[str, str]], schema: Json
) -> Json | None:
    """A location's game master: one outcome per character, plus an optional location update."""
    loc, chars = data.get("location"), data.get("characters")
    if not isinstance(loc, dict) or not isinstance(chars, list):
        return None
    place = _s(loc.get("name")) or "the place"
    available = _strs(loc.get("objects"))
    exits = {e[0]: e[1] for e in _pairs(data.get("exits"))}
    names = {c[0]: c[1] for c in _pairs(chars)}
    prev_intents, prev_names, prev_removed = _last_resolution(history)
    added: list[str] = []
    removed: list[str] = []
    left: list[str] = []
    outcomes: list[Json] = []
    kw: dict[str, Any] = {"place": place, "atmos": _s(loc.get("atmosphere")) or "quiet"}
    for c in chars:
        if not isinstance(c, dict) or not isinstance(c.get("id"), str):
            continue
        cid = c["id"]
        name: str = names.get(cid) or cid
        kw["name"] = name
        it = T.as_dict(c.get("intention"))
        action, target, content = it.get("action"), it.get("target"), _s(it.get("content"))
        held = _strs(c.get("inventory"))
        moved_to: str | None = None
        gained: list[str] = []
        lost: list[str] = []
        moods: tuple[str, ...] = T.MOODS_IDLE
        if action == "move" and isinstance(target, str) and target in exits:
            kw["exit"] = exits[target]
            if rng.random() < 0.85:
                moved_to, moods = target, T.MOODS_GO
                left.append(name)
                said = [rng.choice(T.GO_OK).format(**kw)]
            else:
                kw["why"] = rng.choice(T.GO_OBSTACLE)
                said, moods = [rng.choice(T.GO_FAIL).format(**kw)], T.MOODS_STUCK
        elif action == "speak" and isinstance(target, str) and target in names and target != cid:
            kw["other"] = names[target]
            kw["words"] = T.short(content.replace('"', "'"), 90) or "Well?"
            good = rng.random() < 0.6
            moods = T.MOODS_GOOD if good else T.MOODS_BAD
            said = [rng.choice(T.SAY).format(**kw),
                    rng.choice(T.REACT_GOOD if good else T.REACT_BAD).format(**kw)]
        elif action == "speak":
            said = [rng.choice(T.SAY_EMPTY).format(**kw)]
        elif action == "act":
            obj = target if isinstance(target, str) and target else ""
            kw["obj"] = T.the(obj)
            moods = T.MOODS_ACT
            if obj in available:
                last_word = obj.lower().rsplit(" ", 1)[-1]
                if last_word not in _FIXED and rng.random() < 0.45:
                    said = [rng.choice(T.TAKE).format(**kw)]
                    gained = [obj]
                    available.remove(obj)
                    removed.append(obj)
                else:
                    kw["found"] = rng.choice(T.FOUND)
                    said = [rng.choice(T.USE_HERE).format(**kw)]
            elif obj and obj in held:
                if rng.random() < 0.15:
                    said, lost = [rng.choice(T.DROP).format(**kw)], [obj]
                    added.append(obj)
                else:
                    said = [rng.choice(T.USE_HELD).format(**kw)]
            else:
                kw["obj"] = T.the(obj or "something useful")
                said, moods = [rng.choice(T.NOT_FOUND).format(**kw)], T.MOODS_STUCK
        else:
            said = [rng.choice(T.IDLE).format(**kw)]
        if history and len(said) == 1 and rng.random() < 0.7:
            recall = _gm_recall(cid, prev_intents, prev_names, kw)
            if recall:
                said.append(recall)
        outcomes.append({
            "character_id": cid, "outcome": " ".join(said), "moved_to": moved_to,
            "mood": rng.choice(moods) if rng.random() < 0.35 else None,
            "gained": gained, "lost": lost,
        })
    atmosphere: str | None = None
    if left and rng.random() < 0.5:
        atmosphere = T.ATMOS_LEFT.format(name=left[0])
    elif removed:
        atmosphere = T.ATMOS_TAKEN
    elif prev_removed and rng.random() < 0.4:
        atmosphere = T.ATMOS_MISSING.format(obj=T.the(prev_removed[0]))
    elif rng.random() < 0.25:
        atmosphere = rng.choice(T.ATMOS_ANY)
    update = None
    if atmosphere or added or removed:
        update = {"atmosphere": atmosphere, "objects_added": added, "objects_removed": removed}
    return {"outcomes": outcomes, "location_update": update}


def _gm_recall(cid: str, intents: dict[str, tuple[Any, Any]], names: dict[str, str],
               kw: dict[str, Any]) -> str:
    if not intents:
        return ""
    if cid not in intents:
        return T.GM_RECALL_NEW.format(**kw)
    action, target = intents[cid]
    if action == "act" and isinstance(target, str) and target:
        return T.GM_RECALL_ACT.format(name=kw["name"], obj=T.the(target))
    if action == "speak" and isinstance(target, str) and target in names:
        return T.GM_RECALL_SAY.format(name=kw["name"], other=names[target])
    if action == "wait":
        return T.GM_RECALL_WAIT.format(**kw)
    return ""


SKILLS: dict[str, Skill] = {
    "Intention": intention,
    "Resolution": resolve,
    "Narrative": narrate,
    "MemorySummary": summarize,
}
