"""Phase 3's rules: what a resolution may not do to the world is ignored and reported.

A character moves only along a connection of the location it started the tick in; an
outcome for a character who is absent or unknown is ignored; a second outcome for one
character is ignored. Each ignored outcome is a warning in the phase report (what
``sim tick`` prints as ``ignored: ...``), and the world is otherwise as if it was not there.
"""

from __future__ import annotations

import copy
from pathlib import Path

from conftest import copy_demo

from sim.config import load_config
from sim.llm.store import ResponseStore
from sim.phases import apply
from sim.phases.base import TickContext
from sim.phases.intentions import Intention
from sim.phases.resolution import Outcome, Resolution
from sim.storage import Storage
from sim.testing.adapters import MockAdapter
from sim.ticklog.format import STORE_DIR

WAIT = Intention(action="wait", target=None, content="", reasoning="")


def outcome(cid: str, text: str, moved_to: str | None = None, **changes: object) -> Outcome:
    fields: dict[str, object] = {"mood": None, "gained": [], "lost": []}
    fields.update(changes)
    return Outcome(character_id=cid, outcome=text, moved_to=moved_to, **fields)  # type: ignore[arg-type]


async def apply_at_quay(tmp_path: Path, *outcomes: Outcome) -> tuple[TickContext, dict]:
    """Run phase 3 on the demo world with these outcomes at the quay (Ada and Pell are
    there; its connections are market-steps, drowned-bell and sea-caves)."""
    world_dir = copy_demo(tmp_path / "w")
    world = Storage(world_dir).load()
    before = copy.deepcopy(world.characters)
    ctx = TickContext(
        world,
        load_config(cwd=world_dir),
        MockAdapter(),
        ResponseStore(world_dir, STORE_DIR),
        tick=1,
    )
    for cid, char in world.characters.items():
        ctx.occupancy.setdefault(char["state"]["location"], []).append(cid)
        ctx.intentions[cid] = WAIT
    assert sorted(ctx.occupancy["quay"]) == ["ada", "pell"]
    ctx.resolutions["quay"] = Resolution(outcomes=list(outcomes), location_update=None)
    await apply.run(ctx)
    return ctx, before


def last_memory(ctx: TickContext, cid: str) -> str:
    return str(ctx.world.characters[cid]["memory"]["cells"][-1]["text"])


async def test_a_move_along_a_connection_is_applied(tmp_path: Path) -> None:
    ctx, _ = await apply_at_quay(tmp_path, outcome("ada", "Ada walks up.", "market-steps"))
    assert ctx.world.characters["ada"]["state"]["location"] == "market-steps"
    assert ctx.reports[-1].warnings == []


async def test_a_move_not_along_a_connection_is_ignored_and_reported(tmp_path: Path) -> None:
    ctx, _ = await apply_at_quay(
        tmp_path, outcome("ada", "Ada flies to the lighthouse.", "lighthouse", mood="elated")
    )
    ada = ctx.world.characters["ada"]
    assert ada["state"]["location"] == "quay"  # the lighthouse is not connected to the quay
    assert ctx.reports[-1].warnings == ["quay: move of ada to 'lighthouse' ignored: not connected"]
    # the rest of the outcome still stands: only the impossible move is dropped
    assert ada["state"]["mood"] == "elated"
    assert last_memory(ctx, "ada") == "Ada flies to the lighthouse."


async def test_an_outcome_for_an_absent_or_unknown_character_is_ignored_and_reported(
    tmp_path: Path,
) -> None:
    ctx, before = await apply_at_quay(
        tmp_path,
        outcome("nessa", "Nessa appears at the quay.", "market-steps", mood="lost"),
        outcome("ghost", "A ghost rises.", "sea-caves"),
        outcome("pell", "Pell mends a net."),
    )
    assert ctx.reports[-1].warnings == [
        "quay: outcome for 'nessa' ignored: not present",
        "quay: outcome for 'ghost' ignored: unknown character",
    ]
    nessa = ctx.world.characters["nessa"]  # she is at the lighthouse, untouched
    assert nessa["state"] == before["nessa"]["state"]
    assert "appears at the quay" not in last_memory(ctx, "nessa")
    assert "ghost" not in ctx.world.characters
    assert last_memory(ctx, "pell") == "Pell mends a net."


async def test_a_second_outcome_for_one_character_is_ignored_and_reported(
    tmp_path: Path,
) -> None:
    ctx, _ = await apply_at_quay(
        tmp_path,
        outcome("ada", "Ada stays and sells fish.", gained=["coin"]),
        outcome("ada", "Ada leaves for the caves.", "sea-caves", lost=["coin"]),
    )
    ada = ctx.world.characters["ada"]
    assert ctx.reports[-1].warnings == ["quay: second outcome for 'ada' ignored"]
    assert ada["state"]["location"] == "quay"
    assert "coin" in ada["state"]["inventory"]
    cells = [c for c in ada["memory"]["cells"] if c["tick"] == 1]
    assert [c["text"] for c in cells] == ["Ada stays and sells fish."]  # one cell, the first
