"""``sim tick --executor ray`` on a local cluster of two Ray nodes (``ray.cluster_utils``):
the same result as one process, and a node lost mid-tick leaves the world whole."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
cluster_utils = pytest.importorskip("ray.cluster_utils")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A head node and a second node, one CPU each (one worker actor on each)."""
    made = cluster_utils.Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    made.add_node(num_cpus=1)
    ray.init(address=made.address, log_to_driver=False)
    try:
        yield made
    finally:
        ray.shutdown()
        made.shutdown()


def config_for(world: Path):  # type: ignore[no-untyped-def]
    return load_config(world_dir=world, cwd=world)


class LosesANode:
    """The offline model behind the coordinator; as call ``at`` arrives, the cluster's
    second node goes (its raylet and the actor on it are killed)."""

    name = "offline"

    def __init__(self, cluster: Any, at: int) -> None:
        self.cluster = cluster
        # slow calls: the actors on the lost node go while the tick still has calls to make
        self.inner = CountingAdapter(OfflineAdapter(seed=7), delay=0.3)
        self.at = at
        self.started = 0

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        self.started += 1
        if self.started == self.at:
            node = next(n for n in self.cluster.worker_nodes)
            self.cluster.remove_node(node, allow_graceful=False)
        return await self.inner.execute(request)

    async def delete_response(self, response_id: str) -> None:
        await self.inner.delete_response(response_id)


def test_two_nodes_give_one_process_result_and_a_lost_node_leaves_the_world_whole(
    cluster: Any, tmp_path: Path
) -> None:
    base = copy_demo(tmp_path / "base")
    Runner(base, config_for(base)).run(5)
    reference = tmp_path / "ref"
    shutil.copytree(base, reference)
    Runner(reference, config_for(reference)).run(1)
    # the same files, sharded over the coordinator and an actor on each node
    same = tmp_path / "same"
    shutil.copytree(base, same)
    Runner(same, config_for(same), workers=3, executor="ray").run(1)
    assert tree(same) == tree(reference)
    # a node lost mid-tick: named, nothing committed
    world = tmp_path / "w"
    shutil.copytree(base, world)
    before = tree(world)
    losing = LosesANode(cluster, at=3)
    with pytest.raises(WorkerDied, match=r"Ray actor.*died in the middle of the tick"):
        Runner(world, config_for(world), adapter=losing, workers=3, executor="ray").run(1)
    assert tree(world) == before and Storage(world).load().tick == 5
    # a node again, and the next run resumes without paying twice
    cluster.add_node(num_cpus=1)
    resumed = CountingAdapter(OfflineAdapter(seed=7))
    Runner(world, config_for(world), adapter=resumed, workers=3, executor="ray").run(1)
    assert not set(losing.inner.answered) & set(resumed.answered)
    assert tree(world) == tree(reference)


def test_actors_reach_sim_tick_on_the_address_other_machines_would_use(
    cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When a node of the cluster is another machine, ``sim tick`` listens on the address
    Ray knows this machine by, not on 127.0.0.1 (``listen_host``). Here every node is this
    machine, so that choice is made as if one were not: the actors connect to that address
    with the run's token, and the result is one process's."""
    import sim.engine.shard_processes as processes

    own = ray.util.get_node_ip_address()
    if own.startswith("127."):
        pytest.skip("Ray knows this machine only by a loopback address")
    chosen: list[str] = []
    choose = processes.listen_host

    def elsewhere(own: str, nodes: Any) -> str:
        chosen.append(choose(own, [*nodes, "10.255.255.1"]))
        return chosen[-1]

    monkeypatch.setattr(processes, "listen_host", elsewhere)
    reference = copy_demo(tmp_path / "ref")
    Runner(reference, config_for(reference)).run(2)
    world = copy_demo(tmp_path / "w")
    Runner(world, config_for(world), workers=3, executor="ray").run(2)
    assert chosen == [own]
    assert tree(world) == tree(reference)
