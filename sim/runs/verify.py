"""Whether a run's folder still holds what its runs wrote: its world's state against what
its last committed tick's log says the commit left, and its answers against the digests
``sim ask`` recorded beside them (``sim.interview``). ``sim sweep verify`` checks a
folder of runs with it; ``sim study verify`` (``sim.study.verify``) every arm of a study.
``sim sweep report`` refuses runs that do not verify unless told ``--unverified``
(``require_verified``; ``refuse_unverified`` is the refusal the study's commands share).

A problem is a sentence naming the file: an edited or missing file is found, not repaired.
"""

from __future__ import annotations

import os
from pathlib import Path

from sim import safefs
from sim.errors import InputError, LogError
from sim.interview import INTERVIEWS, answer_digests, line_digest
from sim.runs.fork import RUN_FILE, RunRecord, current_tick, read_record, require_run_folders
from sim.runs.inputs import changed
from sim.ticklog.format import INTERVENTIONS, log_file, read_state, state_digest
from sim.ticklog.reader import read_log


def _state_problems(run_dir: Path, tick: int, start: int) -> list[str]:
    """The world's state files against what tick ``tick``'s log says its commit left."""
    if tick <= 0 or (tick == start and not os.path.lexists(log_file(run_dir, tick))):
        return []  # nothing was run (a fork of a world that never ticked)
    path = log_file(run_dir, tick)
    try:
        log = read_log(path, calls=False, state=False)
    except LogError as exc:
        return [f"{run_dir}: world.json says tick {tick}, and its log cannot be read: {exc}"]
    if log.commit is None:
        return [f"{path}: tick {tick} never committed, and world.json says it did"]
    try:
        files = read_state(run_dir)
    except (OSError, InputError) as exc:
        return [f"{run_dir}: cannot read its state: {exc}"]
    files.pop(INTERVENTIONS, None)  # queued after the commit: the next tick's input
    if state_digest(files) == log.commit.state_after:
        return []
    edited = _replayed_edits(run_dir, tick)
    if edited is None:  # not replayable: the files written after the tick's log was
        logged = path.stat().st_mtime_ns
        edited = sorted(rel for rel in files if (run_dir / rel).lstat().st_mtime_ns > logged)
    which = f" (edited since: {', '.join(edited)})" if edited else ""
    return [
        f"{run_dir}: its world's files differ from what tick {tick} committed (the state "
        f"digest in {path.name}){which}"
    ]


def _replayed_edits(run_dir: Path, tick: int) -> list[str] | None:
    """The files that differ from what tick ``tick`` wrote, by replaying it from its log
    in a scratch copy (``sim.engine.replay``: no request is sent) with the config it logged;
    ``None`` when it cannot be replayed so (compacted, no logged config, drifted)."""
    from sim.config import Config
    from sim.engine.replay import replay

    try:
        config = Config.model_validate(read_log(log_file(run_dir, tick)).header.config)
        report = replay(run_dir, tick, config=config)
    except Exception:  # any reason it cannot replay: the files are named another way
        return None
    replayed = report.ticks[0]
    return replayed.edited_files if replayed.state_matches and not replayed.drifts else None


def _answer_problems(run_dir: Path) -> list[str]:
    """``.sim/interviews.jsonl`` against the digest of each line ``sim ask`` recorded."""
    path = run_dir / INTERVIEWS
    try:
        raw = safefs.read_optional(run_dir, INTERVIEWS)
        recorded = answer_digests(run_dir)
    except (OSError, InputError) as exc:
        return [f"{path}: cannot read: {exc}"]
    lines = [] if raw is None else [ln for ln in raw.splitlines() if ln.strip()]
    if recorded is None:
        return [f"{path}: no record of its answers' digests"] if lines else []
    problems: list[str] = []
    for number, (line, want) in enumerate(zip(lines, recorded, strict=False), 1):
        if line_digest(line) != want:
            problems.append(f"{path}: line {number} differs from the answer recorded")
    if len(lines) < len(recorded):
        problems.append(
            f"{path}: {len(recorded) - len(lines)} of the {len(recorded)} answers recorded "
            "are missing"
        )
    elif len(lines) > len(recorded):
        problems.append(f"{path}: {len(lines) - len(recorded)} lines that no answer recorded")
    return problems


#: What ``sim sweep verify`` of a folder of folders of runs says to do with each.
VERIFY_EACH = "verify each (sim sweep verify {folder})"

#: What ``sim sweep verify`` and the refusal of ``require_verified`` call runs with problems.
UNVERIFIED_RUNS = "the runs do not verify"


def verify_run(run_dir: Path) -> tuple[RunRecord | None, list[str]]:
    """A run folder's record and the problems found in it (none: it verifies)."""
    try:
        record = read_record(run_dir)
        tick = current_tick(run_dir)
    except InputError as exc:
        return None, [str(exc)]
    return record, _state_problems(run_dir, tick, record.start_tick) + _answer_problems(run_dir)


def verify_runs(out: Path, each: str = VERIFY_EACH) -> list[str]:
    """Every run of a sweep's folder (``sim sweep verify``): each verified, and all made
    from the same inputs (``sim.runs.inputs``).

    Raises:
        InputError: ``out`` holds no runs (``each``: what to do with each of its
            sub-folders that holds runs, as ``require_run_folders`` says it).
    """
    folders = require_run_folders(out, each)
    problems: list[str] = []
    first: RunRecord | None = None
    for run_dir in folders:
        record, found = verify_run(run_dir)
        problems += found
        if record is None:
            continue
        if first is None:
            first = record
        elif record.inputs is not None and first.inputs is not None:
            differ = changed(first.inputs, record.inputs)
            if differ:
                problems.append(
                    f"{run_dir / RUN_FILE}: made from other inputs than {first.name} "
                    f"({'; '.join(differ)})"
                )
        if record.inputs is None:
            problems.append(f"{run_dir / RUN_FILE}: records no digests of its inputs")
    return problems


def refuse_unverified(
    out: Path,
    problems: list[str],
    verdict: str,
    command: str,
    unverified: bool,
    flag: str = "--unverified",
) -> list[str]:
    """``problems``, the verification of ``out`` by ``command`` (``sim sweep verify``,
    ``sim study verify``); refused unless ``unverified`` (``flag``: how it is set).

    Raises:
        InputError: there are problems and ``unverified`` is not set: ``verdict`` ("the
            runs do not verify") and the first five problems named.
    """
    if problems and not unverified:
        shown = "; ".join(problems[:5]) + (
            f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
        )
        raise InputError(
            out,
            None,
            f"{verdict} ({shown}): see `{command} {out}`, or pass {flag} to go on "
            "anyway (the output then says so)",
        )
    return problems


def require_verified(out: Path, unverified: bool, each: str = VERIFY_EACH) -> list[str]:
    """The problems of the sweep's runs in ``out`` (``verify_runs``); refused unless
    ``unverified``.

    Raises:
        InputError: ``out`` holds no runs, or they do not verify and ``unverified`` is not
            set (the problems named).
    """
    problems = verify_runs(out, each)
    return refuse_unverified(out, problems, UNVERIFIED_RUNS, "sim sweep verify", unverified)


__all__ = [
    "UNVERIFIED_RUNS",
    "VERIFY_EACH",
    "refuse_unverified",
    "require_verified",
    "verify_run",
    "verify_runs",
]
