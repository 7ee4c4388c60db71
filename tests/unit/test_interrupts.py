"""A second Ctrl-C raises ``KeyboardInterrupt`` inside whichever task is running; asyncio
would print that task's traceback as the process exits ("Task exception was never
retrieved"). The commands' loop handler keeps that quiet and reports anything else, and
every command that makes model calls runs its loop with it."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim import interrupts
from sim.interrupts import quiet_second_ctrl_c


def _unretrieved(error: BaseException, caplog: pytest.LogCaptureFixture) -> list[str]:
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(quiet_second_ctrl_c)
    future = loop.create_future()
    future.set_exception(error)  # finished with an exception nobody retrieves
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        del future
        gc.collect()
    loop.close()
    return [r.getMessage() for r in caplog.records if r.name == "asyncio"]


def test_a_keyboard_interrupt_left_in_a_task_prints_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert _unretrieved(KeyboardInterrupt(), caplog) == []


def test_any_other_unretrieved_error_is_still_reported(caplog: pytest.LogCaptureFixture) -> None:
    said = _unretrieved(ValueError("boom"), caplog)
    assert said and "exception was never retrieved" in said[0]


def test_run_gives_its_loop_the_handler_and_returns_the_result() -> None:
    async def handler() -> object:
        return asyncio.get_running_loop().get_exception_handler()

    assert interrupts.run(handler()) is quiet_second_ctrl_c


def test_the_result_is_never_formatted() -> None:
    """A tick's results are big: Python 3.11's runner, as it returns, looks at its SIGINT
    handler through ``signal.getsignal``, which formats the main task with ``repr``
    (result included). ``run`` keeps the result out of that task."""
    formatted: list[int] = []

    class Big:
        def __repr__(self) -> str:
            formatted.append(1)
            return "Big()"

    async def main() -> Big:
        return Big()

    assert isinstance(interrupts.run(main()), Big)
    assert formatted == []


@pytest.mark.parametrize(
    "module", ["engine/runner.py", "engine/replay.py", "interview.py", "analysis/tune.py"]
)
def test_the_commands_that_make_calls_run_their_loop_with_it(module: str) -> None:
    """``sim tick``, ``sim replay``, ``sim ask`` and ``sim tune``."""
    source = (Path(interrupts.__file__).parent / module).read_text(encoding="utf-8")
    assert "interrupts.run(" in source and "asyncio.run(" not in source


#: a child: ``interrupts.run`` of a coroutine that drops an object whose ``__del__`` raises
#: (as a Ctrl-C landing in a garbage collection does), then, when the coroutine itself was
#: interrupted, another one after the loop (the process exiting on Ctrl-C)
_UNRAISABLE = """
import gc, sys
from sim import interrupts

class Raises:
    def __del__(self):
        raise {error}

async def main():
    Raises()
    gc.collect()
    if {interrupted}:
        raise KeyboardInterrupt

try:
    interrupts.run(main())
except KeyboardInterrupt:
    Raises()
    gc.collect()
print("done")
"""


@pytest.mark.parametrize("interrupted", [False, True])
def test_a_ctrl_c_landing_in_a_garbage_collection_prints_no_traceback(interrupted: bool) -> None:
    code = _UNRAISABLE.format(error="KeyboardInterrupt", interrupted=interrupted)
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ)
    )
    assert child.returncode == 0 and child.stdout == "done\n", child.stderr
    assert child.stderr == ""


def test_any_other_error_in_a_garbage_collection_is_still_reported() -> None:
    code = _UNRAISABLE.format(error="ValueError('boom')", interrupted=False)
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ)
    )
    assert child.stdout == "done\n", child.stderr
    assert "Exception ignored" in child.stderr and "ValueError: boom" in child.stderr


def test_run_puts_the_previous_unraisable_hook_back() -> None:
    before = sys.unraisablehook

    async def nothing() -> None:
        return None

    interrupts.run(nothing())
    assert sys.unraisablehook is before
