"""The offline model's daily plans (schema title ``Plan``): from the hour given, a few
timed intentions drawn from the character's goals, the exits and the people it knows."""

from __future__ import annotations

from collections.abc import Sequence
from random import Random
from typing import Any

from sim.offline.skills import pairs, strings, text_of

Json = dict[str, Any]


def plan(data: Json, rng: Random, history: Sequence[tuple[str, str]], schema: Json) -> Json | None:
    char, world = data.get("character"), data.get("world")
    if not isinstance(char, dict) or not isinstance(world, dict):
        return None
    time = world.get("time")
    now = text_of(time.get("time")) if isinstance(time, dict) else ""
    if len(now) != 5:
        return None
    hour = int(now[:2])
    wanted = data.get("items")
    limit = wanted if isinstance(wanted, int) and 0 < wanted <= 24 else 4
    goals = strings(char.get("goals")) or ["see how the day turns out"]
    exits = [name for _, name, _ in pairs(data.get("exits"))]
    steps = [f"work towards this: {g[0].lower()}{g[1:].rstrip('.')}" for g in goals]
    steps += [f"go to {name} and see who is there" for name in exits]
    steps.append("rest and think over what happened today")
    items = []
    for i, step in enumerate(steps[: min(limit, 24 - hour - 1)]):
        at = hour + 1 + i * max(1, (23 - hour) // max(1, len(steps)))
        if at > 23:
            break
        items.append({"at": f"{at:02d}:{rng.choice(('00', '30'))}", "intention": step})
    return {"items": items}
