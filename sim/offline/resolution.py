"""Offline skill "Resolution": a location's game master settles everyone's intentions."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from random import Random
from typing import Any

from sim.offline import templates as T
from sim.offline.skills import loads, pairs, strings, text_of

Json = dict[str, Any]

_GRABBY = ("pocket", "pick up", "take", "grab", "lift", "steal", "keep")
_FIXED = frozenset(
    (
        "table",
        "door",
        "well",
        "altar",
        "statue",
        "fountain",
        "bed",
        "fireplace",
        "hearth",
        "counter",
        "bar",
        "window",
        "shelf",
        "shelves",
        "bench",
        "gate",
        "wall",
        "tree",
        "anvil",
        "forge",
        "wagon",
        "cart",
        "stall",
        "piano",
        "organ",
        "boat",
        "ship",
        "throne",
        "pillar",
        "stove",
        "oven",
        "loom",
        "desk",
        "wardrobe",
        "bookcase",
        "bookshelf",
        "mirror",
        "cauldron",
        "furnace",
        "press",
        "mill",
        "wheel",
        "board",
        "sign",
        "pool",
        "pond",
        "stream",
        "river",
        "bridge",
        "fence",
        "post",
        "tower",
        "bell",
        "clock",
        "millstone",
        "stairs",
        "chest",
        "bin",
        "screen",
        "railing",
        "trapdoor",
        "causeway",
        "slide",
        "cairn",
        "lens",
        "crane",
        "dock",
        "pier",
        "jetty",
        "hatch",
        "kiln",
        "vat",
        "tank",
        "altarpiece",
        "lighthouse",
        "road",
        "ladder",
        "pole",
        "rack",
        "stalls",
        "pools",
        "nets",
        "boat",
        "rowboat",
        "lanterns",
    )
)


_PREPS = frozenset(
    (
        "of",
        "up",
        "down",
        "to",
        "by",
        "on",
        "under",
        "above",
        "with",
        "in",
        "for",
        "from",
        "at",
        "over",
        "near",
        "beside",
        "behind",
        "against",
    )
)


@lru_cache(maxsize=4096)
def _head_noun(obj: str) -> str:
    """'iron ladder up to the quay' → 'ladder'; 'crate of sand' → 'crate'."""
    head = ""
    for word in obj.lower().split():
        if word in _PREPS:
            break
        head = word.strip(",;:")
        if word.endswith(","):
            break
    return head


@lru_cache(maxsize=1024)
def _last_resolution(
    last_in: str, last_out: str
) -> tuple[dict[str, tuple[Any, Any]], dict[str, str], list[str]]:
    """From the previous exchange: intentions by character id, names by id, removed objects.

    Cached (the caller passes the same window strings tick after tick); treat as read-only.
    """
    intents: dict[str, tuple[Any, Any]] = {}
    names: dict[str, str] = {}
    removed: list[str] = []
    prev_in, prev_out = loads(last_in), loads(last_out)
    if isinstance(prev_in, dict):
        chars = prev_in.get("characters")
        for c in chars if isinstance(chars, list) else ():
            if isinstance(c, dict) and isinstance(c.get("id"), str):
                names[c["id"]] = text_of(c.get("name")) or c["id"]
                it = c.get("intention")
                if isinstance(it, dict):
                    intents[c["id"]] = (it.get("action"), it.get("target"))
    if isinstance(prev_out, dict) and isinstance(prev_out.get("location_update"), dict):
        removed = strings(prev_out["location_update"].get("objects_removed"))
    return intents, names, removed


def resolve(
    data: Json, rng: Random, history: Sequence[tuple[str, str]], schema: Json
) -> Json | None:
    """A location's game master: one outcome per character, plus an optional location update."""
    loc, chars = data.get("location"), data.get("characters")
    if not isinstance(loc, dict) or not isinstance(chars, list):
        return None
    place = text_of(loc.get("name")) or "the place"
    available = strings(loc.get("objects"))
    exits = {e[0]: e[1] for e in pairs(data.get("exits"))}
    names = {c[0]: c[1] for c in pairs(chars)}
    prev_intents, prev_names, prev_removed = (
        _last_resolution(*history[-1]) if history else ({}, {}, [])
    )
    added: list[str] = []
    removed: list[str] = []
    left: list[str] = []
    outcomes: list[Json] = []
    gone: set[str] = set()
    talked = False
    used: set[str] = set()

    def pick(pool: tuple[str, ...]) -> str:  # avoid repeating a template within one turn
        fresh = [p for p in pool if p not in used]
        choice = rng.choice(fresh or pool)
        used.add(choice)
        return choice

    kw: dict[str, Any] = {"place": place, "atmos": text_of(loc.get("atmosphere")) or "quiet"}
    for c in chars:
        if not isinstance(c, dict) or not isinstance(c.get("id"), str):
            continue
        cid = c["id"]
        name: str = names.get(cid) or cid
        kw["name"] = name
        it = T.as_dict(c.get("intention"))
        action, target, content = it.get("action"), it.get("target"), text_of(it.get("content"))
        held = strings(c.get("inventory"))
        moved_to: str | None = None
        gained: list[str] = []
        lost: list[str] = []
        moods: tuple[str, ...] = T.MOODS_IDLE
        if action == "move" and isinstance(target, str) and target in exits:
            kw["exit"] = exits[target]
            if rng.random() < 0.85:
                moved_to, moods = target, T.MOODS_GO
                left.append(name)
                gone.add(cid)
                said = [pick(T.GO_OK).format(**kw)]
            else:
                kw["why"] = pick(T.GO_OBSTACLE)
                said, moods = [pick(T.GO_FAIL).format(**kw)], T.MOODS_STUCK
        elif action == "speak" and isinstance(target, str) and target in gone:
            kw["other"] = names[target]
            said, moods = [T.SAY_GONE.format(**kw)], T.MOODS_STUCK
        elif action == "speak" and isinstance(target, str) and target in names and target != cid:
            kw["other"] = names[target]
            kw["words"] = T.short(content.replace('"', "'"), 90) or "Well?"
            good = rng.random() < 0.6
            talked = True
            moods = T.MOODS_GOOD if good else T.MOODS_BAD
            said = [
                pick(T.SAY).format(**kw),
                pick(T.REACT_GOOD if good else T.REACT_BAD).format(**kw),
            ]
        elif action == "speak":
            said = [pick(T.SAY_EMPTY).format(**kw)]
        elif action == "act":
            obj = target if isinstance(target, str) and target else ""
            kw["obj"] = T.the(obj)
            moods = T.MOODS_ACT
            if obj in available:
                head = _head_noun(obj)
                grabby = any(w in content.lower() for w in _GRABBY)
                if head not in _FIXED and rng.random() < (0.6 if grabby else 0.1):
                    said = [pick(T.TAKE).format(**kw)]
                    gained = [obj]
                    available.remove(obj)
                    removed.append(obj)
                else:
                    kw["found"] = pick(T.FOUND)
                    said = [pick(T.USE_HERE).format(**kw)]
            elif obj and obj in held:
                if rng.random() < 0.15:
                    said, lost = [pick(T.DROP).format(**kw)], [obj]
                    added.append(obj)
                else:
                    said = [pick(T.USE_HELD).format(**kw)]
            else:
                kw["obj"] = T.the(obj or "something useful")
                said, moods = [pick(T.NOT_FOUND).format(**kw)], T.MOODS_STUCK
        elif action == "message" and isinstance(target, str) and target:
            # the message channel (``sim.messages``): sent from here, delivered by apply
            said, moods = [f"{name} sent a message to {names.get(target, target)}."], T.MOODS_GOOD
        elif isinstance(action, str) and action and action not in _BUILTIN_ACTIONS:
            # a verb the world declares: decided as for ``act``, aimed at someone or something
            other = names.get(target) if isinstance(target, str) else None
            thing = T.the(target if isinstance(target, str) and target else "something")
            label = other or f"with {thing}"
            ok = rng.random() < 0.55
            moods = T.MOODS_GOOD if ok else T.MOODS_BAD
            tail = (
                ", and it went as hoped."
                if ok
                else f", but {other or 'it'} would not go along with it."
            )
            said = [f"{name} tried to {action} {label}{tail}"]
        else:
            said = [pick(T.IDLE).format(**kw)]
        if history and len(said) == 1 and not moved_to and rng.random() < 0.7:
            recall = _gm_recall(cid, prev_intents, prev_names, kw)
            if recall:
                said.append(recall)
        outcomes.append(
            {
                "character_id": cid,
                "outcome": " ".join(said),
                "moved_to": moved_to,
                "mood": rng.choice(moods) if rng.random() < 0.35 else None,
                "gained": gained,
                "lost": lost,
            }
        )
    atmosphere: str | None = None
    if left and rng.random() < 0.3:
        atmosphere = rng.choice(T.ATMOS_LEFT).format(name=left[0])
    elif removed and rng.random() < 0.6:
        atmosphere = rng.choice(T.ATMOS_TAKEN).format(obj=T.the(removed[0]))
    elif prev_removed and rng.random() < 0.3:
        atmosphere = T.ATMOS_MISSING.format(obj=T.the(prev_removed[0]))
    elif talked and rng.random() < 0.25:
        atmosphere = rng.choice(T.ATMOS_TALK)
    elif rng.random() < 0.15:
        atmosphere = rng.choice(T.ATMOS_ANY)
    if _rates(schema):
        for item in outcomes:
            item["importance"] = importance(item)
    update = None
    if atmosphere or added or removed:
        update = {"atmosphere": atmosphere, "objects_added": added, "objects_removed": removed}
    return {"outcomes": outcomes, "location_update": update}


_BUILTIN_ACTIONS = frozenset({"move", "speak", "act", "wait"})
#: words that make a memory weigh more (secrets, loss, violence, love)
_WEIGHTY = (
    "secret",
    "hid",
    "hidden",
    "key",
    "stole",
    "steal",
    "thief",
    "smuggl",
    "dead",
    "died",
    "kill",
    "blood",
    "fire",
    "love",
    "betray",
    "threat",
    "promise",
    "gold",
    "lost",
    "fled",
)


def _rates(schema: Json) -> bool:
    """Whether the resolution schema asks each outcome for its importance."""
    rated = schema.get("$defs", {}).get("RatedOutcome")
    return isinstance(rated, dict) and "importance" in rated.get("properties", {})


def importance(outcome: Json) -> int:
    """An outcome's importance, 1..10, from what happened (no draw from the RNG, so the
    outcomes are the ones an unrated resolution gives): a change of place, hands or mood
    weighs more than idling, and each weighty word (a secret, a theft, a death) more still."""
    score = 2
    if outcome.get("moved_to"):
        score += 1
    if outcome.get("gained") or outcome.get("lost"):
        score += 3
    if outcome.get("mood"):
        score += 1
    text = str(outcome.get("outcome", "")).lower()
    score += 2 * sum(1 for word in _WEIGHTY if word in text)
    return max(1, min(10, score))


def _gm_recall(
    cid: str, intents: dict[str, tuple[Any, Any]], names: dict[str, str], kw: dict[str, Any]
) -> str:
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
