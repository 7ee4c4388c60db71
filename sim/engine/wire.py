"""The wire of a sharded tick (``sim.engine.shards``): messages between the coordinator and
its workers, as length-prefixed pickles on a socket.

A pydantic model class is pickled by name, or, for a schema made at run time
(``intention_schema`` with ``[actions]`` verbs, a declared phase's from its schema file), as
the call that makes it again. A big
frozenset many requests share goes once per connection (``Outbox(share=True)``, read back
with ``receive(reader, shared)``). An error that cannot cross between processes crosses as
its message (``portable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copyreg
import hmac
import io
import pickle
import struct
from typing import Any

from pydantic import BaseModel

from sim.errors import RunError, SimError, UserError
from sim.phases import schema
from sim.phases.intentions import MADE, schema_for_verbs

_LENGTH = struct.Struct("!Q")


def _model_class(cls: type[BaseModel]) -> Any:
    """A pydantic model class, pickled: by its name, or a schema made at run time
    (``intention_schema`` with ``[actions]`` verbs; a declared phase's answer, or a part
    of it, from its schema file) as the call that makes it again."""
    verbs = MADE.get(cls)  # type: ignore[arg-type]
    if verbs is not None:
        return schema_for_verbs, (verbs,)
    loaded = schema.MADE.get(cls)
    if loaded is not None:
        return schema.made_model, loaded
    return cls.__qualname__  # found in its module by name, as pickle does for a class


#: consulted only for classes whose metaclass is pydantic's (a ``reducer_override`` would
#: be called for every object pickled, in Python)
_DISPATCH = {**copyreg.dispatch_table, type(BaseModel): _model_class}


def dumps(message: Any) -> bytes:
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = _DISPATCH
    pickler.dump(message)
    return buffer.getvalue()


def frame(message: Any) -> bytes:
    data = dumps(message)
    return _LENGTH.pack(len(data)) + data


#: a frozenset this big that many requests share (a resolution's check holds every
#: place's and character's name) goes once per worker, not with each request
SHARED_SIZE = 64


class _Sharing(pickle.Pickler):
    """Pickles a big frozenset once: later messages name it (``persistent_id``)."""

    def __init__(self, buffer: io.BytesIO, outbox: Outbox) -> None:
        super().__init__(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        self.dispatch_table = _DISPATCH
        self.outbox = outbox

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is not frozenset or len(obj) < SHARED_SIZE:
            return None
        key = id(obj)
        if key not in self.outbox.shared:  # held: its id is not reused while we run
            self.outbox.shared[key] = obj
            self.outbox.queue(frame(("share", key, obj)))
        return key


class Outbox:
    """Messages to one socket, written together once per turn of the event loop: one
    system call for the answers (or calls) that became ready together, not one each.

    Args:
        share: send each big frozenset once (``_Sharing``); the other side reads with
            ``receive(reader, shared)``.
    """

    def __init__(self, writer: asyncio.StreamWriter, *, share: bool = False) -> None:
        self.writer = writer
        self.share = share
        self.shared: dict[int, frozenset[Any]] = {}
        self._frames: list[bytes] = []

    def queue(self, data: bytes) -> None:
        if not self._frames:
            asyncio.get_running_loop().call_soon(self.flush)
        self._frames.append(data)

    def post(self, message: Any) -> None:
        if not self.share:
            self.queue(frame(message))
            return
        buffer = io.BytesIO()
        _Sharing(buffer, self).dump(message)  # a "share" frame first, if it needs one
        data = buffer.getvalue()
        self.queue(_LENGTH.pack(len(data)) + data)

    def flush(self) -> None:
        if not self._frames:
            return
        data = b"".join(self._frames)
        self._frames.clear()
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):  # the other end went
            self.writer.write(data)


async def receive(reader: asyncio.StreamReader, shared: dict[int, Any] | None = None) -> Any:
    """The next message (``shared``: what a sharing ``Outbox`` sent once, kept here).

    Raises ``asyncio.IncompleteReadError`` when the other side is gone."""
    while True:
        (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
        data = await reader.readexactly(length)
        if shared is None:
            return pickle.loads(data)
        unpickler = pickle.Unpickler(io.BytesIO(data))
        unpickler.persistent_load = shared.__getitem__  # type: ignore[method-assign]
        message = unpickler.load()
        if message[0] != "share":
            return message
        shared[message[1]] = message[2]


#: a Ray actor's first bytes on its connection to the coordinator (``--executor ray``): the
#: run's token, its worker number, its pid and its node's name (UTF-8, padded). Plain
#: bytes, not a pickle: the coordinator's port takes connections from whoever reaches it,
#: and nothing is unpickled, or sent, before the token matches
#: the length of the token a run gives its actors
TOKEN_BYTES = 32
_HELLO = struct.Struct(f"!{TOKEN_BYTES}sQQ64s")


def hello(token: bytes, index: int, pid: int, node: str) -> bytes:
    """A Ray actor's hello (``_HELLO``)."""
    return _HELLO.pack(token, index, pid, node.encode("utf-8", "replace")[:64])


async def read_hello(reader: asyncio.StreamReader, token: bytes) -> tuple[int, int, str] | None:
    """The worker number, pid and node a connection's hello gives; ``None`` when it is not
    one (too short, or another token: nothing more of it is read)."""
    try:
        data = await reader.readexactly(_HELLO.size)
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        return None
    theirs, index, pid, node = _HELLO.unpack(data)
    if not hmac.compare_digest(theirs, token):
        return None
    return index, pid, node.rstrip(b"\0").decode("utf-8", "replace")


class ShardUserError(UserError):
    """Bad input a worker found (a template that does not render, say) whose own error
    does not cross between processes: its message, and a user error's exit code."""


def portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives a trip between processes; else, with its message, a
    ``ShardUserError`` for a user error, a ``RunError`` (with its exit code) for another."""
    try:
        pickle.loads(dumps(exc))
    except Exception:
        if isinstance(exc, UserError):
            return ShardUserError(str(exc))
        error = RunError(str(exc) if isinstance(exc, SimError) else f"{type(exc).__name__}: {exc}")
        if isinstance(exc, SimError):
            error.exit_code = exc.exit_code
        return error
    return exc
