"""``sim tick --executor ray``: the coordinator's port for its Ray actors (``ActorDoor``)
lets in only a connection whose first bytes are a hello with the run's token and the
number of one of its workers; any other is closed with nothing of it unpickled and nothing
sent to it. The port is on 127.0.0.1 unless a node of the cluster is another machine
(``listen_host``), and an actor on a node without the world's folder says so."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest

from sim.engine.shard_processes import ActorDoor, listen_host
from sim.engine.shard_worker import ShardActor
from sim.engine.wire import frame, hello
from sim.errors import RunError


class WritesAFile:
    """Unpickled, it writes ``path``: what a stranger's pickle could do instead."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (Path.write_text, (self.path, "unpickled"))


def test_only_a_hello_with_the_runs_token_and_a_workers_number_gets_in(tmp_path: Path) -> None:
    trap = tmp_path / "unpickled"

    async def main() -> list[tuple[int, int, str]]:
        door = ActorDoor([1, 2])
        server = await asyncio.start_server(door.connected, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        async def refused(data: bytes) -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(data)
            await writer.drain()
            if len(data) < 112:
                writer.write_eof()
            # closed with nothing sent (a reset, when some of its bytes were left unread)
            with contextlib.suppress(ConnectionResetError):
                assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()

        # what an actor's hello was before it carried a token: a pickle, here a harmful one
        await refused(frame(("hello", 1, WritesAFile(trap), "x" * 200)))
        await refused(hello(os.urandom(32), 1, 4242, "node-a"))  # another token
        await refused(hello(door.token, 3, 4242, "node-a"))  # not one of its workers
        await refused(door.token[:10])  # too short
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(hello(door.token, 2, 4242, "node-b"))
        await writer.drain()
        index, pid, node, _, theirs = await asyncio.wait_for(door.arrived.get(), 10)
        theirs.close()
        writer.close()
        server.close()
        return [(index, pid, node)] + [
            door.arrived.get_nowait()[:3] for _ in range(door.arrived.qsize())
        ]

    assert asyncio.run(main()) == [(2, 4242, "node-b")]
    assert not trap.exists()


def test_the_door_is_on_loopback_unless_a_node_is_another_machine() -> None:
    assert listen_host("10.0.0.5", ["10.0.0.5", "10.0.0.5"]) == "127.0.0.1"
    assert listen_host("10.0.0.5", ["127.0.0.1"]) == "127.0.0.1"
    assert listen_host("10.0.0.5", ["10.0.0.5", "10.0.0.9"]) == "10.0.0.5"


def test_an_actor_on_a_node_without_the_worlds_folder_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "elsewhere"
    with pytest.raises(RunError, match=r"the world folder .*elsewhere is not on node .*same path"):
        ShardActor().run("127.0.0.1", 9, 1, str(missing), b"t" * 32)


def test_a_connection_that_says_nothing_is_closed_after_the_hellos_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An actor says its hello as it connects; a connection that says nothing is not held
    for the whole of Ray's start (``HELLO_SECONDS``)."""
    import time

    import sim.engine.shard_processes as processes

    monkeypatch.setattr(processes, "HELLO_SECONDS", 0.3)

    async def main() -> float:
        door = ActorDoor([1])
        server = await asyncio.start_server(door.connected, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        server.close()
        assert door.arrived.empty()
        return time.monotonic() - started

    assert 0.2 < asyncio.run(main()) < 5
