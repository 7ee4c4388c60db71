"""``sim tick --workers N --executor ray``: the shards as Ray actors on a local instance.

The same result as one process; an actor killed mid-tick ends the tick with an error
naming it, commits nothing, and the next run resumes without paying twice.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import copy_demo, tree

from sim.config import load_config
from sim.engine.runner import Runner
from sim.engine.shard_processes import WorkerDied
from sim.llm.types import AdapterResponse, ModelRequest
from sim.offline.adapter import OfflineAdapter
from sim.storage import Storage
from sim.testing import CountingAdapter

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def config_for(world: Path):  # type: ignore[no-untyped-def]
    return load_config(world_dir=world, cwd=world)


def _actors() -> list[int]:
    """The processes of this machine running a shard's Ray actor."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                title = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if title.startswith(b"ray::ShardActor"):
                found.append(int(entry.name))
    return found


def test_ray_actors_give_one_process_result(local_ray: None, tmp_path: Path) -> None:
    one = copy_demo(tmp_path / "one")
    Runner(one, config_for(one)).run(2)
    sharded = copy_demo(tmp_path / "ray")
    Runner(sharded, config_for(sharded), workers=2, executor="ray").run(2)
    assert tree(sharded) == tree(one)


class KillsAnActor:
    """The offline model behind the coordinator; as call ``at`` arrives, kill -9 of a
    shard's actor process (as a lost node would end it)."""

    name = "offline"

    def __init__(self, at: int) -> None:
        self.inner = CountingAdapter(OfflineAdapter(seed=7), delay=0.01)
        self.at = at
        self.started = 0

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        self.started += 1
        if self.started == self.at:
            os.kill(_actors()[0], signal.SIGKILL)
        return await self.inner.execute(request)

    async def delete_response(self, response_id: str) -> None:
        await self.inner.delete_response(response_id)


def test_an_actor_lost_mid_tick_is_named_and_the_resume_pays_once(
    local_ray: None, tmp_path: Path
) -> None:
    base = copy_demo(tmp_path / "base")
    Runner(base, config_for(base)).run(5)
    reference = tmp_path / "ref"
    shutil.copytree(base, reference)
    Runner(reference, config_for(reference)).run(1)
    world = tmp_path / "w"
    shutil.copytree(base, world)
    before = tree(world)
    killer = KillsAnActor(at=8)
    with pytest.raises(WorkerDied, match=r"worker \d \(Ray actor, pid \d+ on .*\) died"):
        Runner(world, config_for(world), adapter=killer, workers=2, executor="ray").run(1)
    assert tree(world) == before and Storage(world).load().tick == 5
    resumed = CountingAdapter(OfflineAdapter(seed=7))
    Runner(world, config_for(world), adapter=resumed, workers=2, executor="ray").run(1)
    assert not set(killer.inner.answered) & set(resumed.answered)
    assert tree(world) == tree(reference)


def test_an_actor_that_cannot_see_the_world_folder_is_named_with_its_node(
    local_ray: None, tmp_path: Path
) -> None:
    """An actor whose node does not have the world's folder at its path (a cluster's
    other machine without the shared filesystem) ends the start with an error that names
    the worker, the folder and the node, not Ray's own trace."""
    import asyncio
    import socket

    from sim.engine.shards import Shards

    missing = tmp_path / "not-on-this-node"

    async def start() -> None:
        async with Shards(missing, 1, 1 << 20, 4, "ray", None):
            raise AssertionError("the actor connected without the world's folder")

    with pytest.raises(WorkerDied) as died:
        asyncio.run(start())
    said = str(died.value)
    assert said.startswith("worker 2 (Ray actor) ended before it connected: ")
    assert f"the world folder {missing} is not on node {socket.gethostname()}" in said
    assert "ray::" not in said


def test_actors_the_cluster_cannot_place_end_the_start_naming_one_never_a_hang(
    local_ray: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three workers on a cluster of two CPUs: the third actor is never placed (each takes
    a CPU). The start ends within ``RAY_START_SECONDS`` (1 s here) with an error naming
    it, and the actors that did start are ended."""
    import asyncio
    import time

    import sim.engine.shard_processes as processes
    from sim.engine.shards import Shards

    monkeypatch.setattr(processes, "RAY_START_SECONDS", 1.0)
    world = copy_demo(tmp_path / "w")

    async def start() -> None:
        async with Shards(world, 3, 1 << 20, 4, "ray", None):
            raise AssertionError("three actors placed on two CPUs")

    began = time.monotonic()
    with pytest.raises(WorkerDied) as died:
        asyncio.run(start())
    assert time.monotonic() - began < 30
    said = str(died.value)
    assert "did not connect within 1 s" in said and "free CPU for each worker" in said
    deadline = time.monotonic() + 30
    while _actors() and time.monotonic() < deadline:  # Ray ends killed actors' processes
        time.sleep(0.2)
    assert not _actors()
