"""The user-facing error tree: user mistakes exit 2, run failures exit 1, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.errors import (
    InputError,
    InvalidWorld,
    LogError,
    RunError,
    RunFailed,
    SimError,
    TickInterrupted,
    UserError,
    WorldLockedError,
)


@pytest.mark.parametrize(
    ("error", "root", "code"),
    [
        (InputError(None, "--tick", "bad"), UserError, 2),
        (InvalidWorld([InputError("a.json", "x", "bad")]), UserError, 2),
        (LogError("unreadable"), RunError, 1),
        (RunFailed("too many failures"), RunError, 1),
        (WorldLockedError("busy"), RunError, 1),
        (TickInterrupted(Path("w"), 3), RunError, 130),
    ],
)
def test_every_user_facing_error_is_in_one_tree(error: SimError, root: type, code: int) -> None:
    assert isinstance(error, SimError) and isinstance(error, root)
    assert not isinstance(error, UserError if root is RunError else RunError)
    assert error.exit_code == code


def test_the_cli_maps_the_tree_to_exit_codes(tmp_path: Path) -> None:
    world = tmp_path / "w"
    log = world / ".sim" / "log" / "tick-000001.jsonl"
    log.parent.mkdir(parents=True)
    log.write_bytes(b'{"type": "header", "format": 1}\n{"type": "call", "phase": 3}\n')
    unreadable = CliRunner().invoke(main, ["log", "--world", str(world), "--tick", "1"])
    assert unreadable.exit_code == 1  # a run error: the log cannot be read
    assert "line 2: call record" in unreadable.output and "Traceback" not in unreadable.output
    mistake = CliRunner().invoke(main, ["log", "--world", str(world), "--tick", "x"])
    assert mistake.exit_code == 2 and "--tick" in mistake.output  # a user mistake
