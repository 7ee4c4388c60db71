"""A character's daily plan as inputs show it (the ``planning`` phase writes it)."""

from __future__ import annotations

from typing import Any


def plan_view(memory: dict[str, Any], time: dict[str, Any] | None) -> dict[str, str] | None:
    """Today's plan as an input shows it: the item for now (the last at or before the
    time) and the next one; ``None`` without a plan for today."""
    plan = memory.get("plan")
    if time is None or not isinstance(plan, dict) or plan.get("date") != time["date"]:
        return None
    items = plan.get("items") or []
    done = [i for i in items if i["at"] <= time["time"]]
    later = [i for i in items if i["at"] > time["time"]]
    view = {}
    if done:
        view["now"] = f"{done[-1]['at']} {done[-1]['intention']}"
    if later:
        view["next"] = f"{later[0]['at']} {later[0]['intention']}"
    return view or None
