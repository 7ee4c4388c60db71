"""A pool of model servers (``[llm] base_url`` a list) against the ideal, in one process::

    python -m bench.pool CHARACTERS LATENCY SLOTS SERVERS [KILL]

Starts SERVERS ``sim stub-server`` processes, each generating SLOTS requests at once
(``--slots``, like a GPU server's batch) at LATENCY seconds each, runs one tick of a
synthetic world through the ``chat`` provider with ``max_concurrency = SLOTS × SERVERS``,
and prints one JSON line: wall time, the ideal (Σ over phases of ⌈calls / (SLOTS ×
servers up)⌉ × LATENCY) and their ratio. With KILL = 1 the last server is killed (SIGKILL)
as the second phase starts, so the rest of the tick runs on one server fewer: the ideal
counts it only for the first phase, and the result says how many attempts moved.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.make_world import make_world
from sim.config import load_config
from sim.engine.runner import Runner
from sim.phases.base import PhaseReport

ROOT = Path(__file__).resolve().parents[1]
KEY_ENV = "SIM_BENCH_STUB_KEY"


@contextlib.contextmanager
def stub_servers(count: int, latency: float, slots: int) -> Iterator[list[tuple[str, int]]]:
    """``count`` ``sim stub-server`` processes on free ports: (base URL, pid) each."""
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sim",
                "stub-server",
                "--port",
                "0",
                "--latency",
                f"{latency}",
                "--slots",
                str(slots),
                "--seed",
                str(index),
            ],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(count)
    ]
    try:
        servers = []
        for proc in procs:
            assert proc.stderr is not None
            line = proc.stderr.readline()
            match = re.search(r"(http://\S+/v1)", line)
            if match is None:
                raise RuntimeError(f"stub server did not start: {line!r}")
            servers.append((match.group(1), proc.pid))
        yield servers
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)


def pool_tick(
    characters: int, latency: float, slots: int, count: int, kill: bool
) -> dict[str, Any]:
    with (
        stub_servers(count, latency, slots) as servers,
        tempfile.TemporaryDirectory(prefix="sim-bench-pool-") as tmp,
    ):
        world = Path(tmp) / "world"
        make_world(world, characters, max(1, characters // 10), seed=1)
        os.sync()
        os.environ.setdefault(KEY_ENV, "sk-stub")
        config = load_config(
            cwd=Path(tmp),
            overrides={
                "llm": {
                    "provider": "chat",
                    "base_url": [url for url, _ in servers],
                    "api_key_env": KEY_ENV,
                    "max_concurrency": slots * count,
                    "breaker_threshold": 2,
                }
            },
        )
        order: list[str] = []

        def on_phase(name: str, stage: str, _report: PhaseReport | None) -> None:
            if stage == "start":
                order.append(name)
                if kill and len(order) == 2:
                    os.kill(servers[-1][1], signal.SIGKILL)

        started = time.perf_counter()
        result = Runner(world, config, on_phase=on_phase).run(1)[0]
        wall = time.perf_counter() - started
    ideal = 0.0
    for index, report in enumerate(result.reports):
        up = count - 1 if kill and index >= 1 else count
        ideal += math.ceil(report.calls / (slots * up)) * latency if report.calls else 0.0
    return {
        "characters": characters,
        "latency_s": latency,
        "slots": slots,
        "servers": count,
        "killed": kill,
        "calls": result.calls,
        "failures": result.failures,
        "moved": sum(server.moved_away for server in result.servers),
        "answered": [server.answered for server in result.servers],
        "ideal_s": ideal,
        "tick_wall_s": wall,
        "efficiency": ideal / wall,
    }


def main() -> None:
    characters, latency, slots, count = (
        int(sys.argv[1]),
        float(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    kill = len(sys.argv) > 5 and sys.argv[5] == "1"
    print(json.dumps(pool_tick(characters, latency, slots, count, kill)))


if __name__ == "__main__":
    main()
