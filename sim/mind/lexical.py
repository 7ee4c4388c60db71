"""Lexical relevance: Okapi BM25 over memory cells, no model needed.

Each cell's sum is taken over its terms in the order they first occur in its text (so the
result does not depend on set order or on ``PYTHONHASHSEED``), accumulated from 0.0. This
module is the plain loop (``sim.mind.loop``, a few cells); ``sim.mind.scoring`` computes the
same with arrays. Measured in ``bench/mind.py`` (scenario 10 of bench/RESULTS.md).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache

from sim.mind.words import terms

K1 = 1.2
B = 0.75


@lru_cache(maxsize=65536)
def counted(text: str) -> tuple[tuple[tuple[str, int], ...], int]:
    """A text's distinct terms with their counts, in order of first occurrence, and its
    length in terms."""
    found = terms(text)
    return tuple(Counter(found).items()), len(found)


def idf(n: int, df: int) -> float:
    """A term's inverse document frequency among ``n`` documents, ``df`` of them having it."""
    return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


def bm25(docs: Sequence[str], query: Iterable[str]) -> list[float]:
    """BM25 score of each document for the query's distinct terms (0 where none occurs)."""
    wanted = set(query)
    n = len(docs)
    if not n or not wanted:
        return [0.0] * n
    stats = [counted(d) for d in docs]
    avg = sum([length for _, length in stats]) / n or 1.0
    df: Counter[str] = Counter()
    for counts, _ in stats:
        df.update(t for t, _ in counts if t in wanted)
    weight = {t: idf(n, f) for t, f in df.items()}
    out = []
    for counts, length in stats:
        norm = K1 * (1.0 - B + B * length / avg)
        total = 0.0
        for t, f in counts:
            if t in wanted:
                total += weight[t] * f * (K1 + 1.0) / (f + norm)
        out.append(total)
    return out
