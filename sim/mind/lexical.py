"""Lexical relevance: Okapi BM25 over memory cells, no model needed.

Each distinct text's terms are counted once per process (``sim.mind.index``); a retrieval
scores its cells with array operations, each cell's sum taken over its terms in the order
they first occur in its text (so the result does not depend on set order or on
``PYTHONHASHSEED``). Measured in ``bench/mind.py`` (scenario 10 of bench/RESULTS.md).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from sim.mind.index import Features, Floats, Store
from sim.mind.words import terms

K1 = 1.2
B = 0.75


def _term_counts(text: str) -> Features:
    found = terms(text)
    counts = Counter(found)  # in order of first occurrence
    return tuple(counts), [float(c) for c in counts.values()], float(len(found))


_STORE = Store(_term_counts)


def bm25(docs: Sequence[str], query: Iterable[str]) -> Floats:
    """BM25 score of each document for the query's distinct terms (0 where none occurs)."""
    n = len(docs)
    query = set(query)
    if not n or not query:
        return np.zeros(n)
    rows = _STORE.rows(docs)  # first: it numbers the terms of texts seen for the first time
    wanted = sorted({i for i in _STORE.ids(query) if i >= 0})
    if not wanted:
        return np.zeros(n)
    known = np.array(wanted, dtype=np.int64)
    place = np.minimum(np.searchsorted(known, rows.feature), len(known) - 1)
    hit = known[place] == rows.feature
    row, count, term = rows.row[hit], rows.value[hit], place[hit]
    # each (document, term) is one entry, so a term's entries are its document frequency
    df = np.bincount(term, minlength=len(known)).tolist()
    idf = np.array([math.log(1.0 + (n - f + 0.5) / (f + 0.5)) for f in df])
    avg = float(rows.size.sum()) / n or 1.0
    norm = K1 * (1.0 - B + B * rows.size / avg)
    each = idf[term] * count * (K1 + 1.0) / (count + norm[row])
    return np.asarray(np.bincount(row, weights=each, minlength=n), dtype=np.float64)
