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

_REASONING = {"type": "string", "description": "why, in a sentence"}

TOOLS: tuple[ToolDeclaration, ...] = (
    ToolDeclaration(
        name="move_to",
        description="Walk to a connected location (one of the exits).",
        parameters={
            "type": "object",
            "properties": {
                "location_id": {"type": "string", "description": "the id of an exit"},
                "reasoning": _REASONING,
            },
            "required": ["location_id", "reasoning"],
        },
    ),
    ToolDeclaration(
        name="say",
        description="Speak to a character who is present.",
        parameters={
            "type": "object",
            "properties": {
                "character_id": {"type": "string", "description": "the id of a present character"},
                "words": {"type": "string", "description": "what is said"},
                "reasoning": _REASONING,
            },
            "required": ["character_id", "words", "reasoning"],
        },
    ),
    ToolDeclaration(
        name="act",
        description="Do something with an object here or carried.",
        parameters={
            "type": "object",
            "properties": {
                "object": {"type": "string", "description": "the object acted on"},
                "action": {"type": "string", "description": "what is done"},
                "reasoning": _REASONING,
            },
            "required": ["object", "action", "reasoning"],
        },
    ),
    ToolDeclaration(
        name="wait",
        description="Stay and do nothing in particular this tick.",
        parameters={
            "type": "object",
            "properties": {"reasoning": _REASONING},
            "required": ["reasoning"],
        },
    ),
)


def verb_tool(verb: str, description: str) -> ToolDeclaration:
    """A verb the world declares in ``[actions]``, as a tool."""
    return ToolDeclaration(
        name=verb,
        description=description,
        parameters={
            "type": "object",
            "properties": {
                "target": {"type": "string", "description": "who or what it is done to"},
                "content": {"type": "string", "description": "what exactly is done or offered"},
                "reasoning": _REASONING,
            },
            "required": ["target", "content", "reasoning"],
        },
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


def to_intention_data(
    call: FunctionCall, actions: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """The Intention fields for a declared tool's call, or ``None`` for an unknown tool."""
    args = call.arguments
    if actions and call.name in actions:
        return {
            "action": call.name,
            "target": _text(args, "target") or None,
            "content": _text(args, "content"),
            "reasoning": _text(args, "reasoning"),
        }
    reasoning = _text(args, "reasoning")
    if call.name == "move_to":
        return {
            "action": "move",
            "target": _text(args, "location_id") or None,
            "content": "",
            "reasoning": reasoning,
        }
    if call.name == "say":
        return {
            "action": "speak",
            "target": _text(args, "character_id") or None,
            "content": _text(args, "words"),
            "reasoning": reasoning,
        }
    if call.name == "act":
        return {
            "action": "act",
            "target": _text(args, "object") or None,
            "content": _text(args, "action"),
            "reasoning": reasoning,
        }
    if call.name == "wait":
        return {"action": "wait", "target": None, "content": "", "reasoning": reasoning}
    return None


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
