"""Reading a world's history: usage and cost, chain-depth tuning, the HTML report, tidy
tables (``sim export``) and ``load``, the same tables as pandas DataFrames."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.analysis.export import Frames


def load(world: Path | str, first: int | None = None, last: int | None = None) -> Frames:
    """A world's history as pandas DataFrames (needs ``pip install 'sim[analysis]'``).

    ``load(world).characters`` has one row per tick and character; ``.interactions``,
    ``.locations`` and ``.calls`` as ``sim export`` writes them (docs/analysis.md).
    Imported on use, so ``sim.analysis`` stays light for the commands that do not need it.
    """
    from sim.analysis.export import load as load_frames

    return load_frames(world, first, last)


__all__ = ["load"]
