"""``--json``: one shape for machine-readable output (docs/cli-json.md).

A command run with ``--json`` prints one JSON document on stdout and nothing else there;
commands that stream (``sim tick`` with several ticks, ``sim log``, ``sim tune``) print
one object per line (JSON Lines). The documents of ``check``, ``tick``, ``replay``,
``report`` and ``export`` carry ``"command"`` and ``"ok"``. A command that fails still
prints a document, ``{"command": ..., "ok": false, "exit_code": N, "error": {"type": ...,
"message": ...}}``, after the human message on stderr, and exits with the same code as
without ``--json``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

from sim.cli.common import CLOSED_PIPE_EXIT, echo_json, errors

if TYPE_CHECKING:
    from sim.analysis.report import Written
    from sim.config import Config
    from sim.engine.replay import ReplayReport
    from sim.engine.runner import TickResult
    from sim.interview import Asked
    from sim.storage import Storage
    from sim.world import World

JSON_HELP = "Print one JSON document on stdout (docs/cli-json.md)."
JSON_LINES_HELP = "Print one JSON document per tick on stdout: JSON Lines (docs/cli-json.md)."
#: ``--json``: one JSON document on stdout (``emit``)
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help=JSON_HELP)


def emit(document: Mapping[str, Any]) -> None:
    """Print one document as one line of JSON."""
    echo_json(orjson.dumps(document).decode())


@contextmanager
def json_errors(command: str, enabled: bool, *, read_only: bool = False) -> Iterator[None]:
    """``sim.cli.common.errors`` (``read_only`` passed on), and with ``enabled`` a failure
    document on stdout too.

    The exit code and the message on stderr are what ``errors`` makes them; this only adds
    the document, so a script reading stdout always gets one.
    """
    caught: BaseException | None = None
    try:
        with errors(read_only=read_only):
            try:
                yield
            except BaseException as exc:
                caught = exc
                raise
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 1
        # a command that exits on its own (replay drifted) has printed its document
        if enabled and code not in (0, CLOSED_PIPE_EXIT) and not isinstance(caught, SystemExit):
            error = caught
            emit(
                {
                    "command": command,
                    "ok": False,
                    "exit_code": code,
                    "error": {
                        "type": type(error).__name__ if error is not None else "Exit",
                        "message": str(error) if error is not None else "",
                    },
                }
            )
        raise


def check_document(
    world_dir: Path, config: Config, storage: Storage, world: World
) -> dict[str, Any]:
    """``sim check --json``: the world, the provider, and what the next tick will do first."""
    from sim.ticklog.summary import check_history

    history = check_history(world_dir, world.tick)
    problems = history.problems
    interrupted = None
    if history.interrupted is not None:
        tick, logged = history.interrupted
        interrupted = {"tick": tick, "calls_logged": logged}
    return {
        "command": "check",
        "ok": True,
        "world": str(world_dir),
        "name": world.meta["name"],
        "tick": world.tick,
        "seed": world.seed,
        "characters": sorted(world.characters),
        "locations": sorted(world.locations),
        "provider": config.llm.provider,
        "pending_commit": storage.pending_journal(),
        "interrupted_tick": interrupted,
        "unreadable_logs": [str(p) for p in problems],
    }


def tick_document(result: TickResult) -> dict[str, Any]:
    """One line of ``sim tick --json``: what one committed tick did."""
    return {
        "command": "tick",
        "ok": True,
        **result.to_dict(),
        "failures_by_phase": {r.name: r.errors for r in result.reports if r.errors},
        "notes": result.notes,
        "resumed_calls": result.resumed_calls,
    }


def replay_document(report: ReplayReport) -> dict[str, Any]:
    """``sim replay --json``: per tick, whether it replayed identically and what drifted."""
    return {
        "command": "replay",
        "ok": report.identical,
        "identical": report.identical,
        "ticks": [
            {
                "tick": t.tick,
                "identical": t.identical,
                "state_matches": t.state_matches,
                "differing_files": t.differing_files,
                "edited_files": t.edited_files,
                "reordered_files": t.reordered_files,
                "served": t.served,
                "sent": t.sent,
                "embedding_requests": t.embeddings,
                "embeddings_match": t.embeddings_match,
                "drifts": [
                    {
                        "request_id": d.request_id,
                        "entity_key": d.entity_key,
                        "fields": list(d.fields),
                        "diff": d.diff,
                    }
                    for d in t.drifts
                ],
                "narratives": t.narratives,
                "recorded_narratives": t.recorded_narratives,
            }
            for t in report.ticks
        ],
    }


def ask_document(asked: Asked, prices: Mapping[str, Any]) -> dict[str, Any]:
    """``sim ask --json``: the question, and per character the answer, model, usage, cost."""
    return {
        "command": "ask",
        "ok": asked.failures == 0,
        "tick": asked.tick,
        "question": asked.question,
        "answers": [
            {
                "character": i.character,
                "name": asked.names.get(i.character, i.character),
                "answer": i.answer,
                "format": i.format,
                "value": i.value,
                "reason": i.reason,
                "model": i.model,
                "answered_by": i.answered_by,
                "usage": i.usage.model_dump(),
                "attempts": len(i.attempts),
                "cost_usd": i.cost(prices).value,
                "error_code": i.error_code,
                "error": i.error,
            }
            for i in asked.interviews
        ],
    }


def report_document(done: Written) -> dict[str, Any]:
    """``sim report --json``: the page written and the logs it could not read."""
    return {
        "command": "report",
        "ok": not done.problems,
        "path": str(done.path),
        "ticks": done.ticks,
        "logged": done.logged,
        "unreadable_logs": list(done.problems),
    }


__all__ = [
    "JSON_HELP",
    "JSON_LINES_HELP",
    "ask_document",
    "check_document",
    "emit",
    "json_errors",
    "replay_document",
    "report_document",
    "tick_document",
]
