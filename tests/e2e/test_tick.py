"""The tick end to end with the offline provider: determinism and a world that evolves."""

from __future__ import annotations

from pathlib import Path

import orjson
from conftest import copy_demo, tree

from sim.config import load_config
from sim.engine.runner import Runner
from sim.storage import Storage


def run(world: Path, ticks: int, **overrides: object) -> list:
    config = load_config(world_dir=world, overrides=overrides or None, cwd=world)
    return Runner(world, config).run(ticks)


def test_two_copies_ticked_five_times_are_byte_identical(tmp_path: Path) -> None:
    a, b = copy_demo(tmp_path / "a"), copy_demo(tmp_path / "b")
    run(a, 5)
    run(b, 3)
    run(b, 2)  # in two runs: the store and chains carry over through the files
    assert tree(a) == tree(b)
    assert orjson.loads((a / "world.json").read_bytes())["tick"] == 5


def test_ten_ticks_evolve_the_world(demo_world: Path) -> None:
    before = Storage(demo_world).load()
    start = {cid: c["state"]["location"] for cid, c in before.characters.items()}
    moved: set[str] = set()
    results = run(demo_world, 10)
    assert [r.tick for r in results] == list(range(1, 11))
    for result in results:
        moved.update(cid for cid, _, _ in result.moved)
        assert result.failures == 0
        # every occupied location has a narrative every tick
        assert result.narratives, f"tick {result.tick} has no narrative"
        for text in result.narratives.values():
            assert len(text) > 40
    after = Storage(demo_world).load()
    assert after.tick == 10
    assert len(moved) >= len(start) / 2, f"only {sorted(moved)} moved"
    summaries = [c["memory"]["summary"] for c in after.characters.values()]
    assert sum(1 for s in summaries if s) >= len(summaries) / 2
    for char in after.characters.values():
        memory = char["memory"]
        assert len(memory["cells"]) <= memory["capacity"]
        assert memory["cells"][-1]["tick"] == 10
        assert char["_openai"]["usage"]["total_requests"] >= 10


def test_narratives_cover_every_occupied_location(demo_world: Path) -> None:
    world = Storage(demo_world).load()
    occupied = set(world.characters_at())
    result = run(demo_world, 1)[0]
    assert set(result.narratives) == occupied
    for report in result.reports:
        assert report.failures == 0


def test_chain_depth_sends_a_window_and_stores_it(demo_world: Path) -> None:
    run(demo_world, 3, phase1={"response_chain_depth": 2})
    world = Storage(demo_world).load()
    for cid, char in world.characters.items():
        chain = char["_openai"]["intention_chain"]
        assert len(chain) == 2
        stored = orjson.loads(
            (demo_world / ".sim" / "responses" / "intention" / f"{cid}.json").read_bytes()
        )
        assert sorted(stored) == sorted(chain)  # evicted exchanges are gone from the store


def test_deeper_chains_cost_more_input_tokens(tmp_path: Path) -> None:
    shallow = run(copy_demo(tmp_path / "a"), 3)
    deep = run(copy_demo(tmp_path / "b"), 3, phase1={"response_chain_depth": 3})

    def phase1_input(results: list) -> int:
        return sum(
            r.usage.input_tokens for res in results for r in res.reports if r.name == "intentions"
        )

    assert phase1_input(deep) > phase1_input(shallow)


def test_unknown_fields_survive_ticks(demo_world: Path) -> None:
    path = demo_world / "characters" / "wren.json"
    data = orjson.loads(path.read_bytes())
    data["identity"]["nickname"] = "the Magpie"
    data["state"]["secret"] = {"held": ["brass key"], "n": 3}
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    run(demo_world, 2)
    after = orjson.loads(path.read_bytes())
    assert after["notes"] == data["notes"]
    assert after["identity"]["nickname"] == "the Magpie"
    assert after["state"]["secret"] == {"held": ["brass key"], "n": 3}
