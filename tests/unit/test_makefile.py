"""The Makefile: `make demo` installs sim alone (it installed every dev extra, 846 MB);
the checks add the dev extras; `make help` lists every target with what it does."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def dry_run(tmp_path: Path, target: str) -> str:
    """What ``make TARGET`` would run in a fresh checkout (no .venv yet)."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    done = subprocess.run(
        ["make", "-n", target], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    return done.stdout


def test_the_demo_installs_sim_without_the_dev_extras(tmp_path: Path) -> None:
    commands = dry_run(tmp_path, "demo")
    assert re.search(r"pip install --quiet -e \.$", commands, re.M), commands
    assert "[dev]" not in commands
    assert "sim tick --world .demo/world --ticks 3" in commands


def test_the_checks_add_the_dev_extras(tmp_path: Path) -> None:
    for target in ("test", "lint"):
        commands = dry_run(tmp_path, target)
        assert "pip install --quiet -e '.[dev]'" in commands, target


def test_make_help_lists_every_target() -> None:
    makefile = (REPO / "Makefile").read_text()
    phony = set(re.search(r"^\.PHONY: (.*)$", makefile, re.M).group(1).split())  # type: ignore[union-attr]
    documented = set(re.findall(r"^([a-zA-Z_-]+):.*## ", makefile, re.M))
    assert phony == documented
