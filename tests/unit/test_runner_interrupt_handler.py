"""A second Ctrl-C raises ``KeyboardInterrupt`` inside whichever task is running; asyncio
would print that task's traceback as the process exits ("Task exception was never
retrieved"). The runner's loop handler keeps that quiet and reports anything else."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from sim.engine.runner import _quiet_second_ctrl_c


def _unretrieved(error: BaseException, caplog: pytest.LogCaptureFixture) -> list[str]:
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(_quiet_second_ctrl_c)
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
