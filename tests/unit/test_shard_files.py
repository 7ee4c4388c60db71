"""A sharded tick's parts come back as files (``ShardFinal.files``): each shard makes its own
part's commit files (``sim.storage.entity_forms``), and the coordinator takes them as they
are (``Storage.changed_files(given=...)``) and puts the entities they hold in its world
(``sim.engine.split.take_files``)."""

from __future__ import annotations

import copy
from pathlib import Path

import orjson
from conftest import copy_demo

from sim.engine.split import take_files, take_states
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


def test_the_coordinator_takes_a_shards_files_as_its_world_and_its_commit(
    tmp_path: Path,
) -> None:
    """A worker's character whose state a barrier sent, then changed back in the last
    phase, is as loaded in the coordinator's world; one changed is as its file says; and
    the commit writes exactly the worker's bytes, none of the coordinator's stale copies."""
    root = copy_demo(tmp_path / "w")
    storage = Storage(root)
    coordinator = storage.load()
    worker = storage.load()
    back, moved = sorted(worker.characters)[:2]
    loaded = copy.deepcopy(coordinator.characters[back])

    # a barrier: the coordinator is sent the state the worker's phase left
    went = dict(worker.characters[back]["state"], location="the-well")
    take_states(coordinator, {("character", back): went}, {})
    assert coordinator.characters[back]["state"]["location"] == "the-well"
    # the last phase: one character back where it was, the other given a new memory
    worker.characters[moved].setdefault("memory", {})["note"] = "saw the well"
    files = entity_forms(worker, [back, moved], [])
    assert files[f"characters/{back}.json"] is None

    take_files(coordinator, files)

    assert coordinator.characters[back] == loaded
    moved_file = files[f"characters/{moved}.json"]
    assert moved_file is not None
    assert coordinator.characters[moved] == orjson.loads(moved_file)
    commit = storage.changed_files(coordinator, given=files)
    assert commit == {f"characters/{moved}.json": moved_file}
