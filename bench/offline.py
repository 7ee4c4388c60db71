"""Offline benchmark scenarios: engine overhead (scenario 1) and chain-depth cost (scenario 4).

Each measurement runs in a fresh child process (``python bench/offline.py overhead N``) so
that its peak RSS is its own. Prints one JSON object.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.make_world import make_world
from sim.config import load_config
from sim.engine.runner import Runner
from sim.llm.types import AdapterResponse, ModelRequest
from sim.offline.adapter import OfflineAdapter


class TimedOffline(OfflineAdapter):
    """The offline adapter, timing its own work so engine time can be separated from it."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.model_seconds = 0.0

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        started = time.perf_counter()
        try:
            return await super().execute(request)
        finally:
            self.model_seconds += time.perf_counter() - started


def overhead(characters: int) -> dict[str, Any]:
    """Scenario 1: one tick of a synthetic world, offline."""
    with tempfile.TemporaryDirectory(prefix="sim-bench-") as tmp:
        world = Path(tmp) / "world"
        make_world(world, characters, max(1, characters // 10), seed=1)
        # write the freshly generated world out first, so the tick's flushes do not pay
        # for the benchmark's own set-up
        os.sync()
        config = load_config(cwd=Path(tmp))
        adapter = TimedOffline(seed=1)
        started = time.perf_counter()
        result = Runner(world, config, adapter=adapter).run(1)[0]
        wall = time.perf_counter() - started
    phases = sum(v for k, v in result.timings.items() if k not in ("load", "commit"))
    return {
        "characters": characters,
        "wall_s": wall,
        "calls": result.calls,
        "load_s": result.timings["load"],
        "commit_s": result.timings["commit"],
        "phases_s": phases,
        "model_s": adapter.model_seconds,
        "engine_us_per_call": (phases - adapter.model_seconds) / result.calls * 1e6,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def depth_cost(depth: int, characters: int = 200, ticks: int = 5) -> dict[str, Any]:
    """Scenario 4: phase-1 input tokens per character-tick at a chain depth."""
    with tempfile.TemporaryDirectory(prefix="sim-bench-") as tmp:
        world = Path(tmp) / "world"
        make_world(world, characters, max(1, characters // 10), seed=1)
        config = load_config(cwd=Path(tmp), overrides={"phase1": {"response_chain_depth": depth}})
        results = Runner(world, config).run(ticks)
    tokens = [
        r.usage.input_tokens for res in results for r in res.reports if r.name == "intentions"
    ]
    return {
        "depth": depth,
        "characters": characters,
        "ticks": ticks,
        "input_tokens_per_character_tick": sum(tokens) / (characters * ticks),
        "last_tick_per_character": tokens[-1] / characters,
    }


def main() -> None:
    kind, value = sys.argv[1], int(sys.argv[2])
    out = overhead(value) if kind == "overhead" else depth_cost(value)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
