"""Where a sharded tick's workers run (``sim tick --workers N``): processes on this machine,
or Ray actors (``--executor ray``), each connected to the coordinator by a socket.

``start_local`` starts ``python -m sim.engine.shard_worker`` processes, each given its end
of a socket pair. ``start_actors`` starts one Ray actor per worker
(``sim.engine.shard_worker.ShardActor``); each connects back to a port the coordinator
opens (``listen_host``), where ``ActorDoor`` lets in only a connection that says the run's
token and the number of one of its workers first. Either way each worker comes back as a
``Started``: its number, its process (``LocalProcess``, ``RayActor``: how it is described,
how it ended, how it is stopped) and its socket. ``sim.engine.shards.Shards`` holds them
for the run. ``auto_workers`` is how many ``--workers auto`` means here: the cores this
process may use.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sim.engine.wire import TOKEN_BYTES, read_hello
from sim.errors import RunError, SimError, UserError


class WorkerDied(RunError):
    """A shard's worker process ended in the middle of a tick: nothing is committed."""


class LocalProcess:
    """A worker process on this machine (``python -m sim.engine.shard_worker``)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    def describe(self) -> str:
        return f"pid {self.process.pid}"

    async def ended(self) -> str:
        """Wait for it to end; how it ended."""
        return f"exit status {await asyncio.to_thread(self.process.wait)}"

    async def stop(self, now: bool = False) -> None:
        """Let it end (its socket is closed), or end it (``now``: at once)."""
        if self.process.poll() is None:
            try:
                await asyncio.wait_for(asyncio.to_thread(self.process.wait), 0 if now else 5)
            except TimeoutError:
                self.process.kill()
                await asyncio.to_thread(self.process.wait)


class RayActor:
    """A worker run by a Ray actor (``--executor ray``), connected back to us."""

    def __init__(self, ray: Any, actor: Any, ref: Any) -> None:
        self.ray = ray
        self.actor = actor
        self.ref = ref
        #: where it runs, once it said (its hello: pid and node)
        self.where = ""

    def describe(self) -> str:
        return f"Ray actor{self.where}"

    async def ended(self) -> str:
        try:
            await asyncio.wait_for(asyncio.wrap_future(self.ref.future()), 30)
        except TimeoutError:
            return "its socket closed"
        except Exception as exc:  # Ray's errors: the actor died, its node was lost
            cause = getattr(exc, "cause", None)  # what the actor's method raised, if it did
            if isinstance(cause, SimError):
                return str(cause)
            return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return "it returned"

    async def stop(self, now: bool = False) -> None:
        with contextlib.suppress(Exception):
            self.ray.kill(self.actor)


#: a worker started and connected: its number (1 for the first worker; the coordinator
#: runs shard 0), its process, and its socket's two ends
Started = tuple[int, LocalProcess | RayActor, asyncio.StreamReader, asyncio.StreamWriter]
#: how much a worker's socket reads at once (a message of its part may be many MB)
READ_LIMIT = 2**26


async def start_local(root: Path, count: int) -> list[Started]:
    """``count`` worker processes on this machine, each given its end of a socket pair.
    On a failure, those started are ended before it is raised."""
    started: list[Started] = []
    try:
        for index in range(1, count + 1):
            ours, theirs = socket.socketpair()
            try:
                process = subprocess.Popen(
                    # the world's folder named too: `ps` shows whose worker it is
                    [
                        sys.executable,
                        "-m",
                        "sim.engine.shard_worker",
                        str(theirs.fileno()),
                        str(root),
                    ],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # Ctrl-C reaches the coordinator, which ends them
                )
            finally:
                theirs.close()
            reader, writer = await asyncio.open_connection(sock=ours, limit=READ_LIMIT)
            started.append((index, LocalProcess(process), reader, writer))
    except BaseException:
        for _, worker, _, writer in started:
            writer.close()
            await worker.stop(now=True)
        raise
    return started


def start_ray(address: str | None) -> Any:
    """Ray, started or reached (``address``; else ``RAY_ADDRESS``, else a local instance).

    Raises:
        UserError: Ray is not installed; RunError: Ray cannot be started or reached.
    """
    try:
        ray: Any = importlib.import_module("ray")
    except ImportError:
        raise UserError(
            "--executor ray needs Ray, from the optional 'ray' extra: pip install 'sim[ray]'"
        ) from None
    if not ray.is_initialized():
        try:
            ray.init(address=address, log_to_driver=False)
        except Exception as exc:  # Ray's errors are many (connection, version, resources)
            where = address or "a local instance"
            raise RunError(f"--executor ray: cannot start or reach Ray ({where}): {exc}") from None
    return ray


#: how long Ray may take to place the actors and have them connect (a cluster without a
#: free CPU for each would otherwise keep the run waiting for ever)
RAY_START_SECONDS = 120.0
#: how long a connection to the actors' port may take to say its hello (an actor sends it
#: as soon as it has connected): one that says nothing is closed then
HELLO_SECONDS = 10.0


class ActorDoor:
    """The coordinator's listening port for its Ray actors (``--executor ray``): a
    connection whose first bytes are a hello with the run's ``token`` and the number of
    one of the ``expected`` workers arrives (``arrived``: number, pid, node, reader,
    writer); any other is closed, nothing of it unpickled and nothing sent to it (the
    port takes connections from whoever reaches it: another user of this machine, or of
    the network when the cluster's nodes are elsewhere)."""

    def __init__(self, expected: Iterable[int]) -> None:
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self.expected = frozenset(expected)
        self.arrived: asyncio.Queue[
            tuple[int, int, str, asyncio.StreamReader, asyncio.StreamWriter]
        ] = asyncio.Queue()

    async def connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            said = await asyncio.wait_for(read_hello(reader, self.token), HELLO_SECONDS)
        except TimeoutError:
            said = None
        if said is None or said[0] not in self.expected:  # not one of ours
            writer.close()
            return
        self.arrived.put_nowait((*said, reader, writer))


def listen_host(own: str, nodes: Sequence[str]) -> str:
    """Where the coordinator listens for its Ray actors: on 127.0.0.1 when every node of
    the cluster is this machine (``own``, the address Ray knows it by), else on ``own``,
    which the other nodes reach (an actor proves it is one of the run's with its token,
    ``wire.read_hello``, before anything is read or sent)."""
    return "127.0.0.1" if set(nodes) <= {own, "127.0.0.1"} else own


async def start_actors(root: Path, count: int, address: str | None) -> list[Started]:
    """One Ray actor per worker (``sim.engine.shard_worker.ShardActor``), each connecting
    back to this process (``listen_host``) with the run's token, saying which worker it is
    (``wire.hello``); a connection without the token is closed unread. The port is closed
    once every actor is connected, or the start fails (then the actors are ended).

    Raises:
        WorkerDied: an actor ended before it connected, or did not connect within
            ``RAY_START_SECONDS``.
    """
    ray = start_ray(address)
    from sim.engine.shard_worker import ShardActor

    handles: dict[int, RayActor] = {}
    door = ActorDoor(range(1, count + 1))
    own = ray.util.get_node_ip_address()
    host = listen_host(own, [n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")])
    server = await asyncio.start_server(door.connected, host, 0, limit=READ_LIMIT)
    port = server.sockets[0].getsockname()[1]
    remote = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(ShardActor)
    for index in range(1, count + 1):
        actor = remote.remote()
        handles[index] = RayActor(
            ray, actor, actor.run.remote(host, port, index, str(root), door.token)
        )
    started: list[Started] = []
    deadline = asyncio.get_running_loop().time() + RAY_START_SECONDS
    try:
        while len(started) < count:
            waiting = set(handles) - {index for index, *_ in started}
            if asyncio.get_running_loop().time() > deadline:
                late = min(waiting)
                raise WorkerDied(
                    f"worker {late + 1} ({handles[late].describe()}) did not connect within "
                    f"{RAY_START_SECONDS:.0f} s: does the Ray cluster have a free CPU for "
                    "each worker, and can its nodes reach this machine?"
                )
            failed = [i for i in sorted(waiting) if handles[i].ref.future().done()]
            if failed:
                handle = handles[failed[0]]
                raise WorkerDied(
                    f"worker {failed[0] + 1} ({handle.describe()}) ended before it "
                    f"connected: {await handle.ended()}"
                )
            try:
                index, pid, node, reader, writer = await asyncio.wait_for(door.arrived.get(), 0.5)
            except TimeoutError:
                continue
            if index in waiting:
                handles[index].where = f", pid {pid} on {node}"
                started.append((index, handles[index], reader, writer))
            else:  # a second connection with its number
                writer.close()
    except BaseException:
        for handle in handles.values():
            await handle.stop()
        raise
    finally:
        server.close()  # every actor is connected, or the run stops: no one else joins
    return sorted(started, key=lambda worker: worker[0])


def auto_workers() -> int:
    """``--workers auto``: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
