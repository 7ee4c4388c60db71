"""Warm steps: a sweep's or a study's steps run in forks of a long-lived ``python -m sim``
that has already imported sim, instead of a new Python process each (about 0.5 s of CPU
start-up saved per step).

**The worker.** ``python -m sim`` started with ``SIM_WARM_FD`` set (by
``sim.runs.process.LocalExecutor``, one per job slot, in a session of its own) imports the
modules of a step (``PRELOAD``) and then serves step requests on the socket that variable
names, one at a time. A request is the argv the child ``python -m sim`` would get (built as
for a cold child, with the user's trusted flags only), the working folder, the environment
and the run's output file (passed as a file descriptor, opened by the sweep without
following a link). For each request the worker **forks**: the fork becomes a fresh step
(its own session, stdin from ``/dev/null``, stdout and stderr to the output file, the
working folder, environment and ``sys.argv`` of the request) and returns from ``serve`` to
``sim.__main__``, which runs the ``sim`` command and exits as a fresh process does (atexit,
threads, exit code). The worker itself never runs a command, so no state of one step (module
caches, config, signal handlers, event loops) reaches another: each step starts from the
same just-imported state.

**Signals and lives.** The worker reports the fork's pid, forwards the signals the sweep
asks for (``{"signal": N}``: Ctrl-C's SIGINT, a second Ctrl-C's SIGKILL) through a pidfd
(no pid reuse), and reports the exit code as ``Popen.returncode`` would (negative: killed by
that signal; a segfault is the step's failure, the worker lives on). The step dies with the
worker (``sim.lifeline``: SIGTERM, which stops a tick as Ctrl-C does). When the sweep ends,
``kill -9`` included, its end of the socket closes: the worker sends SIGTERM to a step in
flight, waits for it and exits.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import select
import signal
import socket
import sys
from typing import Any

import orjson

#: ``0`` runs each of a sweep's or study's steps in a new process (the cold path); unset or
#: anything else: warm (the default, where the platform allows it)
WARM_ENV = "SIM_WARM_STEPS"
#: the environment variable naming a worker's socket (set only for a worker)
FD_ENV = "SIM_WARM_FD"
#: the largest message on a worker's socket (a request: argv, folder, environment)
MAX_MESSAGE = 1 << 20

#: what a worker imports before its first step: what ``sim tick`` and the other commands a
#: study runs import when they start
PRELOAD = (
    "asyncio",
    "sim.cli",
    "sim.cli.progress",
    "sim.cli.run",
    "sim.engine.runner",
    "sim.llm.client",
    "sim.mind.loop",
    "sim.offline.engine",
    "sim.phases.apply",
    "sim.providers.replay",
    "sim.storage.store",
    "sim.ticklog.writer",
    "sim.world",
)


def enabled() -> bool:
    """Whether steps run warm: on Linux with pidfds, unless ``$SIM_WARM_STEPS`` is ``0``."""
    return (
        os.environ.get(WARM_ENV, "").strip() != "0"
        and sys.platform.startswith("linux")
        and hasattr(os, "pidfd_open")
    )


def is_worker() -> bool:
    """Whether this ``python -m sim`` is a warm worker (``serve`` is its loop)."""
    return FD_ENV in os.environ


def serve() -> None:
    """A worker's loop; returns only in a step's fork, ready to run ``sim`` (module doc).
    The worker exits when the sweep closes its socket."""
    sock = socket.socket(fileno=int(os.environ.pop(FD_ENV)))
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional part missing: the step imports it as a cold one
            continue
    # what was imported is kept out of the collector's scans, so a step's collections do not
    # write to (and copy) the pages it shares with the worker (the ``gc.freeze`` doc's use)
    gc.collect()
    gc.freeze()
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 1)
        except OSError:
            os._exit(0)
        if not data:  # the sweep has ended
            os._exit(0)
        request: dict[str, Any] = orjson.loads(data)
        if "args" not in request or len(fds) != 1:  # a late signal for a step that ended
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            _become_step(sock, fds[0], request)
            return
        os.close(fds[0])
        code = _wait(sock, pid)
        try:
            sock.sendall(orjson.dumps({"exit": code}))
        except OSError:
            os._exit(0)


def _become_step(sock: socket.socket, output: int, request: dict[str, Any]) -> None:
    """In the fork: the state a cold child starts in."""
    from sim.lifeline import PARENT_ENV

    sock.close()
    os.setsid()
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    os.close(stdin)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ[PARENT_ENV] = str(os.getppid())  # the step dies with its worker
    sys.argv = [sys.argv[0], *request["args"]]


def _wait(sock: socket.socket, pid: int) -> int:
    """Wait for the step ``pid``, forwarding the signals asked for; its exit code."""
    pidfd = os.pidfd_open(pid)
    try:
        try:
            sock.sendall(orjson.dumps({"pid": pid}))
            listening = True
        except OSError:
            listening = False
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        while True:
            ready, _, _ = select.select([pidfd, sock.fileno()] if listening else [pidfd], [], [])
            if pidfd in ready:
                _, status = os.waitpid(pid, 0)
                return os.waitstatus_to_exitcode(status)
            try:
                message = sock.recv(MAX_MESSAGE)
            except OSError:
                message = b""
            if not message:  # the sweep is gone: stop the step as Ctrl-C does, then exit
                listening = False
                _send(pidfd, signal.SIGTERM)
                continue
            asked = orjson.loads(message).get("signal")
            if isinstance(asked, int):
                _send(pidfd, asked)
    finally:
        os.close(pidfd)


def _send(pidfd: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, sig)


__all__ = ["FD_ENV", "PRELOAD", "WARM_ENV", "enabled", "is_worker", "serve"]
