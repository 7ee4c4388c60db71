"""Retrieval's scoring, as arrays (sim/mind/scoring.py, index.py) and as a loop for a few
cells (sim/mind/loop.py, lexical.py, embed.py), against the plain loop sim ran before:
the same floats, bit for bit, and so the same cells chosen in the same order, on random
memories (duplicates, texts without terms, unrated cells, zero weights, ages past the
recency table, a store that starts again when full)."""

from __future__ import annotations

import heapq
import math
import random
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from sim.config import MemoryConfig
from sim.mind import embed, index, lexical, loop, retrieve, scoring
from sim.mind.embed import hashed
from sim.mind.lexical import K1, B
from sim.mind.retrieve import Situation
from sim.mind.words import terms

WORDS = [
    "the",
    "bell",
    "key",
    "smuggler",
    "hid",
    "under",
    "river",
    "nets",
    "a",
    "lantern",
    "cart",
    "bram",
    "ada",
    "of",
    "square",
    "mill",
]


def loop_bm25(docs: list[str], query: list[str]) -> list[float]:
    """BM25 as a plain loop: each document's sum over its terms in first-occurrence order."""
    wanted = set(query)
    n = len(docs)
    counts = [Counter(terms(d)) for d in docs]
    lengths = [sum(c.values()) for c in counts]
    avg = sum(lengths) / n or 1.0
    df: Counter[str] = Counter()
    for c in counts:
        df.update(t for t in c if t in wanted)
    out = []
    for c, length in zip(counts, lengths, strict=True):
        norm = K1 * (1.0 - B + B * length / avg)
        total = 0.0
        for t, f in c.items():
            if t in wanted:
                idf = math.log(1.0 + (n - df[t] + 0.5) / (df[t] + 0.5))
                total += idf * f * (K1 + 1.0) / (f + norm)
        out.append(total)
    return out


def loop_similarities(docs: list[str], query: str) -> list[float]:
    q = hashed(query)
    out = []
    for d in docs:
        total = 0.0
        for axis, w in hashed(d).items():
            total += w * q.get(axis, 0.0)
        out.append(max(0.0, total) if q else 0.0)
    return out


def loop_retrieve(
    memory: dict[str, Any], now: Situation, config: MemoryConfig
) -> list[dict[str, Any]]:
    """The scoring loop retrieval ran before it was vectorised."""
    cells = [*(memory.get("archive") or ()), *memory["cells"]]
    if len(cells) <= config.k:
        return cells
    w = config.weights
    if w.relevance:
        texts = [c["text"] for c in cells]
        if config.embeddings == "provider":
            raw = loop_similarities(texts, now.text)
        else:
            raw = loop_bm25(texts, terms(now.text))
        top = max(raw)
        rel = [r / top for r in raw] if top > 0 else raw
    else:
        rel = [0.0] * len(cells)
    log_decay = math.log(config.decay)
    scores = [
        w.recency * math.exp(log_decay * max(0, now.tick - c["tick"]))
        + w.importance / 9 * ((c.get("importance") or config.importance) - 1)
        + w.relevance * r
        for c, r in zip(cells, rel, strict=True)
    ]
    best = heapq.nlargest(config.k, range(len(cells)), key=lambda i: (scores[i], i))
    return [cells[i] for i in sorted(best)]


def text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 9)))


def memory(rng: random.Random, size: int, start: int = 0) -> dict[str, Any]:
    cells = []
    for i in range(size):
        cell: dict[str, Any] = {"tick": start + i // 2, "text": text(rng)}
        if rng.random() < 0.8:
            cell["importance"] = rng.randint(1, 10)
        cells.append(cell)
    return {"cells": cells[-5:], "archive": cells[:-5]}


@pytest.mark.parametrize("seed", range(12))
def test_scores_are_the_loops_bit_for_bit(seed: int) -> None:
    rng = random.Random(seed)
    docs = [text(rng) for _ in range(rng.randint(1, 300))]
    docs += rng.sample(docs, min(len(docs), 20))  # repeated texts
    query = text(rng) + " bell"
    expected = loop_bm25(docs, terms(query))
    assert scoring.bm25(docs, terms(query)).tolist() == expected
    assert lexical.bm25(docs, terms(query)) == expected
    expected = loop_similarities(docs, query)
    assert scoring.similarities(docs, query).tolist() == expected
    assert embed.similarities(docs, query) == expected


@pytest.mark.parametrize("seed", range(40))
def test_the_same_cells_are_chosen_in_the_same_order(seed: int) -> None:
    rng = random.Random(seed)
    weights = {
        part: rng.choice([0.0, 0.5, 1.0, 3.0]) for part in ("recency", "importance", "relevance")
    }
    config = MemoryConfig(
        mode="retrieve",
        k=rng.randint(1, 12),
        weights=weights,
        decay=rng.choice([0.5, 0.9, 0.995, 1.0]),
        embeddings=rng.choice(["none", "provider"]),
        importance=rng.randint(1, 10),
    )
    # some memories far older than the recency table reaches
    start = rng.choice([0, 0, 5_000_000])
    mem = memory(rng, rng.randint(1, 400), start)
    now = Situation(start + 250 + rng.choice([0, 3_000_000]), text(rng) + " smuggler bell")
    expected = [id(c) for c in loop_retrieve(mem, now, config)]
    assert [id(c) for c in retrieve.retrieve(mem, now, config)] == expected
    # the loop for a few cells and the arrays for many choose alike at any size
    cells = [*mem["archive"], *mem["cells"]]
    if len(cells) > config.k:
        by_loop = loop.best(cells, now.tick, now.text, config)
        assert scoring.best(cells, now.tick, now.text, config) == by_loop
        assert [id(cells[i]) for i in by_loop] == expected


def test_a_full_store_starts_again_and_scores_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "MEMO_LIMIT", 50)
    store = index.Store(scoring._term_counts)
    monkeypatch.setattr(scoring, "_TERMS", store)
    rng = random.Random(3)
    for _ in range(6):
        docs = [f"{text(rng)} {rng.random()}" for _ in range(40)]  # each text new
        assert scoring.bm25(docs, ["bell", "key"]).tolist() == loop_bm25(docs, ["bell", "key"])
        assert len(store._key) <= 50 + 40


def test_no_cells_no_terms_no_query() -> None:
    for bm25 in (scoring.bm25, lexical.bm25):
        assert list(bm25([], ["bell"])) == []
        assert list(bm25(["the of a", ""], ["bell"])) == [0.0, 0.0]
        assert list(bm25(["bell"], [])) == [0.0]
    assert scoring.similarities(["bell", ""], "").tolist() == [0.0, 0.0]
    assert embed.similarities(["bell", ""], "") == [0.0, 0.0]


def test_a_window_world_and_a_few_cells_do_not_load_numpy() -> None:
    script = (
        "import sys, sim.engine.runner, sim.phases.base\n"
        "from sim.config import MemoryConfig\n"
        "from sim.mind.retrieve import Situation, retrieve\n"
        "cells = [{'tick': t, 'text': f'bell {t}', 'importance': 3} for t in range(40)]\n"
        "got = retrieve({'cells': cells}, Situation(50, 'bell'), MemoryConfig(k=3))\n"
        "assert len(got) == 3\n"
        "print('numpy' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False"
