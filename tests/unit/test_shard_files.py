"""A sharded tick's parts come back as files (``ShardFinal.files``): each shard makes its own
part's commit files (``sim.storage.entity_forms``) and what the tick's result says of them
(``sim.engine.split.Ends``), and the coordinator commits the files as they are
(``Storage.changed_files(given=...)``), after checking that they name only its world's
entities (``sim.engine.split.check_part``)."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import WORLDS, copy_demo

from sim.engine.split import Ends, ShardFinal, check_part, take_states
from sim.storage import Storage, entity_forms


def test_a_shards_files_are_the_commits_and_none_for_an_unchanged_entity(
    tmp_path: Path,
) -> None:
    world = Storage(copy_demo(tmp_path / "w")).load()
    cids = sorted(world.characters)
    changed, unchanged = cids[0], cids[1]
    world.characters[changed]["state"]["location"] = "somewhere-else"
    lid = sorted(world.locations)[0]

    forms = entity_forms(world, [changed, unchanged], [lid])

    expected = Storage(world.root).changed_files(copy.deepcopy(world))
    assert forms[f"characters/{changed}.json"] == expected[f"characters/{changed}.json"]
    assert forms[f"characters/{unchanged}.json"] is None
    assert forms[f"locations/{lid}.json"] is None
    assert set(forms) == {
        f"characters/{changed}.json",
        f"characters/{unchanged}.json",
        f"locations/{lid}.json",
    }


def test_the_coordinator_commits_a_shards_files_and_reports_its_ends(
    tmp_path: Path,
) -> None:
    """A worker's character whose state a barrier sent, then changed back in the last
    phase, is where it was loaded in the worker's ends (what the tick's result says); one
    changed is as its file says; and the commit writes exactly the worker's bytes, none of
    the coordinator's stale copies."""
    root = copy_demo(tmp_path / "w")
    storage = Storage(root)
    coordinator = storage.load()
    worker = storage.load()
    back, moved = sorted(worker.characters)[:2]
    loaded = coordinator.characters[back]["state"]["location"]

    # a barrier: the coordinator is sent the state the worker's phase left
    went = dict(worker.characters[back]["state"], location="the-well")
    take_states(coordinator, {("character", back): went}, {})
    assert coordinator.characters[back]["state"]["location"] == "the-well"
    # the last phase: one character back where it was, the other given a new memory
    worker.characters[moved].setdefault("memory", {})["note"] = "saw the well"
    files = entity_forms(worker, [back, moved], [])
    assert files[f"characters/{back}.json"] is None
    ends = Ends.of(worker, [back, moved], [])

    check_part(coordinator, ShardFinal(files, {}, ends=ends))

    assert ends.characters[back][1] == loaded
    moved_file = files[f"characters/{moved}.json"]
    assert moved_file is not None
    assert ends.characters[moved] == (
        orjson.loads(moved_file)["identity"]["name"],
        orjson.loads(moved_file)["state"]["location"],
    )
    commit = storage.changed_files(coordinator, given=files)
    assert commit == {f"characters/{moved}.json": moved_file}


def test_only_the_state_writing_phases_change_a_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sharded tick compares and exchanges the characters' and places' states only after
    the phases that write them (``STATE_WRITERS``): every other shardable phase, run here
    over the demo and the minds world (planning, reflection, memory retrieval), leaves
    every state as it was. A phase that starts writing one fails this test, not a
    sharded tick's result, silently."""
    import dataclasses

    from sim.config import load_config
    from sim.engine import runner as runner_module
    from sim.engine.runner import Runner
    from sim.engine.split import SHARDABLE, STATE_WRITERS
    from sim.phases import PhaseSpec

    real = runner_module.resolve_phases
    ran: set[str] = set()
    wrote: set[str] = set()

    def states(world: Any) -> dict[tuple[str, str], bytes]:
        found = {("c", cid): orjson.dumps(c["state"]) for cid, c in world.characters.items()}
        found.update(
            {("l", lid): orjson.dumps(loc["state"]) for lid, loc in world.locations.items()}
        )
        return found

    def watched(spec: PhaseSpec) -> PhaseSpec:
        async def run(ctx: Any) -> None:
            before = states(ctx.world)
            await spec.run(ctx)
            ran.add(spec.name)
            if states(ctx.world) != before:
                wrote.add(spec.name)

        return dataclasses.replace(spec, run=run)

    def resolve(*args: Any, **kwargs: Any) -> list[PhaseSpec]:
        return [watched(spec) for spec in real(*args, **kwargs)]

    monkeypatch.setattr(runner_module, "resolve_phases", resolve)
    for name, ticks in (("demo", 3), ("minds", 6)):
        world = tmp_path / name
        shutil.copytree(WORLDS / name, world, ignore=shutil.ignore_patterns(".sim"))
        Runner(world, load_config(world_dir=world, cwd=world)).run(ticks)
    assert ran >= SHARDABLE and "apply" in wrote, (ran, wrote)
    assert {phase for phase in wrote if phase in SHARDABLE} <= STATE_WRITERS, wrote


def test_a_file_a_shard_sends_for_no_entity_of_the_world_is_refused(tmp_path: Path) -> None:
    """The coordinator takes a shard's files and ends only for entities its world has:
    anything else ends the tick with an error naming the file, never an entity made up."""
    from sim.errors import RunError

    world = Storage(copy_demo(tmp_path / "w")).load()
    for rel in ("characters/nobody.json", "notes/x.json", ".sim/journal.json"):
        with pytest.raises(RunError, match="not a file of this world"):
            check_part(world, ShardFinal({rel: b"{}"}, {}))
    for ends in (Ends({"nobody": ("No One", "nowhere")}, {}), Ends({}, {"nowhere": "?"})):
        with pytest.raises(RunError, match="not a file of this world"):
            check_part(world, ShardFinal({}, {}, ends=ends))
    cid = sorted(world.characters)[0]
    check_part(world, ShardFinal({f"characters/{cid}.json": None}, {}))


def test_a_part_goes_in_pieces_that_add_up_to_it_in_its_order(tmp_path: Path) -> None:
    """A worker's part is sent in pieces (``ShardFinal.pieces``), none much bigger than
    the size asked (one file over it at most), the store's changes after the entities',
    the deletions and the ends with the last; put together again (``add``) they are the
    part, in its order. A part with nothing in it is one piece."""

    world = Storage(copy_demo(tmp_path / "w")).load()
    world.characters[sorted(world.characters)[0]]["state"]["location"] = "elsewhere"
    files = entity_forms(world, sorted(world.characters), sorted(world.locations))
    store: dict[str, bytes | None] = {f"chains/c{i}.json": b"x" * (300 + i) for i in range(9)}
    store["chains/gone.json"] = None
    ends = Ends.of(world, sorted(world.characters), sorted(world.locations))
    whole = ShardFinal(files, store, [("intentions", "resp-1"), ("memory", "resp-2")], ends)
    largest = max(len(rel) + len(data or b"") for rel, data in [*files.items(), *store.items()])
    size = 700

    pieces = list(whole.pieces(size))

    assert len(pieces) > 3
    for piece in pieces:
        entries = [*piece.files.items(), *piece.store.items()]
        assert sum(len(rel) + len(data or b"") for rel, data in entries) < size + largest
    assert [p.deletions for p in pieces[:-1]] == [[]] * (len(pieces) - 1)
    assert pieces[-1].deletions == whole.deletions
    assert [p.ends for p in pieces[:-1]] == [Ends({}, {})] * (len(pieces) - 1)
    assert pieces[-1].ends == ends and ends.characters and ends.places
    again = ShardFinal({}, {})
    for piece in pieces:
        again.add(piece)
    assert again == whole
    assert list(again.files) == list(files) and list(again.store) == list(store)
    empty = list(ShardFinal({}, {}, [("m", "r")]).pieces())
    assert empty == [ShardFinal({}, {}, [("m", "r")])]
