"""The worlds bundled with sim (``worlds/`` of a checkout) as released, for tests and for
the docs' samples (``tools/docsamples.py``), whatever the checkout's copies hold."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import orjson


class TickedWorld(RuntimeError):
    """A bundled world was changed in place and there is no git index to restore it from."""


def pristine_worlds(repo: Path, dest: Path) -> Path:
    """The bundled worlds (``repo/worlds``) as released, copied into ``dest``; returns it.

    Following the README (``sim tick --world worlds/demo``) changes the tracked world in
    place, and tests that copied it then failed. In a git checkout the worlds are taken
    from the index (what is tracked, and staged edits: ``git checkout-index``), whatever
    the working files hold. Without git (an sdist), the working files are copied without
    their ``.sim/`` state, and a world that has been ticked is refused by name.
    """
    dest.mkdir(parents=True, exist_ok=True)
    listed = _git(repo, "ls-files", "-z", "--", "worlds")
    if listed:
        done = subprocess.run(
            ["git", "-C", str(repo), "checkout-index", "-z", "--stdin", f"--prefix={dest}/"],
            input=listed,
            capture_output=True,
            check=False,
        )
        if done.returncode == 0:
            return dest / "worlds"
    for world in sorted((repo / "worlds").iterdir()):
        if not world.is_dir():
            continue
        tick = orjson.loads((world / "world.json").read_bytes()).get("tick", 0)
        if tick != 0 or (world / ".sim").exists():
            raise TickedWorld(
                f"{world} has been ticked in place (tick {tick}); the tests need it as "
                "released: restore it from the release archive"
            )
        shutil.copytree(world, dest / "worlds" / world.name, ignore=shutil.ignore_patterns(".sim"))
    return dest / "worlds"


def _git(repo: Path, *args: str) -> bytes:
    """The output of ``git -C repo ARGS``; empty when there is no git or no repository."""
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, check=False, timeout=60
        )
    except OSError:  # no git
        return b""
    return done.stdout if done.returncode == 0 else b""


__all__ = ["TickedWorld", "pristine_worlds"]
