"""Shared fixtures: scratch copies of the demo world."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.llm.calls import current_call
from sim.testing.pytest_plugin import (  # noqa: F401  (fixtures)
    anthropic_stub,
    gemini_stub,
    stub_server,
)

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "worlds" / "demo"


@pytest.fixture(autouse=True)
def no_current_call() -> Iterator[None]:
    """A test that plays the recorder (sets the current call) does not leak it into the
    next test, where it would add idempotency keys the test did not ask for."""
    token = current_call.set(None)
    yield
    current_call.reset(token)


def copy_demo(dest: Path) -> Path:
    shutil.copytree(DEMO, dest, ignore=shutil.ignore_patterns(".sim"))
    return dest


@pytest.fixture
def demo_world(tmp_path: Path) -> Path:
    """A scratch copy of worlds/demo; the original is never touched."""
    return copy_demo(tmp_path / "demo")


def tree(root: Path, logs: bool = False) -> dict[str, bytes]:
    """Every file under root (relative path -> bytes), for byte-for-byte comparisons.

    Tick logs (``.sim/log/``) record latencies and times, so they are left out unless asked.
    """
    out = {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}
    return {
        rel: p.read_bytes() for rel, p in out.items() if logs or not rel.startswith(".sim/log/")
    }
