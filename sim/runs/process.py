"""A run as a child process: the ``sim tick`` that continues a run under its grant with the
user's trusted flags only, run to its end by an executor (a local process or a Ray task),
and how each run ended.

**Ctrl-C.** ``run_tasks`` runs a sweep's or a study's work ``jobs`` at a time. The first
Ctrl-C starts nothing new (the work not begun is cancelled; a step asked for after it is
not started) and interrupts the steps in flight: the local executor (``LocalExecutor``)
starts each child in its own session, so the terminal's Ctrl-C reaches the sweep alone,
and forwards one SIGINT to each child, which stops its tick as Ctrl-C does (resumable,
nothing paid twice). A second Ctrl-C kills the children and ends the command at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

import orjson

from sim import safefs
from sim.config import Config
from sim.errors import InputError
from sim.runs import warm
from sim.runs.design import SweepPlan
from sim.runs.ledger import Grant
from sim.storage.journal import SIM_DIR

#: where a run's ``sim tick`` output is appended (inside the run's folder)
OUTPUT_FILE = f"{SIM_DIR}/sweep-output.log"


Status = Literal["done", "finished", "failed", "not started"]


@dataclass
class RunOutcome:
    """How one run of a sweep ended this time."""

    name: str
    seed: int
    overrides: dict[str, Any]
    status: Status
    tick: int
    target: int
    exit_code: int | None = None
    message: str = ""
    granted_usd: float | None = None
    granted_tokens: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every field by its name, in declaration order (the sweep's state file row)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class SweepResult:
    """Every run's outcome, in plan order, and what the whole sweep has spent."""

    runs: list[RunOutcome]
    spent_usd: float | None
    spent_tokens: int
    #: stopped by Ctrl-C (``run_tasks``): the runs not finished resume on the next run
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        return all(run.status in ("done", "finished") for run in self.runs)


# -- running -----------------------------------------------------------------------------------


def setting_flags(overrides: Mapping[str, Any]) -> list[str]:
    """A run's settings as ``--set KEY=JSON`` flags (one value each, read back exactly)."""
    flags: list[str] = []
    for key, value in overrides.items():
        flags += ["--set", f"{key}={orjson.dumps(value).decode()}"]
    return flags


def trusted_flags(plan: SweepPlan, overrides: Mapping[str, Any]) -> list[str]:
    """What every command a sweep runs on a run folder is given so that its endpoints and
    keys come from the user, not from the folder: ``--config`` and the settings."""
    trusted = plan.trusted_config
    return (["--config", str(trusted)] if trusted else []) + setting_flags(overrides)


def tick_command(
    run_dir: Path,
    ticks: int,
    grant: Grant,
    config: Config,
    trusted: Sequence[str] = (),
    workers: int = 1,
) -> list[str]:
    """The ``sim tick`` that runs a run on, under its grant (never above its own config's
    cap), with the user's ``trusted`` flags (``trusted_flags``), on ``workers`` shards
    (``SweepPlan.workers``); never ``--trust-world-config``: the run's folder is
    untrusted input."""
    where = str(run_dir.resolve())
    command = [sys.executable, "-m", "sim", "tick", "--world", where, "--ticks", str(ticks)]
    command += trusted
    if workers > 1:
        command += ["--workers", str(workers)]
    if grant.usd is not None:
        own = config.budget.max_cost_usd
        command += ["--budget-usd", repr(min(grant.usd, own) if own else grant.usd)]
    if grant.tokens is not None:
        own_tokens = config.budget.max_total_tokens
        command += [
            "--budget-tokens",
            str(min(grant.tokens, own_tokens) if own_tokens else grant.tokens),
        ]
    return command


#: runs one command of a run (``sim tick``, ...) to its end, in the given working folder
#: (the sweep's own); its output goes to the run's ``OUTPUT_FILE``; returns the exit code
Executor = Callable[[Path, list[str], Path], int]


def _start(
    run_dir: Path | str, command: list[str], cwd: Path | str | None, own_session: bool = False
) -> subprocess.Popen[bytes]:
    """Start one command of a run (see ``run_one``)."""
    from sim.lifeline import PARENT_ENV

    output = safefs.open_append(Path(run_dir), OUTPUT_FILE)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", PARENT_ENV: str(os.getpid())}
    try:
        return subprocess.Popen(
            command,
            cwd=Path.cwd() if cwd is None else Path(cwd),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=own_session,
        )
    finally:
        os.close(output)


def run_one(run_dir: Path | str, command: list[str], cwd: Path | str | None = None) -> int:
    """Run one command of a run to its end, in ``cwd`` (never the run's folder, whose
    ``config.toml`` must not be read as the user's); its output is appended to
    ``OUTPUT_FILE``, opened without following a link (a run's folder is untrusted: a link
    planted there must not make the sweep write outside it). The child dies with this
    process (``sim.lifeline``).

    Raises:
        UnsafePath: the output file, or a folder on its way, is a link or not a plain file.
    """
    return _start(run_dir, command, cwd).wait()


#: the message of a run a Ctrl-C stopped, or kept from starting
STOPPED = "interrupted (Ctrl-C): run the same command again to resume"
#: the exit code of a step not started because the command was interrupted (a shell's for
#: SIGINT)
INTERRUPTED = 128 + signal.SIGINT


class _WarmWorker:
    """One warm worker (``sim.runs.warm``) and the sweep's end of its socket."""

    def __init__(self) -> None:
        from sim.lifeline import PARENT_ENV
        from sim.runs.warm import FD_ENV

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", FD_ENV: str(theirs.fileno())}
        env.pop(PARENT_ENV, None)  # it ends with its socket (the sweep's end), not a signal
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "sim"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        finally:
            theirs.close()
        self.sock = ours
        self.alive = True
        #: the pid of the step in flight (its fork), once the worker has told it
        self.step_pid: int | None = None

    def start(self, args: list[str], cwd: Path, output: int) -> None:
        request = {"args": args, "cwd": str(cwd), "env": {**os.environ, "PYTHONUNBUFFERED": "1"}}
        self.step_pid = None
        try:
            socket.send_fds(self.sock, [orjson.dumps(request)], [output])
        except OSError:
            self.alive = False

    def result(self) -> int | None:
        """The step's exit code; ``None`` when the worker itself ended."""
        while self.alive:
            try:
                message = self.sock.recv(warm.MAX_MESSAGE)
            except OSError:
                message = b""
            if not message:
                self.alive = False
                break
            answer = orjson.loads(message)
            if "pid" in answer:
                self.step_pid = int(answer["pid"])
            if "exit" in answer:
                return int(answer["exit"])
        return None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(OSError):
            self.sock.send(orjson.dumps({"signal": int(sig)}))

    def close(self, timeout: float = 10) -> None:
        self.alive = False
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a thread waiting for its result
        self.sock.close()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class LocalExecutor:
    """``run_one`` for each step, each child in its own session and known, so that a
    Ctrl-C is delivered once, by ``interrupt`` (and a second one's ``kill`` ends them);
    once interrupted, no step is started (``INTERRUPTED``).

    ``warm_steps`` (default: ``sim.runs.warm.enabled()``, opted out by ``SIM_WARM_STEPS=0``):
    a ``python -m sim`` step runs in a fork of a warm worker (``sim.runs.warm``), one
    worker per job slot, started on first use and kept until ``close``; a worker that
    dies is replaced. The step's argv, folder and output are those of a cold child.
    """

    def __init__(self, warm_steps: bool | None = None) -> None:
        self._lock = threading.Lock()
        self._children: set[subprocess.Popen[bytes]] = set()
        self._idle: list[_WarmWorker] = []
        self._busy: set[_WarmWorker] = set()
        self.warm = warm.enabled() if warm_steps is None else warm_steps
        self.stopping = False

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __call__(self, run_dir: Path, command: list[str], cwd: Path) -> int:
        if self.warm and command[:3] == [sys.executable, "-m", "sim"]:
            return self._warm(run_dir, command[3:], cwd)
        with self._lock:
            if self.stopping:
                return INTERRUPTED
            child = _start(run_dir, command, cwd, own_session=True)
            self._children.add(child)
        try:
            return child.wait()
        finally:
            with self._lock:
                self._children.discard(child)

    def _warm(self, run_dir: Path, args: list[str], cwd: Path) -> int:
        with self._lock:
            if self.stopping:
                return INTERRUPTED
            output = safefs.open_append(Path(run_dir), OUTPUT_FILE)
            try:
                worker = self._idle.pop() if self._idle else _WarmWorker()
                worker.start(args, Path(cwd), output)
            finally:
                os.close(output)
            self._busy.add(worker)
        code = worker.result()
        with self._lock:
            self._busy.discard(worker)
            if code is not None and not self.stopping:
                self._idle.append(worker)
                return code
        if code is not None:
            worker.close()
            return code
        worker.close(timeout=1)  # it died: the step with it (its lifeline); a new one next
        if self.stopping:
            return -signal.SIGKILL
        died = worker.process.returncode
        with contextlib.suppress(OSError, InputError):
            note = safefs.open_append(Path(run_dir), OUTPUT_FILE)
            try:
                os.write(note, f"the warm worker running this step ended ({died})\n".encode())
            finally:
                os.close(note)
        return died if died is not None and died != 0 else 1

    def interrupt(self) -> None:
        """Start nothing more; SIGINT to each child in flight (it stops as at Ctrl-C)."""
        self._signal(signal.SIGINT)

    def kill(self) -> None:
        """Start nothing more; kill each child in flight and reap it."""
        children = self._signal(signal.SIGKILL)
        for child in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=10)
        self.close()

    def close(self) -> None:
        """End the warm workers (a step in flight is stopped as at Ctrl-C, and reaped)."""
        with self._lock:
            workers = self._idle + list(self._busy)
            self._idle = []
        for worker in workers:
            worker.close()

    def _signal(self, sig: int) -> list[subprocess.Popen[bytes]]:
        with self._lock:
            self.stopping = True
            children = list(self._children)
            busy = list(self._busy)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(sig)
        for worker in busy:
            worker.signal(sig)
        return children


def run_tasks(
    jobs: int,
    tasks: Sequence[Callable[[], None]],
    executor: Executor,
    stopping: threading.Event,
    on_interrupt: Callable[[str], None] | None = None,
) -> bool:
    """Run ``tasks``, ``jobs`` at a time; whether a Ctrl-C stopped them.

    The first Ctrl-C sets ``stopping`` (a task checks it before it begins anything new),
    cancels the tasks not begun, interrupts the executor's steps in flight and waits for
    the tasks going to end; a second kills the steps and raises ``KeyboardInterrupt``.
    """
    pool = ThreadPoolExecutor(max_workers=jobs)
    futures = [pool.submit(task) for task in tasks]
    killed = False
    try:
        for future in futures:
            future.result()
        return False
    except KeyboardInterrupt:
        try:  # a second Ctrl-C may come at any point of this
            stopping.set()
            for future in futures:
                future.cancel()
            if isinstance(executor, LocalExecutor):
                executor.interrupt()
            if on_interrupt is not None:
                on_interrupt(
                    "interrupted: nothing new is started; the steps in flight are stopping "
                    "(Ctrl-C again to end them at once)"
                )
            wait_all(futures)
        except KeyboardInterrupt:
            if isinstance(executor, LocalExecutor):
                executor.kill()
            killed = True
            raise
        return True
    finally:
        pool.shutdown(wait=not killed, cancel_futures=stopping.is_set())


#: how much of the end of a run's output ``last_line`` reads
_TAIL_BYTES = 64 * 1024


def last_line(run_dir: Path) -> str:
    """The last line of a run's output (what its ``sim tick`` said last, for a failed run's
    message): read from the end of ``OUTPUT_FILE`` only, without following a link; ``""``
    when there is none to read."""
    try:
        tail = safefs.read_tail(run_dir, OUTPUT_FILE, _TAIL_BYTES) or b""
    except (OSError, InputError):
        return ""
    lines = tail.decode("utf-8", errors="replace").splitlines()
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def failed_message(run_dir: Path, code: int) -> str:
    """Why a run's process failed: ``exit N`` (or ``killed by signal N``) and the last line
    it said (``last_line``)."""
    reason = f"killed by signal {-code}" if code < 0 else f"exit {code}"
    return f"{reason}: {last_line(run_dir)}"


def ray_executor(address: str | None = None) -> Executor:
    """Each run a Ray task (``pip install 'sim[ray]'``) on the cluster at ``address``.

    Without an address, Ray's own rule applies: ``RAY_ADDRESS`` if set, else a local
    instance is started. A task runs the run's ``sim tick`` on whichever node takes it, so
    on a cluster of several machines the runs' folder must be on a file system every node
    sees at the same path, with sim installed at the same path too.

    Raises:
        UserError: Ray is not installed; RunError: Ray cannot be started or reached.
    """
    from sim.engine.shard_processes import start_ray  # Ray only for --executor ray

    ray = start_ray(address)
    task = ray.remote(num_cpus=1, max_retries=0)(run_one)

    def execute(run_dir: Path, command: list[str], cwd: Path) -> int:
        return int(ray.get(task.remote(str(run_dir.resolve()), command, str(cwd))))

    return execute


__all__ = [
    "INTERRUPTED",
    "OUTPUT_FILE",
    "STOPPED",
    "Executor",
    "LocalExecutor",
    "RunOutcome",
    "Status",
    "SweepResult",
    "failed_message",
    "last_line",
    "ray_executor",
    "run_one",
    "run_tasks",
    "setting_flags",
    "tick_command",
    "trusted_flags",
]
