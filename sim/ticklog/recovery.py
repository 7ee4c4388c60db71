"""Completing the logs of ticks that committed, after a crash.

The ``commit`` record is made atomic with the tick's commit by a small marker file
(``tick-000004.commit.json``) written through ``Storage.commit``'s journal; ``recover_logs``
copies a marker's record into its log and removes the marker, so after a
crash at any instant world files, response store and log agree.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pydantic import ValidationError

from sim.errors import LogError
from sim.safefs import UnsafePath, hard_link_problem
from sim.ticklog.compression import COMPRESS_LEVEL, compress_log
from sim.ticklog.format import LOG_DIR, LOG_NAME, PACKED, list_logs, log_path
from sim.ticklog.reader import read_log, read_regular
from sim.ticklog.records import CommitRecord
from sim.ticklog.writer import LogWriter

logger = logging.getLogger(__name__)


def recover_logs(root: Path, level: int = COMPRESS_LEVEL) -> list[int]:
    """Complete the logs of ticks that committed: copy each marker's record into its log,
    and compress what a crash left plain (``level`` 0 leaves plain logs plain).

    Run under the world lock after ``Storage.recover()``. Returns the ticks completed.
    """
    folder = root / LOG_DIR
    done: list[int] = []
    if not folder.is_dir():
        return done
    for marker in sorted(folder.glob("tick-*.commit.json")):
        try:
            record = CommitRecord.model_validate_json(read_regular(marker))
        except (OSError, ValidationError) as exc:
            # the world files of that tick committed; only the log's copy of the record is
            # lost, so the marker is set aside (never applied, never a traceback)
            logger.warning("%s: unreadable commit marker set aside (%s)", marker, exc)
            os.replace(marker, marker.with_name(marker.name + ".bad"))
            continue
        path = log_path(root, record.tick)
        if path.is_file() and (links := os.lstat(path).st_nlink) > 1:
            # completing it appends in place: never through another name
            raise UnsafePath(path, None, hard_link_problem(links))
        if path.is_file():
            try:
                complete = read_log(path).commit is not None
            except LogError as exc:  # still completed; `sim log` and `sim check` report it
                logger.warning("completing an unreadable tick log: %s", exc)
                complete = False
            if not complete:
                writer = LogWriter(path)
                writer.append(record)
                writer.close()
                done.append(record.tick)
        marker.unlink()
    _finish_compression(root, level)
    return done


def _finish_compression(root: Path, level: int) -> None:
    """What a crash between a commit and the end of ``TickRecorder.committed`` left undone:
    a plain log beside its complete ``.gz`` is removed, and the newest log, if plain and
    committed, gets its summary (rebuilt from it: one left by an earlier run of that tick
    number may be stale) and is compressed. Older plain logs (an older sim's) are left as
    they are: ``sim log --compact`` converts them."""
    folder = root / LOG_DIR
    plain: list[tuple[int, Path]] = []
    for path in folder.glob("tick-*.jsonl"):
        match = LOG_NAME.fullmatch(path.name)
        if match is None or path.is_symlink():
            continue
        if any(path.with_name(path.name + suffix).is_file() for suffix in PACKED):
            path.unlink()
        else:
            plain.append((int(match.group(1)), path))
    listed = list_logs(root)
    if not plain or not listed or max(plain)[1] != listed[-1][1]:
        return
    tick, path = max(plain)
    from sim.ticklog.summary import summarize, write_summary  # only for a log left plain

    try:
        log = read_log(path)
        if not log.committed:
            return
        write_summary(root, summarize(log, places=True))
        if level > 0:
            compress_log(path, level)
    except (LogError, OSError) as exc:  # left plain; `sim log` and `sim check` report it
        logger.warning("tick log %d left as it is: %s", tick, exc)


__all__ = [
    "recover_logs",
]
