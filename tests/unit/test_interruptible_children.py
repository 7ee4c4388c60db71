"""The Ctrl-C tests' children get SIGINT at its default even when the test run was started
with it ignored (`nohup make test &`): four of them failed that way."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import interruptible_children

SHOW = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"


def child_handles_ctrl_c() -> bool:
    done = subprocess.run([sys.executable, "-c", SHOW], capture_output=True, text=True, check=True)
    return done.stdout.strip() == "True"


@pytest.fixture
def sigint_ignored() -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as nohup and `&` leave it
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_children_started_inside_get_ctrl_c_back(sigint_ignored: None) -> None:
    assert not child_handles_ctrl_c()  # what the four tests' children got
    with interruptible_children():
        assert child_handles_ctrl_c()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # ours is put back
