"""Long histories (issue #16): tick-log size and what reading a long history costs.

    python -m bench.history build DIR --characters 500 --ticks 100
    python -m bench.history copies DIR OUT --times 10
    python -m bench.history measure DIR [--only "log --tick all" ...]

``build`` makes a synthetic world (``bench/make_world.py``) and runs it offline for N
ticks in this process; ``copies`` makes a longer history from a built one by repeating its
logs (hard links) and summaries under later tick numbers (for timing the readers only:
the copies' contents still name their own ticks); ``measure`` reports the bytes of ``.sim/log`` per
character-tick and, for each history command run as its own ``sim`` process, its wall
time and peak RSS (``os.wait4`` of that child; sim's bytecode caches written first and
used, as for an installed program: ``bench.process.child_env``); ``sim report`` writes its
page into the world (``report.html`` and its ``report-ticks/`` detail files, sized, then
removed). Each prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.process import child_env, compile_sim

ROOT = Path(__file__).resolve().parents[1]

#: the commands measured: name -> ``sim`` arguments after ``--world DIR``
COMMANDS: dict[str, list[str]] = {
    "log --tick all": ["log", "--tick", "all"],
    "usage --by entity": ["usage", "--by", "entity"],
    "usage --by phase": ["usage", "--by", "phase"],
    "check": ["check"],
    "report": ["report"],
}


def build(world: Path, characters: int, ticks: int) -> dict[str, Any]:
    """A synthetic world run offline for ``ticks`` ticks (its ``.sim/log`` is the history)."""
    from bench.make_world import make_world
    from sim.config import load_config
    from sim.engine.runner import Runner

    if world.exists():
        shutil.rmtree(world)
    make_world(world, characters, max(1, characters // 10), seed=1)
    started = time.perf_counter()
    config = load_config(cwd=world.parent)
    Runner(world, config).run(ticks)
    return {"characters": characters, "ticks": ticks, "build_s": time.perf_counter() - started}


def copies(world: Path, out: Path, times: int) -> dict[str, Any]:
    """``out``: ``world`` with its logs and summaries repeated ``times`` times."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(world, out, symlinks=True)
    folder = out / ".sim" / "log"
    names = sorted(p.name for p in folder.iterdir() if p.name.startswith("tick-"))
    last = max(int(n[5:11]) for n in names)
    for k in range(1, times):
        for name in names:
            tick = int(name[5:11]) + k * last
            os.link(folder / name, folder / f"tick-{tick:06d}{name[11:]}")
    meta = json.loads((out / "world.json").read_bytes())
    meta["tick"] = last * times
    (out / "world.json").write_text(json.dumps(meta))
    return {"ticks": last * times}


def _run(world: Path, args: list[str], cwd: Path) -> dict[str, Any]:
    """One ``sim`` process: its wall time and peak RSS (its own, from ``wait4``)."""
    command = [sys.executable, "-m", "sim", *args[:1], "--world", str(world), *args[1:]]
    page = world / "report.html"
    side = world / "report-ticks"  # the ticks' detail, loaded by the page when shown
    if args[0] == "report":
        page.unlink(missing_ok=True)
        shutil.rmtree(side, ignore_errors=True)
    started = time.perf_counter()
    proc = subprocess.Popen(
        command, cwd=cwd, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {proc.returncode}:\n{err}")
    out: dict[str, Any] = {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,
    }
    if args[0] == "report":
        out["page_mb"] = page.stat().st_size / 1e6
        files = list(side.iterdir()) if side.is_dir() else []
        out["detail_files"] = len(files)
        out["detail_mb"] = sum(p.stat().st_size for p in files) / 1e6
        out["largest_detail_file_mb"] = max((p.stat().st_size for p in files), default=0) / 1e6
        page.unlink()  # the world is left as it was
        shutil.rmtree(side, ignore_errors=True)
    return out


def startup() -> dict[str, Any]:
    """A ``sim`` process that reads nothing: ``sim log --help`` (imports and start-up)."""
    compile_sim()
    with tempfile.TemporaryDirectory(prefix="sim-bench-") as tmp:
        return _run(Path(tmp), ["log", "--help"], Path(tmp))


def measure(world: Path, only: list[str] | None = None) -> dict[str, Any]:
    """Log bytes per character-tick and each command's time and memory."""
    folder = world / ".sim" / "log"
    logs = summaries = 0
    for path in folder.iterdir():
        if path.name.endswith(".summary.jsonl.gz"):
            summaries += path.stat().st_size
        elif path.name.startswith("tick-"):
            logs += path.stat().st_size
    meta = json.loads((world / "world.json").read_bytes())
    characters = len(list((world / "characters").glob("*.json")))
    ticks = int(meta["tick"])
    per = characters * ticks
    result: dict[str, Any] = {
        "characters": characters,
        "ticks": ticks,
        "log_bytes": logs,
        "summary_bytes": summaries,
        "kb_per_character_tick": (logs + summaries) / per / 1024,
        "commands": {},
    }
    compile_sim()
    with tempfile.TemporaryDirectory(prefix="sim-bench-") as tmp:
        for name, args in COMMANDS.items():
            if only is None or name in only:
                result["commands"][name] = _run(world, args, Path(tmp))
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    b = sub.add_parser("build")
    b.add_argument("world", type=Path)
    b.add_argument("--characters", type=int, default=500)
    b.add_argument("--ticks", type=int, default=100)
    c = sub.add_parser("copies")
    c.add_argument("world", type=Path)
    c.add_argument("out", type=Path)
    c.add_argument("--times", type=int, default=10)
    m = sub.add_parser("measure")
    m.add_argument("world", type=Path)
    m.add_argument("--only", action="append", choices=sorted(COMMANDS))
    sub.add_parser("startup")
    args = parser.parse_args()
    if args.what == "build":
        print(json.dumps(build(args.world, args.characters, args.ticks)))
    elif args.what == "copies":
        print(json.dumps(copies(args.world, args.out, args.times)))
    elif args.what == "startup":
        print(json.dumps(startup()))
    else:
        print(json.dumps(measure(args.world, args.only)))


if __name__ == "__main__":
    main()
