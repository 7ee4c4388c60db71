"""Memory growth never commits an entity file over ``[limits] max_entity_bytes`` (issue 35,
item 8): loading refuses such a file, so the world would stop there. A character's memory
is compacted to fit, named in the tick's notes; a file that cannot fit is refused by the
commit, naming it and the limit, and the world stays at its tick with nothing lost."""

from __future__ import annotations

from pathlib import Path

import orjson
from click.testing import CliRunner
from conftest import tree

from sim.cli import main
from sim.mind.fit import fit_memory
from sim.storage import Storage, dump_json

LIMIT = 2048


def limited(world: Path, extra: str = "") -> Path:
    (world / "config.toml").write_text(
        f'[limits]\nmax_entity_bytes = {LIMIT}\n[memory]\nmode = "retrieve"\n{extra}'
    )
    return world


def test_growing_memory_is_compacted_and_every_committed_world_loads(demo_world: Path) -> None:
    world = limited(demo_world)
    runner = CliRunner()
    compacted = ""
    for tick in range(1, 6):
        result = runner.invoke(main, ["tick", "--world", str(world)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        loaded = Storage(world, LIMIT).load()  # as the next tick and `sim check` load it
        assert loaded.tick == tick
        sizes = [len(p.read_bytes()) for p in (world / "characters").glob("*.json")]
        assert max(sizes) <= LIMIT
        if "memory was compacted" in result.output:
            compacted = result.output
        check = runner.invoke(main, ["check", "--world", str(world)], catch_exceptions=False)
        assert check.exit_code == 0, check.output
    # it did grow past the limit, and the tick said whose memory lost what
    assert "memory was compacted to fit [limits] max_entity_bytes (2048)" in compacted


def test_a_file_that_cannot_fit_fails_the_tick_by_name(demo_world: Path) -> None:
    world = limited(demo_world)
    path = world / "characters" / "ada.json"
    ada = orjson.loads(path.read_bytes())
    # nothing to compact, and the tick writes more than memory: a longer mood and location
    ada["memory"]["cells"] = []
    ada["state"]["mood"] = "x"
    ada["identity"]["description"] = ""
    ada["identity"]["description"] = "x" * (LIMIT - len(dump_json(ada)) - 2)  # just fits
    path.write_bytes(dump_json(ada))
    assert len(path.read_bytes()) <= LIMIT
    before = tree(world)
    result = CliRunner().invoke(main, ["tick", "--world", str(world)], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert str(path) in result.output
    assert "over the limit of 2048 ([limits] max_entity_bytes" in result.output
    assert "nothing was committed" in result.output
    assert tree(world) == before  # at tick 0, every file as it was
    assert Storage(world, LIMIT).load().tick == 0


def test_fit_memory_drops_the_least_recent_first() -> None:
    cell = {"tick": 0, "text": "y" * 100}
    char = {
        "identity": {"id": "ada"},
        "memory": {
            "capacity": 5,
            "cells": [dict(cell, tick=t) for t in (8, 9)],
            "summary": "old news. " * 30,
            "archive": [dict(cell, tick=t) for t in range(8)],
        },
    }

    def size(entity: object) -> int:
        return len(dump_json(entity))

    whole = size(char)
    assert fit_memory(char, whole, size) is None  # fits: untouched
    trimmed = fit_memory(char, whole - 250, size)
    assert trimmed is not None and trimmed.fits and trimmed.archived >= 2
    assert [c["tick"] for c in char["memory"]["archive"]] == list(range(trimmed.archived, 8))
    assert len(char["memory"]["cells"]) == 2 and trimmed.summary_chars == 0
    # then the summary's oldest part, then the oldest cells
    trimmed = fit_memory(char, size(char) - len(dump_json(char["memory"]["archive"])) - 100, size)
    assert trimmed is not None and trimmed.fits
    assert char["memory"]["archive"] == [] and 0 < len(char["memory"]["summary"]) < 300
    assert len(char["memory"]["cells"]) == 2
    bare = size({**char, "memory": {**char["memory"], "cells": [], "summary": ""}})
    trimmed = fit_memory(char, bare - 1, size)  # cannot fit: everything went, and it says so
    assert trimmed is not None and not trimmed.fits
    assert char["memory"]["cells"] == [] and char["memory"]["summary"] == ""
