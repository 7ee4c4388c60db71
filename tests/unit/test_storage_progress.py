"""``Storage.load``'s progress reports and ``Storage.load_meta`` (what ``sim serve``
checks before it prints its address, and shows while a big world loads)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from sim.errors import InvalidWorld
from sim.storage import Storage, store
from tests.conftest import copy_demo


def test_a_load_reports_the_files_checked_up_to_all_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    world = copy_demo(tmp_path / "demo")
    files = len([*world.glob("characters/*.json"), *world.glob("locations/*.json")])
    monkeypatch.setattr(store, "PROGRESS_EVERY", 3)
    told: list[int] = []
    loaded = Storage(world).load(told.append)
    assert told == sorted(told) and told[0] == 0 and told[-1] == files
    assert len(loaded.characters) + len(loaded.locations) == files
    assert Storage(world).load() == loaded  # the same world, told or not


def test_load_meta_checks_world_json_alone(tmp_path: Path):
    world = copy_demo(tmp_path / "demo")
    (world / "characters" / "ada.json").write_text("{")  # an entity is not read
    assert Storage(world).load_meta()["tick"] == 0
    meta = orjson.loads((world / "world.json").read_bytes())
    meta["tick"] = "soon"
    (world / "world.json").write_bytes(orjson.dumps(meta))
    with pytest.raises(InvalidWorld) as bad:
        Storage(world).load_meta()
    assert "world.json: field 'tick'" in str(bad.value)
    (world / "world.json").unlink()
    with pytest.raises(InvalidWorld, match=r"world\.json is missing"):
        Storage(world).load_meta()
