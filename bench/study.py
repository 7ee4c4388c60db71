"""Parallel runs: a whole ``sim study run`` process with ``--jobs 1`` and ``--jobs 2``.

``python -m bench.study speedup CHARACTERS TICKS RUNS`` — a fresh world of CHARACTERS
(``bench/make_world.py``, locations = CHARACTERS / 10) and a study of one condition, RUNS
seeds and TICKS ticks, offline. The same study is run twice by a ``sim study run`` child
process, into two new folders, with ``--jobs 1`` then ``--jobs 2``: wall time from spawn to
exit. Then what the parent does by itself, one thing after another, is measured apart:

- start-up: the same ``sim study run`` on the finished folder (imports, config, the checks
  of every run folder, the study's books read from every run, exit: it starts no step);
- world copies: ``fork_current`` of the world (the median of three), once per run (each
  job forks its own run: they overlap);
- the rest: what the ``--jobs 1`` run spent outside both and outside the runs' ticks (the
  ticks' own wall time, from their summaries): each step's ``sim tick`` child starting and
  exiting, and the parent's per-step bookkeeping.

Prints one JSON object.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.make_world import make_world
from bench.process import child_env, compile_sim, run_child, sim_command


def _tick_walls(run_dir: Path) -> list[float]:
    """The wall time of each committed tick of a run folder, from its summaries."""
    from sim.ticklog.summary import heads

    return [float(item.head.wall or 0.0) for item in heads(run_dir) if item.head is not None]


def _copy_seconds(world: Path, scratch: Path) -> float:
    """The median wall time of three forks of ``world`` (what the parent does per run)."""
    from sim.runs.fork import fork_current

    times = []
    for i in range(3):
        started = time.perf_counter()
        fork_current(world, scratch / f"copy-{i}", i + 1, {})
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def speedup(characters: int, ticks: int, runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sim-bench-") as tmp:
        here = Path(tmp)
        world = here / "world"
        make_world(world, characters, max(1, characters // 10), seed=1)
        (here / "study.toml").write_text(
            f'world = "world"\nseeds = "1-{runs}"\nticks = {ticks}\n[conditions.control]\n',
            encoding="utf-8",
        )
        os.sync()  # the generated world on disk first: the runs do not pay for it
        walls: dict[int, float] = {}
        cpu: dict[int, float] = {}
        load: dict[int, float] = {}
        for jobs in (1, 2):
            load[jobs] = os.getloadavg()[0]
            args = ("study", "run", "study.toml", "--out", f"out-{jobs}", "--jobs", str(jobs))
            done = run_child(sim_command(*args, "--json"), here, child_env())
            walls[jobs], cpu[jobs] = done["wall_s"], done["cpu_s"]
            document = json.loads(done["stdout"].strip().splitlines()[-1])
            if not document["ok"]:
                raise SystemExit(f"the study with --jobs {jobs} did not finish: {document}")
        out = here / "out-1"
        run_dirs = sorted(p for p in (out / "control").iterdir() if p.is_dir())
        per_run = [sum(_tick_walls(d)) for d in run_dirs]
        resume = run_child(
            sim_command("study", "run", "study.toml", "--out", "out-1", "--json"),
            here,
            child_env(),
        )
        copy = _copy_seconds(world, here / "scratch")
    ticks_total = sum(per_run)
    # the runs' forks are made by the jobs at once (``sim.runs.fork``: one thread at a time
    # only reads the source), so the parent's serial part is its start-up and checks
    serial = resume["wall_s"]
    rest = walls[1] - resume["wall_s"] - copy * runs - ticks_total
    return {
        "characters": characters,
        "ticks": ticks,
        "runs": runs,
        "wall_s": walls,
        "cpu_s": cpu,
        "load_before": load,
        "run_ticks_s": per_run,
        "ticks_total_s": ticks_total,
        "startup_s": resume["wall_s"],
        "copy_s": copy,
        "serial_s": serial,
        "rest_s": rest,
        "rest_per_run_s": rest / runs,
        "speedup": walls[1] / walls[2],
        # Amdahl: the parent's serial part once, the rest shared by two jobs
        "amdahl_s": serial + (walls[1] - serial) / 2,
    }


def main() -> None:
    kind = sys.argv[1]
    compile_sim()
    if kind != "speedup":
        raise SystemExit(f"unknown benchmark {kind!r}: speedup")
    out = speedup(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
