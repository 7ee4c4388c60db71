"""Scoring a character's cells for retrieval, as arrays (numpy) over all of them at once.

Each element is computed as the plain loop would compute it (the same operations, in the
same order, on the same doubles), so the cells chosen are the loop's; the test
tests/unit/test_retrieve_scoring.py holds the loop and checks it. Imported only when a
phase retrieves (``sim.mind.retrieve``), so window worlds do not load numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from sim.config import MemoryConfig
from sim.mind.embed import similarities
from sim.mind.index import Floats, Ints
from sim.mind.lexical import bm25
from sim.mind.words import terms


def relevance(docs: Sequence[str], query: str, embeddings: bool) -> Floats:
    """Each document's relevance to the query, 0..1 (the best one's 1)."""
    raw = similarities(docs, query) if embeddings else bm25(docs, terms(query))
    top = float(raw.max()) if len(raw) else 0.0
    return raw / top if top > 0 else raw


#: the longest run of ages kept as a table of recencies (beyond it, each age is worked out)
_TABLE_LIMIT = 1 << 20
#: decay -> decay ** age for age 0, 1, 2, ... (each ``math.exp``, as a loop would compute it)
_RECENCY: dict[float, Floats] = {}


def recency(ages: Ints, decay: float) -> Floats:
    """``decay ** age`` for each age (ages >= 0), as ``math.exp(log(decay) * age)``."""
    log_decay = math.log(decay)
    oldest = int(ages.max()) if len(ages) else 0
    if oldest >= _TABLE_LIMIT:
        distinct, at = np.unique(ages, return_inverse=True)
        return np.array([math.exp(log_decay * a) for a in distinct.tolist()])[at]
    table = _RECENCY.get(decay)
    if table is None or len(table) <= oldest:
        size = max(oldest + 1, 2 * len(table) if table is not None else 1024)
        size = min(size, _TABLE_LIMIT)
        table = _RECENCY[decay] = np.array([math.exp(log_decay * a) for a in range(size)])
    return table[ages]


def best(
    cells: Sequence[dict[str, Any]], now_tick: int, query: str, config: MemoryConfig
) -> list[int]:
    """The positions of the ``config.k`` highest-scoring cells, in order; ties go to the
    later cell."""
    n = len(cells)
    try:  # one pass over the cells
        texts, ticks, rated = zip(
            *map(itemgetter("text", "tick", "importance"), cells), strict=True
        )
    except KeyError:  # a cell written before cells were rated
        texts, ticks, rated = zip(
            *[(c["text"], c["tick"], c.get("importance")) for c in cells], strict=True
        )
    weights = config.weights
    rel = relevance(texts, query, config.embeddings == "provider") if weights.relevance else 0.0
    if None in rated or 0 in rated:
        rated = tuple(i or config.importance for i in rated)
    importance = np.array(rated, dtype=np.int64)
    ages = np.maximum(now_tick - np.array(ticks, dtype=np.int64), 0)
    w_rec, w_imp, w_rel = weights.recency, weights.importance / 9, weights.relevance
    scores = w_rec * recency(ages, config.decay) + w_imp * (importance - 1) + w_rel * rel
    top = np.lexsort((np.arange(n), scores))[-config.k :]  # by score, then by position
    return sorted(top.tolist())
