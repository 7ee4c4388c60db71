"""Reading a world's history: usage and cost, chain-depth tuning, the HTML report, tidy
tables (``sim export``) and ``load``, the same tables as pandas DataFrames.

Owns: reading a world's history after the fact: what ``sim log`` and ``sim replay`` print,
usage and cost, chain-depth and memory tuning, the tidy tables and their exports, a sweep's
and a study's reports, the HTML report (``report/``).

May import: ``sim.config``, ``sim.engine`` (tuning runs ticks on scratch copies),
``sim.errors``, ``sim.gcpause``, ``sim.interrupts``, ``sim.interventions``,
``sim.interview``, ``sim.llm``, ``sim.providers``, ``sim.runs``, ``sim.safefs``,
``sim.sections``, ``sim.storage``, ``sim.study`` (``load_study`` verifies a study first),
``sim.terminal`` (what the log's view prints inside a line), ``sim.ticklog``,
``sim.world``. Only the command line imports it.

Next: a new view of the history is a module here; it reads the logs' summaries
(``sim.ticklog.summary``) where they hold what it needs, not whole logs.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.analysis.export import Frames, StudyFrames


def load(world: Path | str, first: int | None = None, last: int | None = None) -> Frames:
    """A world's history as pandas DataFrames (needs ``pip install 'sim[analysis]'``).

    ``load(world).characters`` has one row per tick and character; ``.interactions``,
    ``.locations`` and ``.calls`` as ``sim export`` writes them (docs/analysis.md).
    Imported on use, so ``sim.analysis`` stays light for the commands that do not need it.
    """
    from sim.analysis.export import load as load_frames

    return load_frames(world, first, last)


class UnverifiedStudyWarning(UserWarning):
    """``load_study(..., unverified=True)`` loaded a study that does not verify."""


def load_study(
    study: Path | str,
    first: int | None = None,
    last: int | None = None,
    *,
    unverified: bool = False,
) -> StudyFrames:
    """A study's tables (``sim study run --out DIR``) as pandas DataFrames: every run's
    ``characters``, ``interactions``, ``locations``, ``calls`` and ``surveys``, each row led
    by ``condition``, ``seed``, ``run`` and one column per factor (docs/analysis.md).

    As ``sim export --study``, a study that does not verify (``sim study verify``: a file
    changed since it was written, a run of another design) is refused, naming its
    problems, unless ``unverified=True``; then an ``UnverifiedStudyWarning`` names them.

    Raises:
        InputError: the study does not verify (and ``unverified`` is not set).
    """
    from sim.analysis.export import load_study as load_frames
    from sim.study.verify import require_verified

    problems = require_verified(Path(study), unverified, "unverified=True")
    if problems:
        warnings.warn(
            f"{study}: the study does not verify ({len(problems)} problems: "
            + "; ".join(problems[:5])
            + f"): see `sim study verify {study}`; loaded as asked (unverified=True)",
            UnverifiedStudyWarning,
            stacklevel=2,
        )
    return load_frames(study, first, last)


__all__ = ["UnverifiedStudyWarning", "load", "load_study"]
