"""Test support: a committed tick's log as a plain, summary-less JSONL file, and a log's
lines as two runs of its tick must agree on them.

Tests that edit a log by hand (a damaged line, a changed price, a failed call) first turn
it back into what an older sim wrote: plain JSONL, with no summary, so every view reads
that log itself. The records are those ``read_log`` gives (derived fields restored, the
state snapshot as a JSON object, as a running tick writes it).

Tests that run a tick twice (another hash seed, a warm worker) compare its logs and
summaries with ``comparable``: the fields that differ between two runs
(``sim.ticklog.format.RUN_FIELDS``) blanked, nothing else.
"""

from __future__ import annotations

import contextlib
import gzip
import sys
from pathlib import Path
from typing import Any

import orjson

if sys.version_info >= (3, 14):
    from compression import zstd
else:  # the standard library's module, for the Pythons before it
    from backports import zstd

from sim.ticklog.format import GZ, PACKED, RUN_FIELDS, ZST, log_path, summary_rel
from sim.ticklog.reader import read_log
from sim.ticklog.records import dump_record


def plain_log(world: Path, tick: int) -> Path:
    """Rewrite tick ``tick``'s log as plain JSONL without a summary; returns its path."""
    path = log_path(world, tick)
    log = read_log(path)
    records = log.written_records()
    path.write_bytes(b"".join(dump_record(record) + b"\n" for record in records))
    for suffix in PACKED:
        with contextlib.suppress(FileNotFoundError):
            path.with_name(path.name + suffix).unlink()
    with contextlib.suppress(FileNotFoundError):
        (world / summary_rel(tick)).unlink()
    return path


def plain_logs(world: Path) -> list[Path]:
    """``plain_log`` for every committed or interrupted log of the world, oldest first."""
    from sim.ticklog.format import list_logs

    return [plain_log(world, tick) for tick, _ in list_logs(world)]


def comparable(path: Path) -> bytes:
    """A tick log's or summary's JSONL lines, decompressed but as stored (a compressed
    log's layout line and order kept), with each field of ``RUN_FIELDS`` (a call's
    attempts' ``latency`` too) set to ``null``: what two runs of the tick from the same
    world, config and seed must write alike."""
    data = path.read_bytes()
    if path.name.endswith(ZST):
        data = zstd.decompress(data)
    elif path.name.endswith(GZ):
        data = gzip.decompress(data)
    lines = []
    for line in data.splitlines(keepends=True):
        record: Any = orjson.loads(line)
        kind = str(record.get("type")) if isinstance(record, dict) else ""
        if kind in RUN_FIELDS:  # the other lines stay byte for byte as written
            for name in RUN_FIELDS[kind]:
                if name in record:
                    record[name] = None
            attempts = record.get("attempts") if kind == "call" else None
            for attempt in attempts if isinstance(attempts, list) else ():
                if isinstance(attempt, dict) and "latency" in attempt:
                    attempt["latency"] = None
            line = orjson.dumps(record) + b"\n"
        lines.append(line)
    return b"".join(lines)


__all__ = ["comparable", "plain_log", "plain_logs"]
