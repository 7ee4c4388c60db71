"""The per-call regression A/B: one offline tick by a whole ``sim tick`` process, on a
pinned older commit of sim and on this tree, alternating.

``python -m bench.regression N REPEATS [COMMIT [OTHER]]`` — a fresh N-character world
(``bench/make_world.py``, locations = N / 10, seed 1) is written once; the pinned commit
(``PINNED``, main as of 2026-11-27, unless told) is checked out with ``git worktree add``
into a temporary folder; then REPEATS rounds each run ``sim tick --world COPY --json`` on a
fresh copy of the world, first with the pinned tree, then with this one, both with this
venv's Python and ``PYTHONPATH`` naming the tree (each child checks which ``sim`` it
imported). Wall time from spawn to exit, CPU and peak RSS from ``wait4``. Prints one JSON
object; the worktree is removed again. With OTHER, a second commit checked out the same way
runs in place of this tree (to place a regression between two commits).

The issue that asked for it measured 19.1 s (twice) for the pinned commit and 22.3 and
22.7 s for main as of 2026-11-28 on its machine (``RECORDED``): ``bench/run.py``
writes those beside this run's figures.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.make_world import make_world
from bench.process import run_child, tick_document

ROOT = Path(__file__).resolve().parents[1]

#: main as of 2026-11-27 (``git log --first-parent --until=2026-11-27``): before
#: references, conversations and retrieval's later passes were added
PINNED = "1bb3dbf"

#: issue 37's figures for one 10,000-character offline tick, whole process, on its
#: machine: the pinned commit, then main as of 2026-11-28 (before this round's fixes)
RECORDED = {"pinned_s": (19.1, 19.1), "main_2026_11_28_s": (22.3, 22.7)}


def tree_env(tree: Path) -> dict[str, str]:
    """A child's environment running the ``sim`` of ``tree`` (bytecode caches on)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def prepare(tree: Path) -> None:
    """Compile ``tree``'s bytecode once and check that its ``sim`` is what a child imports."""
    env = tree_env(tree)
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(tree / "sim")],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    found = subprocess.run(
        [sys.executable, "-c", "import sim; print(sim.__file__)"],
        check=True,
        env=env,
        capture_output=True,
        text=True,
        cwd=tree,
    ).stdout.strip()
    if Path(found).resolve() != (tree / "sim" / "__init__.py").resolve():
        raise SystemExit(f"a child with PYTHONPATH={tree} imported {found}, not {tree}/sim")


def has_commit(commit: str) -> bool:
    """Whether sim's git checkout holds ``commit`` (a shallow clone may not)."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    return found.returncode == 0


def pinned_worktree(commit: str, into: Path, name: str = "pinned") -> Path:
    """``commit`` checked out (detached) by ``git worktree add`` as ``into / name``."""
    if not has_commit(commit):
        raise SystemExit(
            f"bench.regression: {ROOT} is not a git checkout holding commit {commit} "
            "(a shallow clone? `git fetch --unshallow`)"
        )
    path = into / name
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(path), commit],
        check=True,
    )
    return path


def remove_worktree(path: Path) -> None:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
        check=False,
        capture_output=True,
    )
    subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False)


def one_tick(tree: Path, base: Path, scratch: Path) -> dict[str, Any]:
    """One tick of a fresh copy of ``base`` by ``tree``'s ``sim tick`` process."""
    world = scratch / "world"
    if world.exists():
        shutil.rmtree(world)
    shutil.copytree(base, world)
    os.sync()  # the copy on disk first: the tick does not pay for it
    run = run_child(
        [sys.executable, "-m", "sim", "tick", "--world", str(world), "--json"],
        scratch,
        tree_env(tree),
    )
    doc = tick_document(run.pop("stdout"))
    shutil.rmtree(world)
    return {"calls": doc["calls"], "timings": doc["timings"], **run}


def ab(
    characters: int, repeats: int, commit: str = PINNED, other: str | None = None
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sim-bench-ab-") as tmp:
        scratch = Path(tmp)
        base = scratch / "base"
        make_world(base, characters, max(1, characters // 10), seed=1)
        trees: list[Path] = []
        try:
            pinned = pinned_worktree(commit, scratch)
            trees.append(pinned)
            current = ROOT if other is None else pinned_worktree(other, scratch, "other")
            if other is not None:
                trees.append(current)
            full, against = (
                subprocess.run(
                    ["git", "-C", str(tree), "rev-parse", "HEAD"],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout.strip()
                for tree in (pinned, current)
            )
            prepare(pinned)
            prepare(current)
            runs: dict[str, list[dict[str, Any]]] = {"pinned": [], "current": []}
            loads: list[float] = []
            for _ in range(repeats):
                for name, tree in (("pinned", pinned), ("current", current)):
                    loads.append(os.getloadavg()[0])
                    runs[name].append(one_tick(tree, base, scratch))
        finally:
            for tree in trees:
                remove_worktree(tree)
    wall = {k: [r["wall_s"] for r in v] for k, v in runs.items()}
    cpu = {k: [r["cpu_s"] for r in v] for k, v in runs.items()}
    calls = {k: v[0]["calls"] for k, v in runs.items()}
    return {
        "characters": characters,
        "commit": full,
        "against": "this tree" if other is None else against,
        "repeats": repeats,
        "calls": calls,
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_mib": {k: max(r["peak_rss_mib"] for r in v) for k, v in runs.items()},
        "wall_ratio": statistics.median(wall["current"]) / statistics.median(wall["pinned"]),
        "cpu_ratio": statistics.median(cpu["current"]) / statistics.median(cpu["pinned"]),
        "load_before_each": loads,
        "recorded": RECORDED,
    }


def main() -> None:
    characters, repeats = int(sys.argv[1]), int(sys.argv[2])
    commit = sys.argv[3] if len(sys.argv) > 3 else PINNED
    other = sys.argv[4] if len(sys.argv) > 4 else None
    print(json.dumps(ab(characters, repeats, commit, other)))


if __name__ == "__main__":
    main()
