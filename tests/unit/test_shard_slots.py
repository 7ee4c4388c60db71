"""The coordinator's own calls in a sharded tick (``sim.engine.sharded_tick.Slotted``): each gives
the event loop a turn, and a cancel (Ctrl-C, SIGTERM) that lands on that turn finds the
call not yet sent, never paid for with its answer thrown away (the resumed tick would pay
for it again)."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from sim.engine.sharded_tick import Slotted
from sim.llm.types import AdapterResponse, ModelRequest
from sim.offline.adapter import OfflineAdapter
from sim.testing import CountingAdapter


class Greeting(BaseModel):
    text: str


def test_a_call_cancelled_at_its_turn_of_the_loop_was_not_sent() -> None:
    async def main() -> tuple[list[str], bool]:
        counting = CountingAdapter(OfflineAdapter(seed=1))  # answers without suspending
        slotted = Slotted(counting, asyncio.Semaphore(2))
        request = ModelRequest("Say hi.", "{}", Greeting)
        task = asyncio.create_task(slotted.execute(request))
        await asyncio.sleep(0)  # the call's task runs to its turn of the loop
        task.cancel()
        cancelled = False
        try:
            await task
        except asyncio.CancelledError:
            cancelled = True
        return counting.answered, cancelled

    answered, cancelled = asyncio.run(main())
    assert cancelled
    assert answered == []  # nothing paid for and lost


def test_an_uncancelled_call_is_answered_and_holds_a_slot_while_it_runs() -> None:
    async def main() -> tuple[AdapterResponse, int]:
        slots = asyncio.Semaphore(1)
        slotted = Slotted(CountingAdapter(OfflineAdapter(seed=1), delay=0.05), slots)
        request = ModelRequest("Say hi.", "{}", Greeting)
        task = asyncio.create_task(slotted.execute(request))
        await asyncio.sleep(0.01)
        held = slots.locked()
        return await task, held

    answer, held = asyncio.run(main())
    assert held and answer.raw
