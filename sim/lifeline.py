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
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

#: the environment variable naming the pid a child must not outlive
PARENT_ENV = "SIM_PARENT_PID"
#: ``PR_SET_PDEATHSIG`` of ``<linux/prctl.h>``
_PR_SET_PDEATHSIG = 1


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


def _watch(parent: int, sig: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
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


__all__ = ["PARENT_ENV", "follow_parent"]
