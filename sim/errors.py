"""The user-facing errors of sim, in one tree: what the CLI prints and its exit code.

```
SimError                   a message for the user and an exit code (the CLI prints it)
├── UserError              a mistake the user fixes: world files, config, command line (2)
│   ├── InputError         path, field, problem: which file and field, what was expected
│   └── InvalidWorld       every problem found in a world folder at once (InputErrors)
└── RunError               the run could not be done as asked; nothing was committed (1)
    ├── RunFailed          too many failed calls, a budget cap: re-run `sim tick` to resume
    ├── WorldLockedError   another process is running this world
    ├── LogError           a tick log that cannot be read: file, line, field
    └── TickInterrupted    Ctrl-C: in-flight calls cancelled, tick resumable (130)
```

Failures of model calls are a separate tree, ``sim.llm.errors.LLMError`` (adapters raise
only those; a model calling an undeclared tool is ``sim.phases.intention_tools
.UnknownToolError``, an ``LLMError``, because the model erred, not the user). The CLI maps
``LLMConfigurationError`` (a missing key, an unknown provider) to 2 like a ``UserError``,
and other ``LLMError`` that stop a run to 1 (``sim.cli.common.errors``).

Kept apart as pydantic-ai keeps ``UserError`` from ``AgentRunError``: a user error says
which file and field is wrong and what was expected, so the fix is obvious; a run error
says what happened and how to go on.
"""

from __future__ import annotations

from pathlib import Path


class SimError(Exception):
    """Base of every error the CLI shows as a message (never a traceback)."""

    exit_code = 2


class UserError(SimError):
    """A mistake the user fixes (world files, config, command line): exit code 2."""

    exit_code = 2


class RunError(SimError):
    """The run could not be done as asked, and nothing was committed: exit code 1."""

    exit_code = 1


class InputError(UserError):
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


class InvalidWorld(UserError):
    """Every problem found in a world folder, one per line."""

    def __init__(self, problems: list[InputError]) -> None:
        self.problems = problems
        lines = [str(p) for p in problems]
        head = "world is invalid" + (f" ({len(lines)} problems)" if len(lines) > 1 else "")
        super().__init__(head + ":\n  " + "\n  ".join(lines))


class WorldLockedError(RunError):
    """Another process is running this world (the run did not start)."""


class RunFailed(RunError):
    """The run stopped without committing (budget, too many failures)."""


class LogError(RunError):
    """A tick log the engine cannot read (named, with the line and the reason)."""


class TickInterrupted(RunError):
    """Ctrl-C stopped a run: in-flight calls were cancelled.

    Args:
        world_dir: the world.
        tick: the tick that was running and did not commit (its completed calls are in its
            log, and the next ``sim tick`` resumes it), or ``None`` if the interrupt came
            after the last tick had committed.
        committed: whether the interrupted tick had already reached its commit point (its
            files are written into place by the next run).
    """

    exit_code = 130

    def __init__(self, world_dir: Path, tick: int | None, committed: bool = False) -> None:
        self.world_dir = world_dir
        self.tick = tick
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


__all__ = [
    "InputError",
    "InvalidWorld",
    "LogError",
    "RunError",
    "RunFailed",
    "SimError",
    "TickInterrupted",
    "UserError",
    "WorldLockedError",
]
