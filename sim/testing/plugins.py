"""Plugins for tests and benchmarks: a tiny installed distribution written to a folder
(``write_distribution``: put the folder on ``sys.path`` or ``PYTHONPATH``, and its entry
points are found), and a package's phase to install with it (``CENSUS``)."""

from __future__ import annotations

from pathlib import Path

#: a package's phase (entry-point group ``sim.phases``, ``census = <module>:CensusPhase``):
#: one call per place, writing the place's ``state.crowd``; it does not say it is about
#: one place at a time (no ``per``), as docs/phases.md's example
CENSUS = '''
from pydantic import BaseModel, ConfigDict

from sim.llm.client import LLMRequest
from sim.llm.errors import LLMError


class Headcount(BaseModel):
    model_config = ConfigDict(extra="forbid", title="Headcount")
    crowd: str
    count: int


class CensusPhase:
    """Counts the people at each location; writes state.crowd."""

    name = "census"
    schema = Headcount

    def subjects(self, ctx):
        return list(ctx.world.locations.values())

    def requests(self, ctx, subjects):
        here = ctx.world.characters_at()
        return [
            LLMRequest(
                "Describe the crowd.",
                '{"place": "%s", "people": %d}'
                % (s["identity"]["name"], len(here.get(s["identity"]["id"], []))),
                Headcount,
                "census:" + s["identity"]["id"],
            )
            for s in subjects
        ]

    def apply(self, ctx, subjects, results):
        out = {}
        for s, r in zip(subjects, results):
            if isinstance(r, LLMError):
                continue
            s["state"]["crowd"] = r.crowd
            out[s["identity"]["id"]] = r.model_dump()
        return out
'''


def write_distribution(folder: Path, module: str, code: str, group: str, entries: str) -> None:
    """Module ``module`` (``code``) in ``folder``, with the metadata of an installed
    distribution offering ``entries`` (``name = module:attr`` lines) in entry-point group
    ``group``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(code, encoding="utf-8")
    info = folder / f"{module}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(f"[{group}]\n{entries}\n", encoding="utf-8")
