"""Scoring a character's cells for retrieval, as arrays (numpy) over all of them at once.

Each element is computed as the plain loop would compute it (the same operations, in the
same order, on the same doubles), so the cells chosen are the loop's; the test
tests/unit/test_retrieve_scoring.py holds the loop and checks it. Imported only when a
phase retrieves (``sim.mind.retrieve``), so window worlds do not load numpy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.config import MemoryConfig
from sim.mind import lexical
from sim.mind.embed import hashed
from sim.mind.index import Features, Floats, Ints, Store
from sim.mind.lexical import K1, B
from sim.mind.words import terms

if TYPE_CHECKING:
    from sim.mind.vectors import VectorCache


def _term_counts(text: str) -> Features:
    counts, length = lexical.counted(text)
    return [t for t, _ in counts], [float(f) for _, f in counts], float(length)


def _axes(text: str) -> Features:
    vector = hashed(text)
    return tuple(vector), tuple(vector.values()), 0.0


_TEXT, _TICK, _IMPORTANCE = itemgetter("text"), itemgetter("tick"), itemgetter("importance")

#: each distinct text's terms, and its offline embedding, once per process
_TERMS = Store(_term_counts)
_AXES = Store(_axes)


def bm25(docs: Sequence[str], query: Iterable[str]) -> Floats:
    """``lexical.bm25`` as array operations, to the same doubles."""
    n = len(docs)
    query = set(query)
    if not n or not query:
        return np.zeros(n)
    at = _TERMS.numbers(docs)  # first: it numbers the terms of texts seen for the first time
    wanted = sorted({i for i in _TERMS.ids(query) if i >= 0})
    if not wanted:
        return np.zeros(n)
    known = np.array(wanted, dtype=np.int64)
    entry, ends = _TERMS.entries(at)
    feature = _TERMS.feature(entry)
    place = np.minimum(np.searchsorted(known, feature), len(known) - 1)
    hit = np.flatnonzero(known[place] == feature)  # the entries of query terms, in order
    row = np.searchsorted(ends, hit, side="right")  # whose text each is
    count, term = _TERMS.value(entry[hit]), place[hit]
    # each (document, term) is one entry, so a term's entries are its document frequency
    df = np.bincount(term, minlength=len(known)).tolist()
    weight = np.array([lexical.idf(n, f) for f in df])
    size = _TERMS.size(at)
    avg = float(size.sum()) / n or 1.0
    norm = K1 * (1.0 - B + B * size[row] / avg)
    each = weight[term] * count * (K1 + 1.0) / (count + norm)
    return np.asarray(np.bincount(row, weights=each, minlength=n), dtype=np.float64)


def similarities(docs: Sequence[str], query: str) -> Floats:
    """``embed.similarities`` as array operations, to the same doubles."""
    q = hashed(query)
    if not q or not docs:
        return np.zeros(len(docs))
    rows = _AXES.rows(docs)
    weight = np.zeros(len(rows.feature) and int(rows.feature.max()) + 1)
    for axis, number in zip(q, _AXES.ids(q), strict=True):
        if 0 <= number < len(weight):
            weight[number] = q[axis]
    each = rows.value * weight[rows.feature]
    return np.maximum(np.bincount(rows.row, weights=each, minlength=len(docs)), 0.0)


def relevance(
    docs: Sequence[str], query: str, embeddings: bool, vectors: VectorCache | None = None
) -> Floats:
    """Each document's relevance to the query, 0..1 (the best one's 1); ``vectors``: a
    provider's embeddings (the loop's doubles: ``VectorCache.similarities``)."""
    if vectors is not None:
        raw = np.array(vectors.similarities(docs, query), dtype=np.float64)
    else:
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
    cells: Sequence[dict[str, Any]],
    now_tick: int,
    query: str,
    config: MemoryConfig,
    vectors: VectorCache | None = None,
) -> list[int]:
    """The positions of the ``config.k`` highest-scoring cells, in order; ties go to the
    later cell (``vectors``: as ``loop.best``)."""
    n = len(cells)
    # a pass per field: the first brings the cells into the cache for the next two
    texts = list(map(_TEXT, cells))
    ticks = np.fromiter(map(_TICK, cells), np.int64, n)
    try:
        importance = np.fromiter(map(_IMPORTANCE, cells), np.int64, n)
    except (KeyError, TypeError):  # a cell written before cells were rated
        rated = (c.get("importance") or config.importance for c in cells)
        importance = np.fromiter(rated, np.int64, n)
    else:
        if not importance.all():  # 0: not rated
            importance[importance == 0] = config.importance
    weights = config.weights
    embedded = config.embeddings == "provider"
    rel = relevance(texts, query, embedded, vectors) if weights.relevance else 0.0
    ages = np.maximum(now_tick - ticks, 0)
    w_rec, w_imp, w_rel = weights.recency, weights.importance / 9, weights.relevance
    scores = w_rec * recency(ages, config.decay) + w_imp * (importance - 1) + w_rel * rel
    return top(scores, config.k)


def top(scores: Floats, k: int) -> list[int]:
    """The positions of the ``k`` highest scores, in order; ties go to the later position."""
    n = len(scores)
    if k >= n:
        return list(range(n))
    # the k-th highest score, then every position that reaches it (ties included)
    least = scores[np.argpartition(scores, n - k)[n - k :]].min()
    near = np.flatnonzero(scores >= least)
    chosen = near[np.lexsort((near, scores[near]))[-k:]]  # by score, then by position
    return sorted(chosen.tolist())
