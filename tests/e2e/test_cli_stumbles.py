"""What the CLI says when a newcomer stumbles (issue 24, items 14, 17 and 24): an
undeclared endpoint named in ``--model``, output piped into ``head``, a bad ``--phase``, a
tick with no log. Real ``sim`` processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import copy_demo, tree

from sim.config import load_config
from sim.engine.runner import Runner


def sim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sim", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "OPENAI_API_KEY": "sk-test"},
        timeout=120,
    )


def test_a_model_on_an_undeclared_endpoint_is_an_error_naming_the_section(
    tmp_path: Path,
) -> None:
    world = copy_demo(tmp_path / "w")
    before = tree(world, logs=True)
    result = sim("tick", "--world", str(world), "--model", "local/qwen2.5-7b", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "[providers.local]" in result.stderr and "field '--model'" in result.stderr
    assert "Traceback" not in result.stderr
    assert tree(world, logs=True) == before  # nothing ran, nothing written


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo after two offline ticks."""
    world = copy_demo(tmp_path_factory.mktemp("played") / "w")
    Runner(world, load_config(world_dir=world, cwd=world)).run(2)
    return world


@pytest.mark.parametrize(
    "args",
    [
        ("usage", "--by", "tick"),
        ("usage", "--by", "endpoint"),
        ("usage", "--json"),
        ("log",),
        ("log", "--tick", "all"),
        ("log", "--tick", "1", "--calls"),
        ("check",),
        ("replay", "--tick", "1"),
    ],
    ids=lambda args: "-".join(args),
)
def test_a_read_only_command_ends_quietly_on_a_closed_pipe(
    played: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    """``sim usage | head -1``: the reader is gone before sim writes its first line."""
    before = tree(played, logs=True)
    child = subprocess.Popen(
        [sys.executable, "-m", "sim", args[0], "--world", str(played), *args[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # long before the child has imported sim
    err = child.stderr.read().decode()
    child.stderr.close()
    code = child.wait(timeout=120)
    assert code == 141, err  # a shell's exit code for SIGPIPE, as `yes | head -1` ends
    assert err == ""  # no "failed: Broken pipe ... an interrupted tick resumes"
    assert tree(played, logs=True) == before


def test_tune_names_the_phase_option_it_was_given(played: Path, tmp_path: Path) -> None:
    result = sim("tune", "--world", str(played), "--phase", "nope", cwd=tmp_path)
    assert result.returncode == 2
    assert "'--phase': unknown phase 'nope'" in result.stderr
    assert "--depth" not in result.stderr


def test_log_and_replay_of_a_tick_with_no_log_say_the_same(played: Path, tmp_path: Path) -> None:
    shown = sim("log", "--world", str(played), "--tick", "99", cwd=tmp_path)
    replayed = sim("replay", "--world", str(played), "--tick", "99", cwd=tmp_path)
    assert shown.returncode == replayed.returncode == 2
    assert shown.stderr == replayed.stderr
    assert "no log for tick 99 (see `sim log --tick all`)" in shown.stderr
