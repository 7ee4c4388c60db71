"""The commands' event loops, quiet about a second Ctrl-C.

A second Ctrl-C raises ``KeyboardInterrupt`` in whichever task is running; asyncio would
print that task's traceback ("Task exception was never retrieved") as the process exits,
after the command's own "interrupted" message. Every command that runs model calls
(``sim tick``, ``sim replay``, ``sim ask``, ``sim tune``) runs its loop with ``run``, whose
exception handler keeps that quiet and reports anything else as asyncio would.

The same Ctrl-C can land where Python cannot raise it: in a weak reference's callback or an
object's ``__del__`` (a garbage collection), and Python prints "Exception ignored in ..."
with a traceback. While the loop runs, and after it if it ended on Ctrl-C (the process is
exiting), ``sys.unraisablehook`` drops a ``KeyboardInterrupt`` and reports anything else
as before.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def quiet_second_ctrl_c(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler: an unretrieved ``KeyboardInterrupt`` is dropped (the
    CLI reports the interrupt once); anything else is reported as asyncio would."""
    if isinstance(context.get("exception"), KeyboardInterrupt):
        return
    loop.default_exception_handler(context)


Unraisable = Callable[[Any], object]


def quiet_unraisable(previous: Unraisable) -> Unraisable:
    """A ``sys.unraisablehook`` that drops a ``KeyboardInterrupt`` raised where Python
    cannot raise it, and passes anything else to ``previous``."""

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            return
        previous(unraisable)

    return hook


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a loop with ``quiet_second_ctrl_c`` as its handler, with
    ``quiet_unraisable`` as ``sys.unraisablehook`` until it returns (to the process's exit
    if it ends on Ctrl-C)."""
    previous = sys.unraisablehook
    sys.unraisablehook = quiet_unraisable(previous)
    kept: list[T] = []

    async def held() -> None:
        # the result kept out of the main task: as ``asyncio.Runner.run`` returns it looks
        # at its SIGINT handler (Python 3.11), and ``signal.getsignal`` formats that
        # handler, the task and its result with ``repr`` (a failed enum lookup); a big
        # tick's results took 0.1-0.2 s to format, for nothing
        kept.append(await main)

    try:
        with asyncio.Runner() as runner:
            runner.get_loop().set_exception_handler(quiet_second_ctrl_c)
            runner.run(held())
    except KeyboardInterrupt:
        raise  # the process is ending on Ctrl-C: a second one stays quiet to its exit
    except BaseException:
        sys.unraisablehook = previous
        raise
    sys.unraisablehook = previous
    return kept[0]
