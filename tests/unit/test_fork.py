"""A run's fork (``sim.runs.fork.fork_current``): the threads of one process fork at once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sim.runs import fork
from tests.conftest import tree


def test_two_threads_fork_one_world_at_once(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs of a sweep or study fork the same world at the same moment: the second
    waits for the first to have read it (the world's lock admits one holder) instead of
    being refused as 'another sim process', and both forks hold the world's state."""
    reading = threading.Event()
    go_on = threading.Event()
    read_state = fork.read_state
    calls = []

    def slow_read(world: Path) -> dict[str, bytes]:
        calls.append(world)
        if len(calls) == 1:  # the first fork holds the world's lock until told
            reading.set()
            assert go_on.wait(10)
        return read_state(world)

    monkeypatch.setattr(fork, "read_state", slow_read)
    errors: list[BaseException] = []

    def run(name: str, seed: int) -> None:
        try:
            fork.fork_current(demo_world, tmp_path / name, seed, {})
        except BaseException as exc:
            errors.append(exc)

    first = threading.Thread(target=run, args=("a", 1))
    first.start()
    assert reading.wait(10)
    second = threading.Thread(target=run, args=("b", 2))
    second.start()
    second.join(0.3)
    assert second.is_alive(), errors  # waiting its turn, not refused
    go_on.set()
    first.join(10)
    second.join(10)
    assert errors == []
    world = tree(demo_world)
    for name in ("a", "b"):
        forked = tree(tmp_path / f".{name}.tmp")
        assert forked["characters/ada.json"] == world["characters/ada.json"]
