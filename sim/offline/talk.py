"""The offline model's side of a conversation (schema title ``Utterance``): an opening from
the speaker's intention, then replies that pick up a word of the last line, and a close
once a few turns have passed."""

from __future__ import annotations

import re
from collections.abc import Sequence
from random import Random
from typing import Any

from sim.offline.skills import text_of

Json = dict[str, Any]

_THING = re.compile(r"\bthe ([a-z]{4,})\b")
_DULL = frozenset({"about", "there", "would", "could", "which", "their"})
_REPLIES = (
    "{other}, you keep saying '{word}'. What do you really know about it?",
    "About the {word}: I have heard something too, but not from anyone I trust.",
    "If it is the {word} that worries you, {other}, you are not the only one.",
    "I would not speak of the {word} so loudly here.",
    "Tell me more about the {word}, and I will tell you what I saw.",
)
_PLAIN = (
    "I hear you, {other}. Go on.",
    "That is not how I remember it, {other}.",
    "Maybe. But why tell me?",
)
_CLOSE = (
    "Enough for now, {other}. We will speak again.",
    "I have to go. Think on what I said.",
    "Let us leave it there, {other}.",
)


def utter(data: Json, rng: Random, history: Sequence[tuple[str, str]], schema: Json) -> Json | None:
    speaker, others = data.get("speaker"), data.get("with")
    if not isinstance(speaker, dict) or not isinstance(others, list) or not others:
        return None
    other = text_of(others[0].get("name") if isinstance(others[0], dict) else None) or "friend"
    first = other.split()[0]
    dialogue = [d for d in data.get("dialogue") or [] if isinstance(d, dict)]
    given_turn, given_cap = data.get("turn"), data.get("max_turns")
    turn = given_turn if isinstance(given_turn, int) else len(dialogue) + 1
    cap = given_cap if isinstance(given_cap, int) else 4
    if not dialogue:
        opening = text_of(data.get("opening")).strip()
        return {"says": opening or f"{first}, have you got a moment?", "ends": cap <= 1}
    if turn >= cap or (turn >= 3 and rng.random() < 0.5):
        return {"says": rng.choice(_CLOSE).format(other=first), "ends": True}
    last = text_of(dialogue[-1].get("says"))
    # a thing the last line named ("the crate"), else nothing to pick up
    words = [w for w in _THING.findall(last.lower()) if w not in _DULL]
    if words:
        return {
            "says": rng.choice(_REPLIES).format(other=first, word=rng.choice(words)),
            "ends": False,
        }
    return {"says": rng.choice(_PLAIN).format(other=first), "ends": False}
