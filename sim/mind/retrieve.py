"""Retrieval: the ``k`` cells of a character's memory (window and long-term store) that score
highest by recency, importance and relevance to its situation (Generative Agents' memory
stream). Each part is scaled to 0..1 (recency ``decay ** age``, importance ``(i - 1) / 9``,
relevance divided by the best cell's) and weighted by ``[memory] weights``; ties go to the
later cell. The cells come back oldest first. Relevance reads a cell's text, where the
names of the people and places it mentions are.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sim.config import MemoryConfig
from sim.mind.embed import similarities
from sim.mind.lexical import bm25, terms
from sim.world import Entity, World


@dataclass(frozen=True)
class Situation:
    """What a character's memories are weighed against: now, and what is around it."""

    tick: int
    #: the place, the people present, the happenings, the goals, as one text
    text: str


def situation(
    world: World, char: Entity, here: Iterable[str], happenings: Sequence[str], tick: int
) -> Situation:
    """A character's situation: its place (id, name, objects), who is present (ids and
    names), the events injected there, and its goals."""
    loc = world.locations[char["state"]["location"]]
    parts = [loc["identity"]["id"], loc["identity"]["name"], *map(str, loc["state"]["objects"])]
    me = char["identity"]["id"]
    for cid in here:
        if cid != me:
            parts += [cid, world.characters[cid]["identity"]["name"]]
    parts += happenings
    parts += map(str, char["identity"]["goals"])
    return Situation(tick, " ".join(parts))


def candidates(memory: dict[str, Any]) -> list[dict[str, Any]]:
    """Every cell retrieval may pick: the long-term store, then the window."""
    return [*(memory.get("archive") or ()), *memory["cells"]]


def relevance(docs: Sequence[str], now: Situation, embeddings: bool) -> list[float]:
    """Each document's relevance to the situation, 0..1 (the best one's 1)."""
    raw = similarities(docs, now.text) if embeddings else bm25(docs, terms(now.text))
    top = max(raw, default=0.0)
    return [r / top for r in raw] if top > 0 else raw


def retrieve(memory: dict[str, Any], now: Situation, config: MemoryConfig) -> list[dict[str, Any]]:
    """The ``config.k`` best cells for this situation, oldest first."""
    cells = candidates(memory)
    if len(cells) <= config.k:
        return cells
    weights, decay, unrated = config.weights, config.decay, config.importance
    if weights.relevance:
        texts = [str(c["text"]) for c in cells]
        rel = relevance(texts, now, config.embeddings == "provider")
    else:
        rel = [0.0] * len(cells)
    log_decay = math.log(decay)
    w_rec, w_imp, w_rel = weights.recency, weights.importance / 9, weights.relevance
    scores = [
        w_rec * math.exp(log_decay * max(0, now.tick - c["tick"]))
        + w_imp * ((c.get("importance") or unrated) - 1)
        + w_rel * r
        for c, r in zip(cells, rel, strict=True)
    ]
    best = heapq.nlargest(config.k, range(len(cells)), key=lambda i: (scores[i], i))
    return [cells[i] for i in sorted(best)]


def recall_view(memory: dict[str, Any], now: Situation, config: MemoryConfig) -> list[str]:
    """The retrieved cells as a phase's input shows them, one line each (as the window's)."""
    return [f"tick {c['tick']}: {c['text']}" for c in retrieve(memory, now, config)]
