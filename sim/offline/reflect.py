"""The offline model's reflections (schema title ``Reflection``): insights drawn from the
numbered memories it is given: who of the ``people`` given keeps coming up, what thing
recurs, what bears on the character's goals, and the memory that stands out; each cites
its sources."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from random import Random
from typing import Any

from sim.offline.skills import strings, text_of

Json = dict[str, Any]

_WORD = re.compile(r"[a-z]{4,}")
_DULL = frozenset(
    [
        "that",
        "this",
        "with",
        "from",
        "they",
        "them",
        "their",
        "there",
        "then",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "would",
        "could",
        "should",
        "about",
        "after",
        "again",
        "before",
        "being",
        "into",
        "only",
        "over",
        "some",
        "than",
        "very",
        "said",
        "says",
        "nothing",
        "came",
        "waited",
        "still",
        "seemed",
        "looked",
        "turned",
        "found",
        "tried",
        "went",
        "back",
        "around",
        "here",
        "left",
        "right",
        "just",
        "like",
        "more",
        "much",
        "little",
        "while",
        "quiet",
    ]
)
_PEOPLE = (
    "{who} has been part of much of what {me} lived lately; {me} means to keep an eye on them.",
    "{me} keeps crossing paths with {who}, and is starting to wonder why.",
)
_THEME = (
    "Again and again it comes back to the {what}: {me} senses it matters more than it seemed.",
    "The {what} keeps turning up; {me} suspects it is the thread that ties things together.",
)
_GOAL = "All of this bears on what {me} wants: {goal}."
_STANDS_OUT = "What happened at tick {tick} still weighs on {me}: {text}"


def _short(text: str, limit: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def reflect(
    data: Json, rng: Random, history: Sequence[tuple[str, str]], schema: Json
) -> Json | None:
    char, memories = data.get("character"), data.get("memories")
    if not isinstance(char, dict) or not isinstance(memories, list):
        return None
    cells = [
        (m["n"], int(m.get("tick") or 0), text_of(m.get("text")))
        for m in memories
        if isinstance(m, dict) and isinstance(m.get("n"), int) and text_of(m.get("text"))
    ]
    if not cells:
        return {"insights": []}
    wanted = data.get("insights")
    limit = wanted if isinstance(wanted, int) and 0 < wanted <= 10 else 3
    name = text_of(char.get("name")) or "They"
    me = name.split()[0]
    people: dict[str, list[int]] = {}
    things: dict[str, list[int]] = {}
    # words of names are people, not themes
    named = {w.lower() for who in (name, *strings(data.get("people"))) for w in who.split()}
    for n, _, text in cells:
        for who in strings(data.get("people")):
            if who in text or who.split()[0] in text.split():
                people.setdefault(who, []).append(n)
        for word in dict.fromkeys(_WORD.findall(text.lower())):
            if word not in _DULL and word not in named:
                things.setdefault(word, []).append(n)
    insights: list[Json] = []
    if people:
        who, cited = max(people.items(), key=lambda kv: (len(kv[1]), kv[0]))
        if len(cited) >= 2:
            text = rng.choice(_PEOPLE).format(who=who, me=me)
            insights.append({"text": text, "sources": cited, "importance": 6})
    counts = Counter({w: len(ns) for w, ns in things.items() if len(ns) >= 2})
    if counts:
        what = min(counts, key=lambda w: (-counts[w], w))
        text = rng.choice(_THEME).format(what=what, me=me)
        insights.append({"text": text, "sources": things[what], "importance": 5})
    for goal in strings(char.get("goals")):
        words = {w for w in _WORD.findall(goal.lower()) if w not in _DULL}
        cited = [n for n, _, text in cells if words.intersection(_WORD.findall(text.lower()))]
        if cited:
            text = _GOAL.format(me=me, goal=goal[0].lower() + goal[1:].rstrip("."))
            insights.append({"text": text, "sources": cited, "importance": 6})
            break
    n, tick, text = cells[0]  # retrieval put the strongest first in time; the oldest kept
    insights.append(
        {
            "text": _STANDS_OUT.format(tick=tick, me=me, text=_short(text)),
            "sources": [n],
            "importance": 7,
        }
    )
    return {"insights": insights[:limit]}
