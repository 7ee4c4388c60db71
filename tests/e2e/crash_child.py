"""Run `sim tick` as the CLI does, with a slow adapter that counts answered calls in a file.

Used by the crash and interrupt tests as the child process they kill:
``python crash_child.py WORLD COUNT_FILE DELAY JITTER [TICK OPTIONS...]``. Only this helper
swaps the adapter; the engine runs unchanged.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import sim.engine.runner
from sim.cli import main
from sim.engine.stack import Stack
from sim.offline.adapter import OfflineAdapter
from sim.testing import CountingAdapter

world, count_file, delay, jitter = sys.argv[1:5]


def build(config: object, loaded: sim.engine.runner.World) -> Stack:
    return Stack(
        CountingAdapter(
            OfflineAdapter(seed=loaded.seed),
            delay=float(delay),
            jitter=float(jitter),
            count_file=Path(count_file),
        )
    )


sim.engine.runner.build_run_stack = build  # type: ignore[assignment]
# a runner that started us in the background may have left SIGINT ignored: Ctrl-C must work
signal.signal(signal.SIGINT, signal.default_int_handler)
main(["tick", "--world", world, "--concurrency", "3", *sys.argv[5:]], prog_name="sim")
