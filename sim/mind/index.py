"""The texts retrieval has seen, each stored once as sparse features in flat arrays.

A cell's text never changes, so what relevance needs of it (its BM25 term counts, its
offline embedding) is worked out once per distinct text and kept for the process, across
ticks and across reloads of the world (the key is the text, not the cell). A retrieval then
gathers its cells' rows with a few array operations instead of a Python loop over cells,
and sums each text's products in the text's own feature order (as a plain loop would).

Bounded: when a store holds ``MEMO_LIMIT`` texts it starts again empty (between two
retrievals, never during one).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat

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


class Store:
    """Distinct texts -> their features (a CSR matrix that only grows) and a size each.

    Features are named by any hashable (a word, an axis); the store numbers them itself."""

    def __init__(self, features: Callable[[str], Features]) -> None:
        self._features = features
        self._clear()

    def _clear(self) -> None:
        self._key: dict[str, int] = {}
        self._names: dict[Hashable, int] = {}
        self._start = array("q", [0])
        self._size = array("d")
        self._ids = array("q")
        self._values = array("d")

    def _lookup(self, text: str) -> int:
        key = self._key.get(text)
        if key is None:
            names, values, size = self._features(text)
            number = self._names.setdefault
            self._ids.extend([number(name, len(self._names)) for name in names])
            self._values.extend(values)
            self._start.append(len(self._ids))
            self._size.append(size)
            key = self._key[text] = len(self._size) - 1
        return key

    def ids(self, names: Iterable[Hashable]) -> list[int]:
        """The numbers of these features, -1 for one no stored text has."""
        return [self._names.get(name, -1) for name in names]

    def numbers(self, texts: Sequence[str]) -> Ints:
        """Each text's number in the store (each worked out on first sight)."""
        n = len(texts)
        # one pass with no Python code per text; -1: a text not seen before (a new cell's)
        at = np.fromiter(map(self._key.get, texts, repeat(-1)), np.int64, n)
        new = np.flatnonzero(at < 0).tolist()
        if new and len(self._key) + len(new) > MEMO_LIMIT:
            self._clear()
            return np.fromiter(map(self._lookup, texts), np.int64, n)
        for i in new:
            at[i] = self._lookup(texts[i])
        return at

    def entries(self, at: Ints) -> tuple[Ints, Ints]:
        """Where the texts numbered ``at`` keep their entries (text after text, each in its
        order), and where each text's entries end in that list."""
        starts = np.frombuffer(self._start, np.int64)
        start, counts = starts[at], starts[at + 1] - starts[at]
        del starts  # a view locks the array's size
        # each text's entries in turn: start[i], start[i] + 1, ..., start[i] + counts[i] - 1
        ends = np.cumsum(counts)
        entry = np.arange(int(ends[-1]) if len(at) else 0, dtype=np.int64)
        entry += np.repeat(start - (ends - counts), counts)
        return entry, ends

    def feature(self, entry: Ints) -> Ints:
        """The feature of each of these entries."""
        return np.frombuffer(self._ids, np.int64)[entry]

    def value(self, entry: Ints) -> Floats:
        """The value of each of these entries."""
        return np.frombuffer(self._values, np.float64)[entry]

    def size(self, at: Ints) -> Floats:
        """The size of each of the texts numbered ``at``."""
        return np.frombuffer(self._size, np.float64)[at]

    def rows(self, texts: Sequence[str]) -> Rows:
        """The features of these texts (each worked out on first sight)."""
        at = self.numbers(texts)
        entry, ends = self.entries(at)
        row = np.repeat(np.arange(len(at), dtype=np.int64), np.diff(ends, prepend=0))
        return Rows(row, self.feature(entry), self.value(entry), self.size(at))
