"""Scenario 10: memory retrieval (``[memory] mode = "retrieve"``).

- ``cpu``: retrieval CPU per character-tick with 1,000 cells per character (lexical BM25, and
  the offline hashed embeddings): the first tick (every cell's terms counted: a process's
  first retrieval over a loaded world) and the next (one new cell each, the rest memoised);
- ``tokens``: phase-1 input tokens per character-tick, window vs retrieve at the same ``k``
  (offline, 5 ticks), and the whole offline tick's wall time with retrieval off and on.

``python -m bench.mind cpu 1000`` / ``python -m bench.mind tokens 200 [ticks]`` print one JSON
line.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.make_world import make_world
from sim.config import MemoryConfig, load_config
from sim.engine.runner import Runner
from sim.mind.retrieve import Situation, retrieve

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
    out: dict[str, Any] = {"cells": cells, "characters": characters, "k": k}
    for name, embeddings in (("lexical", "none"), ("embeddings", "provider")):
        config = MemoryConfig(mode="retrieve", k=k, embeddings=embeddings)
        per_tick = []
        for tick in range(3):
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
    return out


def token_cost(characters: int = 200, ticks: int = 5, k: int = 3) -> dict[str, Any]:
    """Phase-1 input tokens per character-tick and tick wall time, window vs retrieve."""
    out: dict[str, Any] = {"characters": characters, "ticks": ticks, "k": k}
    for mode in ("window", "retrieve"):
        with tempfile.TemporaryDirectory(prefix="sim-bench-") as tmp:
            world = Path(tmp) / "world"
            make_world(world, characters, max(1, characters // 10), seed=1)
            config = load_config(cwd=Path(tmp), overrides={"memory": {"mode": mode, "k": k}})
            started = time.perf_counter()
            results = Runner(world, config).run(ticks)
            wall = time.perf_counter() - started
        tokens = [
            r.usage.input_tokens for res in results for r in res.reports if r.name == "intentions"
        ]
        out[mode] = {
            "input_tokens_per_character_tick": sum(tokens) / (characters * ticks),
            "wall_per_tick_s": wall / ticks,
        }
    return out


def main() -> None:
    kind, value = sys.argv[1], int(sys.argv[2])
    ticks = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    out = retrieval_cpu(value) if kind == "cpu" else token_cost(value, ticks)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
