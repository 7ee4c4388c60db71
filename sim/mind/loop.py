"""Scoring a few cells for retrieval as a plain loop: below ``SMALL`` cells, faster than
array operations (whose fixed cost per call is larger than the work), and numpy is not
loaded. It computes what ``sim.mind.scoring`` does, operation for operation (each BM25 sum
over a cell's terms in their order in its text, accumulated from 0.0; recency as
``math.exp``; ties to the later cell), so either chooses the same cells
(tests/unit/test_retrieve_scoring.py holds both to a third loop).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sim.config import MemoryConfig
from sim.mind.embed import similarities
from sim.mind.lexical import bm25
from sim.mind.words import terms

if TYPE_CHECKING:
    from sim.mind.vectors import VectorCache

#: below this many cells, retrieval scores them here
SMALL = 48


def best(
    cells: Sequence[dict[str, Any]],
    now_tick: int,
    query: str,
    config: MemoryConfig,
    vectors: VectorCache | None = None,
) -> list[int]:
    """The positions of the ``config.k`` highest-scoring cells, in order; ties go to the
    later cell. ``vectors``: a provider's embeddings (cosine relevance), else the offline
    ones or BM25 as ``config.embeddings`` says."""
    n = len(cells)
    weights = config.weights
    if weights.relevance:
        texts = [c["text"] for c in cells]
        embedded = config.embeddings == "provider"
        if vectors is not None:
            raw = vectors.similarities(texts, query)
        else:
            raw = similarities(texts, query) if embedded else bm25(texts, terms(query))
        top = max(raw)
        rel = [r / top for r in raw] if top > 0 else raw
    else:
        rel = [0.0] * n
    log_decay = math.log(config.decay)
    w_rec, w_imp, w_rel = weights.recency, weights.importance / 9, weights.relevance
    scores = [
        w_rec * math.exp(log_decay * max(0, now_tick - c["tick"]))
        + w_imp * ((c.get("importance") or config.importance) - 1)
        + w_rel * r
        for c, r in zip(cells, rel, strict=True)
    ]
    return sorted(heapq.nlargest(config.k, range(n), key=lambda i: (scores[i], i)))
