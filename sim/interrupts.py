"""The commands' event loops, quiet about a second Ctrl-C.

A second Ctrl-C raises ``KeyboardInterrupt`` in whichever task is running; asyncio would
print that task's traceback ("Task exception was never retrieved") as the process exits,
after the command's own "interrupted" message. Every command that runs model calls
(``sim tick``, ``sim replay``, ``sim ask``, ``sim tune``) runs its loop with ``run``, whose
exception handler keeps that quiet and reports anything else as asyncio would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def quiet_second_ctrl_c(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler: an unretrieved ``KeyboardInterrupt`` is dropped (the
    CLI reports the interrupt once); anything else is reported as asyncio would."""
    if isinstance(context.get("exception"), KeyboardInterrupt):
        return
    loop.default_exception_handler(context)


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a loop with ``quiet_second_ctrl_c`` as its handler."""
    with asyncio.Runner() as runner:
        runner.get_loop().set_exception_handler(quiet_second_ctrl_c)
        return runner.run(main)
