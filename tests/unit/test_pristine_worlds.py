"""The tests use the bundled worlds as released, whatever the checkout's copies hold: the
README's `sim tick --world worlds/demo` ticked the tracked world in place, and seven tests
that copied it then failed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import DEMO, tree

from sim.cli import main
from sim.testing.worlds import TickedWorld, pristine_worlds


def layout(root: Path) -> Path:
    """A copy of the repository's layout: worlds/demo as released."""
    shutil.copytree(DEMO, root / "worlds" / "demo")
    return root


def tick_in_place(world: Path) -> None:
    done = CliRunner().invoke(main, ["tick", "--world", str(world), "--ticks", "2"])
    assert done.exit_code == 0, done.output
    assert tree(world) != tree(DEMO)  # the README's commands changed the tracked world


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_checkout_whose_demo_was_ticked_still_gives_the_released_world(tmp_path: Path) -> None:
    repo = layout(tmp_path / "repo")
    git(repo, "init", "-q")
    git(repo, "add", "worlds")
    git(repo, "commit", "-q", "-m", "worlds")
    tick_in_place(repo / "worlds" / "demo")
    worlds = pristine_worlds(repo, tmp_path / "pristine")
    assert tree(worlds / "demo") == tree(DEMO)
    assert not (worlds / "demo" / ".sim").exists()


def test_without_git_the_working_files_are_used_and_a_ticked_world_is_named(
    tmp_path: Path,
) -> None:
    repo = layout(tmp_path / "sdist")  # not a git checkout
    worlds = pristine_worlds(repo, tmp_path / "a")
    assert tree(worlds / "demo") == tree(DEMO)
    tick_in_place(repo / "worlds" / "demo")
    with pytest.raises(TickedWorld, match=r"worlds/demo has been ticked in place \(tick 2\)"):
        pristine_worlds(repo, tmp_path / "b")


def test_no_test_copies_the_checkouts_worlds_directly() -> None:
    """Every test takes the worlds from conftest (DEMO, HARVEST, WORLDS), as released."""
    tests = Path(__file__).resolve().parents[1]
    direct = [
        f"{path.relative_to(tests)}:{n}"
        for path in sorted(tests.rglob("*.py"))
        if path.name != "conftest.py" and path != Path(__file__).resolve()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if 'REPO / "worlds"' in line or 'parents[2] / "worlds"' in line
    ]
    assert direct == []
