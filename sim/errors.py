"""User-facing errors: mistakes in world files, config or usage (exit code 2).

Kept apart from ``sim.llm.errors`` (runtime failures of model calls): a user error says which
file and field is wrong and what was expected, so the fix is obvious.
"""

from __future__ import annotations

from pathlib import Path


class SimError(Exception):
    """Base of errors a user must fix; the CLI prints the message and exits 2."""

    exit_code = 2


class InputError(SimError):
    """A file, field or value is not what was expected.

    Args:
        path: the file at fault (``None`` for command-line values).
        field: dotted path of the field inside it (``"state.location"``), if any.
        problem: what is wrong and what was expected.
    """

    def __init__(self, path: Path | str | None, field: str | None, problem: str) -> None:
        self.path = Path(path) if path is not None else None
        self.field = field
        self.problem = problem
        where = str(self.path) if self.path is not None else "command line"
        if field:
            where += f": field '{field}'"
        super().__init__(f"{where}: {problem}")


class WorldLockedError(SimError):
    """Another process is running this world (the run did not start: exit code 1)."""

    exit_code = 1


class RunFailed(Exception):
    """The run stopped without committing (budget, too many failures); exit code 1."""

    exit_code = 1


class TickInterrupted(Exception):
    """Ctrl-C or SIGTERM stopped a run: in-flight calls were cancelled.

    Args:
        world_dir: the world.
        tick: the tick that was running and did not commit (its completed calls are in its
            log, and the next ``sim tick`` resumes it), or ``None`` if the interrupt came
            after the last tick had committed.
        committed: whether the interrupted tick had already reached its commit point (its
            files are written into place by the next run).
    """

    exit_code = 130

    def __init__(
        self,
        world_dir: Path,
        tick: int | None,
        committed: bool = False,
        signal_number: int | None = None,
    ) -> None:
        self.world_dir = world_dir
        self.tick = tick
        # 128 + the signal, as a shell reports it: 130 for Ctrl-C (SIGINT), 143 for SIGTERM
        self.exit_code = 128 + (signal_number or 2)
        again = f"run `sim tick --world {world_dir}` again"
        if tick is None:
            message = "interrupted after the last tick committed; nothing was lost"
        elif committed:
            message = (
                f"interrupted: tick {tick} had committed; {again} to finish writing it and go on"
            )
        else:
            message = (
                f"interrupted: nothing was committed for tick {tick}; {again} to resume tick {tick}"
            )
        super().__init__(message)
