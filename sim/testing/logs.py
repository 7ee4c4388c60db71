"""Test support: a committed tick's log as a plain, summary-less JSONL file.

Tests that edit a log by hand (a damaged line, a changed price, a failed call) first turn
it back into what an older sim wrote: plain JSONL, with no summary, so every view reads
that log itself. The records are those ``read_log`` gives (derived fields restored, the
state snapshot as a JSON object, as a running tick writes it).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from sim.ticklog.format import PACKED, log_path, summary_rel
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


__all__ = ["plain_log", "plain_logs"]
