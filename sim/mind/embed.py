"""Embeddings for relevance (``[memory] embeddings = "provider"``).

The offline provider's embeddings are hashed: each word and each of its letter trigrams
lands, by a stable hash (BLAKE2b, not ``hash()``), on one of ``DIMENSIONS`` signed axes, and
the vector is scaled to unit length. Same text, same vector, in every process; texts that
share words or word stems (``bell``, ``bells``) point the same way. Vectors are sparse
(axis -> weight), so a cosine costs the axes two texts share, not ``DIMENSIONS``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from hashlib import blake2b
from itertools import repeat
from operator import mul

from sim.mind.lexical import terms

DIMENSIONS = 1024
#: a trigram counts this much beside its whole word
TRIGRAM_WEIGHT = 0.4

Vector = dict[int, float]


@lru_cache(maxsize=262144)
def _axis(feature: str) -> tuple[int, float]:
    value = int.from_bytes(blake2b(feature.encode(), digest_size=8).digest(), "big")
    return value % DIMENSIONS, (1.0 if value >> 63 else -1.0)


@lru_cache(maxsize=65536)
def hashed(text: str) -> Vector:
    """The offline embedding of a text: a unit vector over ``DIMENSIONS`` axes."""
    vector: Vector = {}
    for word in terms(text):
        features = [(word, 1.0)]
        padded = f"^{word}$"
        features += [(padded[i : i + 3], TRIGRAM_WEIGHT) for i in range(len(padded) - 2)]
        for feature, weight in features:
            axis, sign = _axis(feature)
            vector[axis] = vector.get(axis, 0.0) + sign * weight
    norm = math.sqrt(sum(v * v for v in vector.values()))
    return {k: v / norm for k, v in vector.items() if v} if norm else {}


#: text -> its embedding as (axes, weights), the form the cosine loop reads fastest
_PACKED: dict[str, tuple[tuple[int, ...], tuple[float, ...]]] = {}
_MEMO_LIMIT = 200_000


def _packed(text: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    got = _PACKED.get(text)
    if got is None:
        if len(_PACKED) >= _MEMO_LIMIT:
            _PACKED.clear()
        vector = hashed(text)
        got = _PACKED[text] = (tuple(vector), tuple(vector.values()))
    return got


def cosine(a: Vector, b: Vector) -> float:
    """The cosine of two unit vectors (their dot product over shared axes)."""
    if len(a) > len(b):
        a, b = b, a
    return sum(v * b[k] for k, v in a.items() if k in b)


def similarities(docs: Sequence[str], query: str) -> list[float]:
    """Each document's cosine with the query, under the offline embeddings, floored at 0."""
    q = hashed(query)
    if not q:
        return [0.0] * len(docs)
    get = q.get
    out = []
    for doc in docs:
        axes, weights = _packed(doc)
        out.append(max(0.0, sum(map(mul, weights, map(get, axes, repeat(0.0))))))
    return out
