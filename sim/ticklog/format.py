"""The tick log's format: names and paths, state snapshots, and the line of each record.

``.sim/log/tick-000004.jsonl`` is tick 4's log (the tick that takes ``world.json``'s
``tick`` from 3 to 4). Every line is one JSON object with a ``type``; the first is a
``header`` carrying the format version (a log is created with its header and state
already in it, by rename, so a crash never leaves a header-less log). Record types, in the
order a tick writes them:

- ``header``: tick, format version, the config used (no secrets), world seed;
- ``state_before``: the state at the start of the tick (entity files, ``world.json`` and
  the response store) as a JSON object of their text by path (``encoding: "object"``),
  with its digest;
- ``intervention``: each ``sim inject`` / ``sim set`` made since the last tick, which this
  tick applies (the pending file, ``.sim/interventions.json``, is part of the state);
- ``instructions``: an instructions text, once per distinct digest, before its first call;
- ``call``: one completed LLM call (see ``sim.engine.recorder``), appended as soon as it finishes;
- ``phase``: a phase's results and report (fallbacks, errors, warnings), at its end;
- ``resume``: the tick was interrupted and is being resumed (attempt number);
- ``policy``: a policy decision that was not "allow" (deny, defer, ask), before its call;
- ``usage``: totals for the tick;
- ``commit``: the digest of the state after the tick; present iff the tick committed;
- ``compacted``: ``sim log --compact`` dropped the tick's ``call`` and ``instructions``
  records (its summary keeps the numbers; the tick can no longer be replayed).

What can be rebuilt exactly is left out of a call's line, by the recorder as it writes it
(``LogWriter.append_call``) and by ``compress_log`` in a line written otherwise: a call's
final raw answer when it is byte for byte the compact JSON of its validated ``result``
(written as ``{"derived": "result"}`` and restored on read), and a call's ``digest`` when
its own fields give it (``{"derived": "request"}``). The state snapshot is a plain JSON
object, so the one compression covers it and one parse reads it; compression takes the
snapshot and the packed call lines as they are, unparsed. Earlier sims wrote the running
log's snapshot zlib-compressed and base64-encoded (``encoding: "zlib+base64"``) and stored
the object as JSON text in a string in compressed logs (``encoding: "json"``): both still
read.

Two runs of one tick from the same world, config and seed (the offline provider) write the
same records, byte for byte, but for ``RUN_FIELDS``: the clock's readings (a call's and
each attempt's ``latency``, the usage's ``elapsed``, the commit's ``committed_at``, the
summary's ``wall`` and ``committed_at``) and the header's and summary's ``scope``, a nonce
drawn for each run of the tick. The scope keys its calls' idempotency (``sim.llm.calls``),
so it must differ between runs: a copy, a fork or a rewound world that runs the tick again
asks a provider that honours idempotency keys afresh, rather than getting the first run's
answers from its cache; a resume keeps it.

Records are typed (``sim.ticklog.records``). A format change is a numbered migration in
``MIGRATIONS`` (records of version k are upgraded to k+1 on read, as JSON objects, before
they are validated).

The rest of the tick log builds on this module, one concept each: ``sim.ticklog.writer``
(a running tick's log), ``sim.ticklog.layout`` (the order of a compressed log's lines),
``sim.ticklog.compression`` (a committed log compressed), ``sim.ticklog.reader`` (the one
reader) and ``sim.ticklog.recovery`` (commit markers: logs completed after a crash).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from sim import safefs
from sim.errors import InputError
from sim.llm.calls import digest
from sim.ticklog.records import (
    CallRecord,
    HeaderRecord,
    LogRecord,
    StateRecord,
    dump_record,
    record_data,
)

FORMAT_VERSION = 1
LOG_DIR = ".sim/log"
STATE_KINDS = ("characters", "locations")
STORE_DIR = ".sim/responses"
#: interventions made between ticks, waiting for the next (``sim.interventions``): part of
#: the state a tick starts from, so a replay, rewind or fork sees them
INTERVENTIONS = ".sim/interventions.json"

#: one record as the JSON object of its line, before validation (what migrations work on)
RawRecord = dict[str, Any]
#: version k -> function upgrading one record of version k to version k + 1
MIGRATIONS: Mapping[int, Callable[[RawRecord], RawRecord]] = {}
#: per record type (``summary``: a tick summary's first line), the fields that differ
#: between two runs of one tick from the same world, config and seed (see the module doc);
#: a call's attempts' ``latency`` too
RUN_FIELDS: Mapping[str, tuple[str, ...]] = {
    "header": ("scope",),
    "call": ("latency",),
    "usage": ("elapsed",),
    "commit": ("committed_at",),
    "summary": ("scope", "wall", "committed_at"),
}
#: folders of ``LOG_DIR`` holding logs set aside by a tick started afresh (never deleted)
ABANDONED_DIR = "abandoned"


#: the suffix of a committed, compressed log (``tick-000004.jsonl.zst``: Zstandard)
ZST = ".zst"
#: the suffix of a log compressed by earlier sims (gzip): still read, no longer written
GZ = ".gz"
#: the suffixes of a compressed log, the one written first
PACKED = (ZST, GZ)
#: a committed log's final raw answer that is the compact JSON of its ``result``
DERIVED_RAW = {"derived": "result"}
#: a committed log's call digest that its own fields give (``request_digest``)
DERIVED_DIGEST = {"derived": "request"}
#: a tick log's name: ``tick-NNNNNN.jsonl``, ``.jsonl.gz``, or ``tick-NNNNNN.k.jsonl`` when
#: set aside into ``abandoned/``
LOG_NAME = re.compile(r"tick-([0-9]{6,})(?:\.[0-9]+)?\.jsonl(?:\.gz|\.zst)?")


# -- names and paths --------------------------------------------------------------------------


def log_rel(tick: int) -> str:
    return f"{LOG_DIR}/tick-{tick:06d}.jsonl"


def marker_rel(tick: int) -> str:
    return f"{LOG_DIR}/tick-{tick:06d}.commit.json"


def summary_rel(tick: int) -> str:
    """A committed tick's summary (``sim.ticklog.summary``), written after its commit."""
    return f"{LOG_DIR}/tick-{tick:06d}.summary.jsonl.gz"


def log_path(root: Path, tick: int) -> Path:
    """Where tick ``tick``'s log is written while it runs (the plain JSONL file)."""
    return root / log_rel(tick)


def packed_path(path: Path) -> Path:
    """The compressed form of a plain log's path (``.jsonl.zst``)."""
    return path.with_name(path.name + ZST)


def gz_path(path: Path) -> Path:
    """The path an earlier sim compressed a plain log to (``.jsonl.gz``)."""
    return path.with_name(path.name + GZ)


def log_file(root: Path, tick: int) -> Path:
    """Tick ``tick``'s log as it is on disk: compressed once committed, else plain.

    A missing log gives the plain path (whose absence the caller reports).
    """
    plain = log_path(root, tick)
    for suffix in PACKED:
        packed = plain.with_name(plain.name + suffix)
        if packed.is_file():
            return packed
    return plain


def existing_log(root: Path, tick: int) -> Path:
    """Tick ``tick``'s log on disk (``log_file``), or the one error ``sim log`` and ``sim
    replay`` give for a tick with no log (exit 2, as for any tick the user names wrong).

    Raises:
        InputError: there is no log for ``tick``.
    """
    path = log_file(root, tick)
    if not os.path.lexists(path):  # a link or a FIFO is there: the reader refuses it by name
        raise InputError(path, None, f"no log for tick {tick} (see `sim log --tick all`)")
    return path


def list_logs(root: Path, folder: str = LOG_DIR) -> list[tuple[int, Path]]:
    """(tick, path) of every tick log in ``folder`` of the world, oldest first.

    Logs set aside into ``abandoned/`` are named ``tick-NNNNNN.k.jsonl``; they are listed
    too when ``folder`` is that folder (their calls were sent: ``sim usage`` counts them).
    A log present both plain and compressed (a crash after compressing it) is listed once,
    compressed: a compressed log is only renamed into place complete (``.zst`` before an
    earlier sim's ``.gz``, which ``sim log --compact`` rewrote).
    """
    where = root / folder
    found: dict[str, tuple[int, int, Path]] = {}
    if not where.is_dir():
        return []
    for path in where.glob("tick-*.jsonl*"):
        match = LOG_NAME.fullmatch(path.name)
        if match is None:
            continue
        stem = path.name.removesuffix(ZST).removesuffix(GZ)
        rank = 0 if path.name.endswith(ZST) else 1 if path.name.endswith(GZ) else 2
        if stem in found and found[stem][1] <= rank:
            continue
        found[stem] = (int(match.group(1)), rank, path)
    return sorted((tick, path) for tick, _, path in found.values())


def prune(root: Path, current_tick: int, keep_ticks: int) -> list[Path]:
    """Delete the logs (and summaries) of ticks older than the last ``keep_ticks``
    (0 keeps all)."""
    if keep_ticks <= 0:
        return []
    removed: list[Path] = []
    for tick, path in list_logs(root):
        if tick <= current_tick - keep_ticks:
            path.unlink()
            removed.append(path)
            with contextlib.suppress(FileNotFoundError):
                (root / summary_rel(tick)).unlink()
    return removed


# -- state snapshots --------------------------------------------------------------------------


def read_state(root: Path) -> dict[str, bytes]:
    """The files that make a world's state, from disk: what a log snapshots and digests.

    Read as ``Storage`` reads a world (``sim.safefs``): a link, a FIFO or a device among
    them is refused by name, as is an entity file or ``world.json`` with another name (a
    hard link): a fork or an export copies the world's own files, never another's.

    A packed world's entity files are read from its pack, by the same paths.

    Raises:
        UnsafePath: one of them is not a regular file of the world's own.
        InputError: a packed world's pack is not one, or has entity folders beside it.
    """
    # here, not at the top: sim.pack's entity paths come from sim.world's models, which
    # `sim log` and `sim usage` do not load
    from sim.pack import both_forms, both_forms_problem, is_packed, read_pack

    files: dict[str, bytes] = {}
    with contextlib.suppress(FileNotFoundError):
        files["world.json"] = safefs.read_file(root, "world.json", one_link=True)
    if is_packed(root):  # the same files, from the pack (``sim.pack``)
        folders = both_forms(root)
        if folders:
            raise both_forms_problem(root, folders)
        files.update(read_pack(root, None))
    else:
        for kind in STATE_KINDS:
            files.update(_read_tree(root, kind, one_link=True, depth=0))
    files.update(read_store(root))
    pending = safefs.read_optional(root, INTERVENTIONS)  # no link on the way is followed
    if pending is not None:
        files[INTERVENTIONS] = pending
    return files


def read_store(root: Path) -> dict[str, bytes]:
    """The response store's files (``STORE_DIR/<chain>/<id>.json``), read as
    ``read_state`` reads a world's."""
    return _read_tree(root, STORE_DIR, one_link=False, depth=1)


def _read_tree(root: Path, rel: str, *, one_link: bool, depth: int) -> dict[str, bytes]:
    """``rel/.../<name>.json`` -> bytes under the folder ``root/rel`` and its sub-folders
    ``depth`` levels down, in path order, through the descriptor walk; ``{}`` without it."""
    out: dict[str, bytes] = {}
    with contextlib.ExitStack() as stack:
        try:
            dir_fd = stack.enter_context(safefs.open_dir(root, rel.split("/")))
        except FileNotFoundError:
            return out
        with os.scandir(dir_fd) as listing:  # the kind of each entry without a stat
            entries = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in listing)
        for name, is_dir in entries:
            if is_dir:
                if depth > 0:
                    out.update(
                        _read_tree(root, f"{rel}/{name}", one_link=one_link, depth=depth - 1)
                    )
            elif name.endswith(".json"):
                shown = root / rel / name
                out[f"{rel}/{name}"] = safefs.read_at(dir_fd, name, shown, one_link=one_link)
    return out
    return out


def is_state_file(rel: str) -> bool:
    if rel in ("world.json", INTERVENTIONS):
        return True
    if rel.startswith(STORE_DIR + "/"):
        return rel.endswith(".json")
    kind, _, name = rel.partition("/")
    return kind in STATE_KINDS and "/" not in name and name.endswith(".json")


def state_digest(files: Mapping[str, bytes]) -> str:
    """The digest of a state: its files by relative path (``digests_state`` of theirs)."""
    return digests_state({rel: digest(data) for rel, data in files.items()})


def digests_state(digests: Mapping[str, str]) -> str:
    """``state_digest`` of files given by each one's ``digest``."""
    hasher = bytearray()
    for rel in sorted(digests):
        hasher += rel.encode() + b"\x00" + digests[rel].encode() + b"\n"
    return digest(bytes(hasher))


def _state_payload(
    files: Mapping[str, bytes], names: Iterable[str] | None = None
) -> dict[str, str]:
    """Each file's text by its name, in ``names``' order (``None``: every file, sorted)."""
    return {rel: files[rel].decode("utf-8") for rel in (sorted(files) if names is None else names)}


def pack_state(
    files: Mapping[str, bytes], digest_: str | None = None, *, encoding: str = "object"
) -> StateRecord:
    """The ``state_before`` record of ``files`` (``digest_``: their ``state_digest``, when
    the caller has it already: hashing a big world's files costs), in the ``object``
    encoding a tick writes, or the ``zlib+base64`` one earlier sims wrote."""
    payload = _state_payload(files)
    found = state_digest(files) if digest_ is None else digest_
    if encoding == "object":
        return StateRecord(encoding="object", digest=found, files=len(files), data=payload)
    if encoding != "zlib+base64":
        raise ValueError(f"unknown state encoding {encoding!r}")
    data = base64.b64encode(zlib.compress(orjson.dumps(payload), 1)).decode("ascii")
    return StateRecord(encoding="zlib+base64", digest=found, files=len(files), data=data)


#: how many files' text ``state_line`` makes at a time
STATE_PIECE_FILES = 512


def state_line(files: Mapping[str, bytes], digest_: str) -> Iterator[bytes]:
    """``pack_state(files, digest_)``'s log line (without the newline), in pieces made as
    they are written: the same bytes as ``dump_record`` gives, ``STATE_PIECE_FILES`` files'
    text at a time, never a typed copy of a big world's text, nor its whole text decoded
    or dumped at once (at 100,000 characters 242 MB of text, then 280 MB of JSON: new
    memory, each page of which the kernel clears as it is first touched; 1.4 s of a
    2.8 s head on a machine whose page faults cost 11 µs, bench/RESULTS.md §12)."""
    head = {"type": "state_before", "encoding": "object", "digest": digest_, "files": len(files)}
    yield orjson.dumps(head)[:-1]
    yield b',"data":{'
    names = sorted(files)
    for start in range(0, len(names), STATE_PIECE_FILES):
        some = names[start : start + STATE_PIECE_FILES]
        if start:
            yield b","
        yield orjson.dumps(_state_payload(files, some))[1:-1]
    yield b"}}"


def log_line(record: LogRecord) -> bytes:
    """A record as a running tick's log holds it (without the newline): a call record
    packed (``packed_call_line``), any other as ``dump_record`` gives it."""
    if isinstance(record, CallRecord):
        return packed_call_line(record)
    return dump_record(record)


def unpack_state(record: StateRecord) -> dict[str, bytes]:
    """The files of a state snapshot: ``zlib+base64`` as a running tick writes it,
    ``object`` (path -> text, parsed with its line) once the log is compressed as a
    whole, ``json`` (that object as JSON text) in logs compressed by earlier sims."""
    data = record.data
    if record.encoding == "object" and isinstance(data, dict):
        return {rel: text.encode("utf-8") for rel, text in data.items()}
    if record.encoding == "zlib+base64" and isinstance(data, str):
        payload = orjson.loads(zlib.decompress(base64.b64decode(data)))
    elif record.encoding == "json" and isinstance(data, str):
        payload = orjson.loads(data)
    else:
        raise ValueError(f"unknown state encoding {record.encoding!r}")
    return {rel: text.encode("utf-8") for rel, text in payload.items()}


# -- records and their lines ------------------------------------------------------------------


def header(
    tick: int,
    config: Mapping[str, Any],
    seed: int,
    scope: str = "",
    phases: Mapping[str, Any] | None = None,
) -> HeaderRecord:
    """The first record. ``scope`` is a nonce for this run of the tick: it keys the
    idempotency of its calls and is kept by a resume (see ``sim.llm.calls``). ``phases``
    adds ``phases`` (the list run), ``templates`` and ``schemas`` (name -> digest)."""
    extra = {k: phases[k] for k in ("phases", "templates", "schemas") if phases and k in phases}
    return HeaderRecord(
        format=FORMAT_VERSION, tick=tick, seed=seed, config=dict(config), scope=scope, **extra
    )


def request_digest(call: RawRecord) -> str:
    """A call's digest from the fields it is taken over (``sim.llm.calls.CallIdentity``)."""
    history = call.get("history")
    fields = {
        "instructions": call.get("instructions_digest", ""),
        "input": call.get("input", ""),
        "schema": call.get("schema_digest", ""),
        "model": call.get("model", ""),
        "settings": call.get("settings", {}),
        "history": [
            *(history if isinstance(history, list) else []),
            call.get("previous_response_id"),
        ],
    }
    return digest(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS))


def restore_derived(call: RawRecord) -> None:
    """Put back what a compressed log left out because it can be rebuilt exactly: the
    final raw answer (``DERIVED_RAW``) and the request digest (``DERIVED_DIGEST``)."""
    if call.get("digest") == DERIVED_DIGEST:
        call["digest"] = request_digest(call)
    attempts = call.get("attempts")
    if not isinstance(attempts, list) or not attempts or not isinstance(attempts[-1], dict):
        return
    if attempts[-1].get("raw") == DERIVED_RAW:
        attempts[-1]["raw"] = orjson.dumps(call.get("result")).decode()


def pack_raw(call: RawRecord) -> bool:
    """Leave out the final raw answer of ``call`` (a call record's JSON object) when it is
    byte for byte the compact JSON of its ``result``; whether it did."""
    attempts = call.get("attempts")
    result = call.get("result")
    if attempts and isinstance(result, dict):
        raw = attempts[-1].get("raw")
        if isinstance(raw, str) and raw.encode() == orjson.dumps(result):
            attempts[-1]["raw"] = DERIVED_RAW
            return True
    return False


def packed_call_line(record: CallRecord, *, own_digest: bool = False) -> bytes:
    """A call record's line packed as a compressed log holds it (``compress_log`` then
    takes the line as it is, unparsed): its final raw answer and its digest left out when
    they can be rebuilt exactly.

    ``own_digest``: the caller made the record's digest from the very fields
    ``request_digest`` reads (the recorder: ``CallIdentity.digest``), so it is left out
    without computing it again.
    """
    data = record_data(record)
    pack_raw(data)
    found = data.get("digest")
    if isinstance(found, str) and (own_digest or found == request_digest(data)):
        data["digest"] = DERIVED_DIGEST
    return orjson.dumps(data)


__all__ = [
    "ABANDONED_DIR",
    "DERIVED_DIGEST",
    "DERIVED_RAW",
    "FORMAT_VERSION",
    "GZ",
    "INTERVENTIONS",
    "LOG_DIR",
    "LOG_NAME",
    "MIGRATIONS",
    "PACKED",
    "RUN_FIELDS",
    "STATE_KINDS",
    "STORE_DIR",
    "ZST",
    "RawRecord",
    "digests_state",
    "gz_path",
    "header",
    "is_state_file",
    "list_logs",
    "log_file",
    "log_line",
    "log_path",
    "log_rel",
    "marker_rel",
    "pack_raw",
    "pack_state",
    "packed_call_line",
    "packed_path",
    "prune",
    "read_state",
    "read_store",
    "request_digest",
    "restore_derived",
    "state_digest",
    "state_line",
    "summary_rel",
    "unpack_state",
]
