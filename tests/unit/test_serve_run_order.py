"""The page's run state is ordered: a control's answer that arrives late is not shown."""

from __future__ import annotations

import threading

from sim.serve.driver import RunState


def test_each_run_state_snapshot_is_numbered_after_the_one_before() -> None:
    state = RunState(running=True, ticks=200)
    first = state.to_dict()
    state.running = False
    state.done = 3
    second = state.to_dict()
    assert second["order"] > first["order"]
    assert {k: v for k, v in second.items() if k != "order"} == {
        **{k: v for k, v in first.items() if k != "order"},
        "running": False,
        "done": 3,
    }
    orders: list[int] = []

    def take() -> None:
        orders.extend(state.to_dict()["order"] for _ in range(500))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(orders)) == len(orders) == 2000  # none taken twice, from any thread
    assert min(orders) > second["order"]
