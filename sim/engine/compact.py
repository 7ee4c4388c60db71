"""``sim log --compact``: compress old logs, give them summaries, drop old call detail.

Without ``before``, every committed log still plain or gzip-compressed (written by an
older sim) is compressed in the current layout (Zstandard, state snapshot after the phase
records) and gets its summary, so the views stop reading it whole. With ``before=N``,
the logs of committed ticks before N also lose their ``call`` and ``instructions``
records: their summary (computed from the full log first), phase results, state snapshot
and commit stay, so ``sim log``, ``sim usage``, ``sim report``, ``sim rewind`` and
``sim fork`` still work, and ``sim replay`` of such a tick says why it cannot. A
``compacted`` record marks them. An interrupted (uncommitted) log is never touched.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from sim.errors import LogError
from sim.storage import Storage
from sim.ticklog.compression import COMPRESS_LEVEL, compress_log, write_compressed
from sim.ticklog.format import ZST, list_logs, log_path, packed_path
from sim.ticklog.reader import read_log
from sim.ticklog.records import CallRecord, CompactedRecord, InstructionsRecord, dump_record
from sim.ticklog.recovery import recover_logs
from sim.ticklog.summary import summarize, summary_path, write_summary


@dataclass
class Compacted:
    """What ``compact_history`` did."""

    compressed: list[int] = field(default_factory=list)
    summarized: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    calls_dropped: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    problems: list[str] = field(default_factory=list)


def compact_history(
    world_dir: Path, before: int | None = None, level: int = COMPRESS_LEVEL
) -> Compacted:
    """Compact a world's tick logs (see the module doc), under the world's lock.

    Raises:
        InputError: not a world folder.
        WorldBusy: another process runs the world.
    """
    done = Compacted()
    storage = Storage(world_dir)
    with storage.lock():
        storage.recover()
        recover_logs(world_dir, level)
        for tick, path in list_logs(world_dir):
            size = path.stat().st_size
            try:
                log = read_log(path)
            except LogError as exc:
                done.problems.append(str(exc))
                continue
            if not log.committed:
                continue  # an interrupted tick: `sim tick` resumes it from this log
            summary_file = summary_path(world_dir, tick)
            drop = before is not None and tick < before and log.compacted is None
            if drop or not os.path.lexists(summary_file):
                summary = summarize(log, places=True)
                if drop:
                    head = summary.head.model_copy(update={"compacted": True})
                    summary = type(summary)(head, summary.groups, summary.places)
                write_summary(world_dir, summary)
                done.summarized.append(tick)
            if drop:
                assert before is not None
                kept = [
                    dump_record(record)
                    for record in log.records
                    if not isinstance(record, CallRecord | InstructionsRecord)
                ]
                marker = CompactedRecord(calls=len(log.call_records), before=before)
                kept.append(dump_record(marker))
                target = packed_path(log_path(world_dir, tick))
                write_compressed(target, kept, level or COMPRESS_LEVEL)
                if target != path:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                done.dropped.append(tick)
                done.calls_dropped += marker.calls
                path = target
            elif not path.name.endswith(ZST) and level > 0:
                path = compress_log(path, level)
                done.compressed.append(tick)
            done.bytes_before += size
            done.bytes_after += path.stat().st_size
    return done


__all__ = ["Compacted", "compact_history"]
