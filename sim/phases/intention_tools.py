"""Phase 1 in ``mode = "tools"``: a character's possible actions declared as tools.

The model calls one of ``move_to``, ``say``, ``act`` or ``wait``; the call becomes the
``Intention``. A call to an undeclared tool (or no call) is ignored: the character gets the
fallback intention and the phase report says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from sim.llm.errors import LLMError
from sim.llm.tools import FunctionCall, ToolCalls, ToolDeclaration

_REASONING = "why, in a sentence"

TOOLS: tuple[ToolDeclaration, ...] = (
    ToolDeclaration.of_strings(
        "move_to",
        "Walk to a connected location (one of the exits).",
        location_id="the id of an exit",
        reasoning=_REASONING,
    ),
    ToolDeclaration.of_strings(
        "say",
        "Speak to a character who is present.",
        character_id="the id of a present character",
        words="what is said",
        reasoning=_REASONING,
    ),
    ToolDeclaration.of_strings(
        "act",
        "Do something with an object here or carried.",
        object="the object acted on",
        action="what is done",
        reasoning=_REASONING,
    ),
    ToolDeclaration.of_strings(
        "wait", "Stay and do nothing in particular this tick.", reasoning=_REASONING
    ),
)


def verb_tool(verb: str, description: str) -> ToolDeclaration:
    """A verb the world declares in ``[actions]``, as a tool."""
    return ToolDeclaration.of_strings(
        verb,
        description,
        target="who or what it is done to",
        content="what exactly is done or offered",
        reasoning=_REASONING,
    )


@lru_cache(maxsize=64)
def _tools(verbs: tuple[tuple[str, str], ...]) -> tuple[ToolDeclaration, ...]:
    return TOOLS + tuple(verb_tool(verb, text) for verb, text in verbs)


def tools_for(actions: Mapping[str, str]) -> tuple[ToolDeclaration, ...]:
    """The built-in tools plus one per ``[actions]`` verb."""
    return _tools(tuple(actions.items())) if actions else TOOLS


class UnknownToolError(LLMError):
    """The model called a tool that was not declared (or none at all)."""

    default_code = "unknown_tool"


def _text(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    return value if isinstance(value, str) else ""


#: built-in tool -> the action it makes, the argument naming its target and the one
#: holding its content (``None``: it has none)
_BUILT_IN: dict[str, tuple[str, str | None, str | None]] = {
    "move_to": ("move", "location_id", None),
    "say": ("speak", "character_id", "words"),
    "act": ("act", "object", "action"),
    "wait": ("wait", None, None),
}


def to_intention_data(
    call: FunctionCall, actions: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """The Intention fields for a declared tool's call, or ``None`` for an unknown tool."""
    args = call.arguments
    target: str | None
    content: str | None
    if actions and call.name in actions:  # an ``[actions]`` verb: target and content
        action, target, content = call.name, "target", "content"
    elif call.name in _BUILT_IN:
        action, target, content = _BUILT_IN[call.name]
    else:
        return None
    return {
        "action": action,
        "target": (_text(args, target) or None) if target else None,
        "content": _text(args, content) if content else "",
        "reasoning": _text(args, "reasoning"),
    }


def intention_data(result: ToolCalls, actions: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The first call that names a declared tool, as Intention fields.

    Raises:
        UnknownToolError: no call named a declared tool.
    """
    for call in result.calls:
        data = to_intention_data(call, actions)
        if data is not None:
            return data
    names = ", ".join(call.name for call in result.calls) or "no call"
    raise UnknownToolError(f"the model called an undeclared tool ({names}); ignored")
