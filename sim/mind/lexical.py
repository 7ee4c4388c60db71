"""Lexical relevance: Okapi BM25 over memory cells, no model needed.

Each cell's terms are counted once per distinct text (a process-wide memo), so a character's
1,000 cells cost one pass of set tests per retrieval, not a re-tokenisation. Measured in
``bench/mind.py`` (scenario 10 of bench/RESULTS.md).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence

_WORD = re.compile(r"[a-z0-9][a-z0-9_-]*")
#: words that say nothing about what a memory is about
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "been",
        "but",
        "by",
        "for",
        "from",
        "had",
        "has",
        "have",
        "he",
        "her",
        "hers",
        "him",
        "his",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "me",
        "my",
        "no",
        "not",
        "of",
        "on",
        "or",
        "our",
        "she",
        "so",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "they",
        "this",
        "to",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "will",
        "with",
        "you",
        "your",
    ]
)
K1 = 1.2
B = 0.75


def terms(text: str) -> list[str]:
    """The words of a text that can make it relevant: lower case, stopwords dropped."""
    return [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


#: text -> its term counts and length; a cell's text never changes, so each is counted once
#: per process (bounded: cleared whole when full)
_COUNTED: dict[str, tuple[Counter[str], int]] = {}
_MEMO_LIMIT = 200_000


def counted(text: str) -> tuple[Counter[str], int]:
    """A text's term counts and length, memoised."""
    got = _COUNTED.get(text)
    if got is None:
        if len(_COUNTED) >= _MEMO_LIMIT:
            _COUNTED.clear()
        found = terms(text)
        got = _COUNTED[text] = (Counter(found), len(found))
    return got


def bm25(docs: Sequence[str], query: Iterable[str]) -> list[float]:
    """BM25 score of each document for the query's distinct terms (0 where none occurs)."""
    wanted = set(query)
    n = len(docs)
    if not n or not wanted:
        return [0.0] * n
    stats = [counted(doc) for doc in docs]
    avg = sum([length for _, length in stats]) / n or 1.0
    hits = [
        (i, wanted.intersection(counts))
        for i, (counts, _) in enumerate(stats)
        if not wanted.isdisjoint(counts)
    ]
    df: Counter[str] = Counter()
    for _, common in hits:
        df.update(common)
    idf = {t: math.log(1.0 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
    scores = [0.0] * n
    for i, common in hits:
        counts, length = stats[i]
        norm = K1 * (1.0 - B + B * length / avg)
        scores[i] = sum([idf[t] * counts[t] * (K1 + 1.0) / (counts[t] + norm) for t in common])
    return scores
