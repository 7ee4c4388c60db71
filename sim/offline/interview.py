"""The offline model's ``InterviewAnswer`` skill: a character answers a question (``sim ask``).

Written from the interview input (``sim.interview.interview_input``): the character's
name, mood, goals and memories, and the question. Deterministic for a given seed, in the
first person, and built only from what the input holds, so an offline survey reads like
the characters rather than like filler.
"""

from __future__ import annotations

from collections.abc import Sequence
from random import Random
from typing import Any

Json = dict[str, Any]

_OPENERS = ("Honestly?", "If you must know,", "Hm.", "Well,", "Between us,", "Truly,")
_TIES = (
    "all I can think about is how to {goal}",
    "what matters to me is that I {goal}",
    "I mean to {goal}, whatever it takes",
    "my mind is on one thing: to {goal}",
)
_MEMORY = (
    'I keep coming back to it: "{memory}"',
    'I have not forgotten: "{memory}"',
    'You should know this: "{memory}"',
)
_CLOSERS = ("Ask me again tomorrow.", "That is all I will say.", "Make of that what you will.")


def _text(value: object) -> str:
    return value.strip() if isinstance(value, str) else ""


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text else text


def _sentence(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1].rsplit(" ", 1)[0] + "…"
    return text if text.endswith((".", "!", "?", "…")) else text + "."


def answer(
    data: Json, rng: Random, history: Sequence[tuple[str, str]], schema: Json
) -> Json | None:
    """``{"answer": ...}`` in the character's voice, or ``None`` for an input it cannot use."""
    you = data.get("you")
    question = _text(data.get("question"))
    if not isinstance(you, dict) or not question:
        return None
    goals = [g for g in (you.get("goals") or []) if isinstance(g, str) and g.strip()]
    mood = _text(you.get("mood"))
    found = data.get("memory")
    memory: Json = found if isinstance(found, dict) else {}
    cells = [_text(c.get("text")) for c in (memory.get("recent") or []) if isinstance(c, dict)]
    recalled = [c for c in cells if c] or ([_text(memory.get("summary"))] if memory else [])
    parts = [rng.choice(_OPENERS)]
    topic = _sentence(question.rstrip("?!. "), 90).rstrip(".…")
    parts.append(f'"{topic}?" you ask.')
    if goals:
        goal = _lower_first(rng.choice(goals).rstrip("."))
        tie = rng.choice(_TIES).format(goal=goal)
        parts.append(_sentence(tie[:1].upper() + tie[1:]))
    if recalled and recalled[-1]:
        parts.append(rng.choice(_MEMORY).format(memory=_sentence(recalled[-1], 140)))
    if mood:
        parts.append(f"I am {mood}, if that tells you anything.")
    parts.append(rng.choice(_CLOSERS))
    return {"answer": " ".join(parts)}


__all__ = ["answer"]
