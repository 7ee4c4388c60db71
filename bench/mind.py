"""Scenario 10: memory retrieval (``[memory] mode = "retrieve"``).

- ``cpu``: retrieval CPU per character-tick with 1,000 cells per character (lexical BM25, and
  the offline hashed embeddings): the first tick (every cell's terms counted: a process's
  first retrieval over a loaded world) and the next (one new cell each, the rest memoised);
- ``tokens``: phase-1 input tokens per character-tick, window vs retrieve at the same ``k``
  (offline, 5 ticks), and the whole offline tick's wall time with retrieval off and on.

- ``cache``: the memory a provider-embeddings cache of about N MB costs (``sim.mind.vectors``,
  1,536-dimension vectors): the traced peak of loading it, scoring every text once, and
  saving it after one more vector, against the file's size.

``python -m bench.mind cpu 1000`` / ``python -m bench.mind tokens 200 [ticks]`` /
``python -m bench.mind cache 20`` print one JSON line.
"""

from __future__ import annotations

import heapq
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import orjson

from bench.make_world import make_world
from sim.config import MemoryConfig, load_config
from sim.engine.runner import Runner
from sim.mind.lexical import K1, B
from sim.mind.retrieve import Situation, retrieve
from sim.mind.words import terms

_SUBJECTS = [
    "ada",
    "bram",
    "cora",
    "the",
    "smuggler",
    "the",
    "miller",
    "a",
    "stranger",
    "the",
    "priest",
    "the",
    "ferryman",
]
_VERBS = [
    "saw",
    "heard",
    "carried",
    "mended",
    "sold",
    "bought",
    "hid",
    "found",
    "lost",
    "watched",
    "counted",
    "cleaned",
]
_THINGS = [
    "the nets",
    "a lantern",
    "the cart",
    "a letter",
    "the bread",
    "a coin",
    "the rope",
    "the boat",
    "a barrel",
    "the gate",
    "a knife",
    "the well bucket",
    "a candle",
    "the map",
    "the ledger",
    "a basket of eels",
]
_PLACES = [
    "at the inn",
    "by the river",
    "in the square",
    "at the mill",
    "on the bridge",
    "in the chapel",
]


def _cell(rng: random.Random, tick: int) -> dict[str, Any]:
    text = (
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_THINGS)} {rng.choice(_PLACES)}."
    )
    mentions = sorted({w for w in ("ada", "bram", "cora") if w in text})
    return {"tick": tick, "text": text, "importance": rng.randint(1, 10), "mentions": mentions}


#: text -> (term counts, length): the memo the loop below kept (as sim did before arrays)
_COUNTED: dict[str, tuple[Counter[str], int]] = {}


def _loop_retrieve(memory: dict[str, Any], now: Situation, config: MemoryConfig) -> list[Any]:
    """Retrieval as sim scored it before ``sim.mind.scoring`` (lexical): a Python loop over
    the cells (BM25 by set tests on memoised term counts), kept here as the baseline."""
    cells = [*(memory.get("archive") or ()), *memory["cells"]]
    n = len(cells)
    wanted = set(terms(now.text))
    stats = []
    for c in cells:
        got = _COUNTED.get(c["text"])
        if got is None:
            found = terms(c["text"])
            got = _COUNTED[c["text"]] = (Counter(found), len(found))
        stats.append(got)
    avg = sum([length for _, length in stats]) / n or 1.0
    hits = [
        (i, wanted.intersection(k)) for i, (k, _) in enumerate(stats) if not wanted.isdisjoint(k)
    ]
    df: Counter[str] = Counter()
    for _, common in hits:
        df.update(common)
    idf = {t: math.log(1.0 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
    raw = [0.0] * n
    for i, common in hits:
        counts, length = stats[i]
        norm = K1 * (1.0 - B + B * length / avg)
        raw[i] = sum([idf[t] * counts[t] * (K1 + 1.0) / (counts[t] + norm) for t in common])
    top = max(raw)
    rel = [r / top for r in raw] if top > 0 else raw
    w = config.weights
    log_decay, w_imp = math.log(config.decay), w.importance / 9
    scores = [
        w.recency * math.exp(log_decay * max(0, now.tick - c["tick"]))
        + w_imp * ((c.get("importance") or config.importance) - 1)
        + w.relevance * r
        for c, r in zip(cells, rel, strict=True)
    ]
    best = heapq.nlargest(config.k, range(n), key=lambda i: (scores[i], i))
    return [cells[i] for i in sorted(best)]


#: ticks timed per relevance: the first, then later ones (their median is the figure)
TICKS = 12


def retrieval_cpu(cells: int = 1000, characters: int = 200, k: int = 5) -> dict[str, Any]:
    """CPU seconds per character-tick of ``retrieve`` over ``cells`` cells per character."""
    rng = random.Random(7)
    memories = []
    for c in range(characters):
        stream = [_cell(rng, t) for t in range(cells)]
        # texts as a loaded world holds them: each its own string, not a shared literal
        stream = orjson.loads(orjson.dumps(stream))
        memories.append({"summary": "", "cells": stream[-5:], "archive": stream[:-5], "c": c})
    situations = [
        Situation(cells, f"square Town Square fountain bram Bram {rng.choice(_THINGS)}")
        for _ in range(characters)
    ]
    out: dict[str, Any] = {"cells": cells, "characters": characters, "k": k, "ticks": TICKS}
    modes: tuple[tuple[str, Literal["none", "provider"]], ...] = (
        ("lexical", "none"),
        ("embeddings", "provider"),
    )
    for name, embeddings in modes:
        config = MemoryConfig(mode="retrieve", k=k, embeddings=embeddings)
        per_tick = []
        for tick in range(TICKS):
            started = time.process_time()
            for memory, now in zip(memories, situations, strict=True):
                retrieve(memory, Situation(now.tick + tick, now.text), config)
            per_tick.append((time.process_time() - started) / characters)
            for memory in memories:  # the next tick: one new cell each, the oldest archived
                memory["cells"].append(_cell(rng, cells + tick))
                memory["archive"] = [*memory["archive"][1:], memory["cells"].pop(0)]
        out[name] = {
            "first_ms": per_tick[0] * 1e3,
            "next_ms": statistics.median(per_tick[1:]) * 1e3,
        }
    # the loop sim ran before against the arrays, alternated in this process (the load
    # of a shared machine weighs on both alike); the same cells chosen
    config = MemoryConfig(mode="retrieve", k=k)
    timed: dict[str, list[float]] = {"loop": [], "arrays": []}
    for _ in range(3):
        for name, how in (("loop", _loop_retrieve), ("arrays", retrieve)):
            started = time.process_time()
            chosen = [
                how(m, Situation(cells + 3, n.text), config)
                for m, n in zip(memories, situations, strict=True)
            ]
            timed[name].append((time.process_time() - started) / characters)
            if name == "loop":
                expected = chosen
            elif chosen != expected:
                raise AssertionError("the arrays chose other cells than the loop")
    out["same_process"] = {name: statistics.median(t) * 1e3 for name, t in timed.items()}
    return out


def token_cost(characters: int = 200, ticks: int = 5, k: int = 3) -> dict[str, Any]:
    """Phase-1 input tokens per character-tick and tick wall time, window vs retrieve."""
    out: dict[str, Any] = {"characters": characters, "ticks": ticks, "k": k}
    for mode in ("window", "retrieve"):
        with tempfile.TemporaryDirectory(prefix="sim-bench-") as tmp:
            world = Path(tmp) / "world"
            make_world(world, characters, max(1, characters // 10), seed=1)
            config = load_config(cwd=Path(tmp), overrides={"memory": {"mode": mode, "k": k}})
            started, cpu = time.perf_counter(), time.process_time()
            results = Runner(world, config).run(ticks)
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        tokens = [
            r.usage.input_tokens for res in results for r in res.reports if r.name == "intentions"
        ]
        out[mode] = {
            "input_tokens_per_character_tick": sum(tokens) / (characters * ticks),
            "wall_per_tick_s": wall / ticks,
            # the process's CPU: steadier than wall time on a shared machine
            "cpu_per_tick_s": cpu / ticks,
        }
    return out


def cache_memory(megabytes: float = 20.0, dimensions: int = 1536) -> dict[str, Any]:
    """The traced memory of one tick's use of an embeddings cache of about ``megabytes``."""
    import base64
    import tracemalloc

    import numpy as np

    from sim.mind.vectors import FOLDER, VectorCache, cache_name, text_digest

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        path = root / FOLDER / cache_name("m")
        path.parent.mkdir(parents=True)
        count = max(1, int(megabytes * 1e6 / (dimensions * 16 / 3 + 100)))
        texts = [f"text {n}" for n in range(count)]
        rng = np.random.default_rng(0)
        with path.open("wb") as out:
            out.write(orjson.dumps({"model": "m", "dimensions": dimensions}) + b"\n")
            for text in texts:
                vector = rng.standard_normal(dimensions).astype("<f4").tobytes()
                item = {"text": text_digest(text), "vector": base64.b64encode(vector).decode()}
                out.write(orjson.dumps(item) + b"\n")
        size = path.stat().st_size
        tracemalloc.start()
        cache = VectorCache(root, "m")
        loaded, load_peak = tracemalloc.get_traced_memory()
        cache.similarities(texts, texts[0])
        cache.add(["one more"], [[0.5] * dimensions])
        cache.save()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    mib = 1024 * 1024
    return {
        "cache_mib": round(size / mib, 1),
        "vectors": count,
        "loaded_mib": round(loaded / mib, 1),
        "load_peak_mib": round(load_peak / mib, 1),
        "peak_mib": round(peak / mib, 1),
        "peak_per_file_byte": round(peak / size, 2),
    }


def main() -> None:
    kind, value = sys.argv[1], sys.argv[2]
    ticks = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    if kind == "cache":
        out = cache_memory(float(value))
    elif kind == "cpu":
        out = retrieval_cpu(int(value))
    else:
        out = token_cost(int(value), ticks)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
