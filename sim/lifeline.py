"""A child ``sim`` process that dies with the process that started it.

``sim sweep`` and ``sim study run`` start one ``sim`` process per step of a run and set
``SIM_PARENT_PID`` to their own pid in its environment. The child, when it starts
(``follow_parent``, called by the ``sim`` group), asks Linux to send it SIGTERM when that
parent dies (``prctl(PR_SET_PDEATHSIG)``, through ``ctypes``), so a sweep killed with
``kill -9`` leaves no ``sim tick`` running: SIGTERM stops a tick as Ctrl-C does (nothing
committed, resumable). Elsewhere, or where ``prctl`` fails, a daemon thread watches the
parent's pid once a second and sends the same signal. A child whose parent is already
gone when it starts exits at once.

The variable is taken out of the environment once read, so a process the child starts
is not bound to the wrong parent.

A program that is not ``sim`` (the ``cli`` provider's command) cannot be asked to call
``follow_parent``, and what it starts does not get its death signal. ``guarded(argv)`` is
the command line that runs ``argv`` under this file run as a script (stdlib only, ``-I
-S``: a few tens of milliseconds): the guard binds itself to the calling process as above
and, when that dies (``kill -9`` included) or it gets SIGTERM, SIGKILLs the command (and
reaps it), then its process group: everything the command started there, and itself. (The
death signal also comes when the *thread* that started the guard ends while the process
lives on: the guard then checks its parent before acting, and acts only once.)
Start it as the leader of a group of its own (``start_new_session``). It exits as the
command does (a command killed by a signal, by the same signal), and holds none of its
pipes meanwhile.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import NoReturn

#: the environment variable naming the pid a child must not outlive
PARENT_ENV = "SIM_PARENT_PID"
#: ``PR_SET_PDEATHSIG`` of ``<linux/prctl.h>``
_PR_SET_PDEATHSIG = 1
#: the signal a guard asks for when its parent dies (SIGTERM from the parent: stop now)
_PARENT_DIED = signal.SIGUSR1


def _prctl_deathsig(sig: int) -> bool:
    """Ask the kernel for ``sig`` when the parent dies; whether that was set."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int, sig: int, period: float = 1.0) -> None:
    while os.getppid() == parent:
        time.sleep(period)
    os.kill(os.getpid(), sig)


def follow_parent() -> None:
    """Bind this process's life to ``$SIM_PARENT_PID``'s (nothing when it is unset)."""
    raw = os.environ.pop(PARENT_ENV, None)
    if raw is None or not raw.strip().isdigit():
        return
    parent = int(raw)
    if not _prctl_deathsig(signal.SIGTERM):
        threading.Thread(target=_watch, args=(parent, signal.SIGTERM), daemon=True).start()
    if os.getppid() != parent:  # the parent died before the signal was asked for
        os._exit(128 + signal.SIGTERM)


def guarded(argv: Sequence[str]) -> list[str]:
    """The command line running ``argv`` under a guard bound to this process (see the
    module doc); start it with ``start_new_session=True``."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), "--", *argv]


def _guard(args: list[str]) -> NoReturn:
    """Run ``args`` (``PARENT -- PROGRAM ARG...``) until it exits, its group killed when
    the parent dies first."""
    parent, argv = int(args[0]), args[2:]
    if os.getpgrp() != os.getpid():  # started without a group of its own: make one, so
        os.setpgid(0, 0)  # that killing "its" group never reaches the caller's
    group = os.getpgrp()
    command: list[int] = []

    def end(*_: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP, _PARENT_DIED):
            signal.signal(sig, signal.SIG_IGN)  # once, however many signals come
        try:
            if command:  # the command first, reaped here (not left for init)
                os.kill(command[0], signal.SIGKILL)
                os.waitpid(command[0], 0)
        except OSError:
            pass
        finally:
            os.killpg(group, signal.SIGKILL)  # what it started, and the guard

    def parent_died(*_: object) -> None:
        # the kernel also sends it when the *thread* that started the guard ends, and
        # hands the guard to another thread of the same process: that one lives on
        if os.getppid() != parent:
            end()

    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGHUP, end)
    signal.signal(_PARENT_DIED, parent_died)
    if not _prctl_deathsig(_PARENT_DIED):
        threading.Thread(target=_watch, args=(parent, _PARENT_DIED, 0.2), daemon=True).start()
    if os.getppid() != parent:  # the parent died before the signal was asked for
        end()
    try:
        command.append(os.posix_spawnp(argv[0], argv, os.environ))
    except OSError as exc:
        os.write(2, f"cannot start {argv[0]}: {exc.strerror or exc}\n".encode())
        os._exit(127)
    pid = command[0]
    # the command's pipes are its own: the guard keeps none open
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        killed_by = os.WTERMSIG(status)
        signal.signal(killed_by, signal.SIG_DFL)
        os.kill(os.getpid(), killed_by)
        os._exit(128 + killed_by)  # a signal whose default is not to end a process
    os._exit(os.waitstatus_to_exitcode(status))


__all__ = ["PARENT_ENV", "follow_parent", "guarded"]

if __name__ == "__main__":
    _guard(sys.argv[1:])
