"""Embeddings for relevance (``[memory] embeddings = "provider"``).

The offline provider's embeddings are hashed: each word and each of its letter trigrams
lands, by a stable hash (BLAKE2b, not ``hash()``), on one of ``DIMENSIONS`` signed axes, and
the vector is scaled to unit length. Same text, same vector, in every process; texts that
share words or word stems (``bell``, ``bells``) point the same way. Vectors are sparse
(axis -> weight). This module's cosines are the plain loop (``sim.mind.loop``, a few
cells); ``sim.mind.scoring`` computes the same with arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from hashlib import blake2b

from sim.mind.words import terms

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


def cosine(a: Vector, b: Vector) -> float:
    """The cosine of two unit vectors (their dot product over shared axes)."""
    if len(a) > len(b):
        a, b = b, a
    return sum(v * b[k] for k, v in a.items() if k in b)


def similarities(docs: Sequence[str], query: str) -> list[float]:
    """Each document's cosine with the query, under the offline embeddings, floored at 0
    (each document's products summed in its own axis order, from 0.0)."""
    q = hashed(query)
    if not q:
        return [0.0] * len(docs)
    out = []
    for doc in docs:
        total = 0.0
        for axis, weight in hashed(doc).items():
            total += weight * q.get(axis, 0.0)
        out.append(max(total, 0.0))
    return out
