"""The texts retrieval has seen, each stored once as sparse features in flat arrays.

A cell's text never changes, so what relevance needs of it (its BM25 term counts, its
offline embedding) is worked out once per distinct text and kept for the process, across
ticks and across reloads of the world (the key is the text, not the cell). A retrieval then
gathers its cells' rows with a few array operations instead of a Python loop over cells,
and sums each text's products in the text's own feature order (as a plain loop would).

A store made with ``postings`` also keeps, per feature, the texts that have it (in the
order they were stored, so sorted by text number), with the feature's value and its place
in the text: BM25 then reads only the postings of the query's few terms for a set of
texts, instead of every entry of every text (``sim.mind.scoring.bm25``).

Bounded: when a store holds ``MEMO_LIMIT`` texts it starts again empty (between two
retrievals, never during one).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MEMO_LIMIT = 200_000

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
#: what a store keeps of one text: its features and their values, in the order their
#: products are summed, and a size (a BM25 text's length)
Features = tuple[Sequence[Hashable], Sequence[float], float]


@dataclass(frozen=True)
class Rows:
    """The features of a sequence of texts, flattened: entry ``j`` is feature ``feature[j]``
    with value ``value[j]`` of text number ``row[j]``; one text's entries are together and
    in its order."""

    row: Ints
    feature: Ints
    value: Floats
    #: each text's size
    size: Floats


@dataclass(frozen=True)
class Postings:
    """The texts that have one feature, by text number (ascending), with the feature's
    value in each and its place among that text's features."""

    text: Ints
    value: Floats
    place: Ints


class Store:
    """Distinct texts -> their features (a CSR matrix that only grows) and a size each.

    Features are named by any hashable (a word, an axis); the store numbers them itself.

    Args:
        features: a text's features (computed once per distinct text).
        postings: also keep each feature's postings (``postings``).
    """

    def __init__(self, features: Callable[[str], Features], postings: bool = False) -> None:
        self._features = features
        self._postings = postings
        self._clear()

    def _clear(self) -> None:
        self._key: dict[str, int] = {}
        self._names: dict[Hashable, int] = {}
        self._start = array("q", [0])
        self._size = array("d")
        self._ids = array("q")
        self._values = array("d")
        #: per feature number: the texts that have it, its value and place in each
        self._post_text: list[array[int]] = []
        self._post_value: list[array[float]] = []
        self._post_place: list[array[int]] = []

    def _lookup(self, text: str) -> int:
        key = self._key.get(text)
        if key is None:
            names, values, size = self._features(text)
            number = self._names.setdefault
            ids = [number(name, len(self._names)) for name in names]
            self._ids.extend(ids)
            self._values.extend(values)
            self._start.append(len(self._ids))
            self._size.append(size)
            key = self._key[text] = len(self._size) - 1
            if self._postings:
                self._post(key, ids, values)
        return key

    def _post(self, key: int, ids: list[int], values: Sequence[float]) -> None:
        while len(self._post_text) < len(self._names):  # a feature seen for the first time
            self._post_text.append(array("q"))
            self._post_value.append(array("d"))
            self._post_place.append(array("q"))
        for place, (number, value) in enumerate(zip(ids, values, strict=True)):
            self._post_text[number].append(key)
            self._post_value[number].append(value)
            self._post_place[number].append(place)

    def keys(self, texts: Sequence[str]) -> Ints:
        """The number of each text (its features worked out on first sight)."""
        n = len(texts)
        try:  # every text seen before: one pass, no Python code per text
            return np.fromiter(map(self._key.get, texts), np.int64, n)
        except TypeError:  # None: a new text
            if len(self._key) + n > MEMO_LIMIT:
                self._clear()
            return np.fromiter(map(self._lookup, texts), np.int64, n)

    def sizes(self, keys: Ints) -> Floats:
        """The size of each text numbered in ``keys``."""
        return np.frombuffer(self._size, np.float64)[keys]

    def postings(self, number: int) -> Postings:
        """The postings of feature ``number`` (a store made with ``postings``): views of
        the store's arrays, which cannot grow while one is held, so a caller drops them
        before the store's next ``keys`` (as ``rows`` drops its own)."""
        return Postings(
            np.frombuffer(self._post_text[number], np.int64),
            np.frombuffer(self._post_value[number], np.float64),
            np.frombuffer(self._post_place[number], np.int64),
        )

    def ids(self, names: Iterable[Hashable]) -> list[int]:
        """The numbers of these features, -1 for one no stored text has."""
        return [self._names.get(name, -1) for name in names]

    def rows(self, texts: Sequence[str]) -> Rows:
        """The features of these texts (each worked out on first sight)."""
        n = len(texts)
        at = self.keys(texts)
        starts = np.frombuffer(self._start, np.int64)
        start, counts = starts[at], starts[at + 1] - starts[at]
        del starts  # a view locks the array's size
        # each text's entries in turn: start[i], start[i] + 1, ..., start[i] + counts[i] - 1
        before = np.cumsum(counts) - counts
        entry = np.arange(int(before[-1] + counts[-1]) if n else 0, dtype=np.int64)
        entry += np.repeat(start - before, counts)
        return Rows(
            row=np.repeat(np.arange(n, dtype=np.int64), counts),
            feature=np.frombuffer(self._ids, np.int64)[entry],
            value=np.frombuffer(self._values, np.float64)[entry],
            size=np.frombuffer(self._size, np.float64)[at],
        )
