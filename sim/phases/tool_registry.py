"""The engine's tool registry: the tools a phase may name (spec 004's
``get_tool_declarations``), and which of them a declared phase can use.

The registry holds the query tools the engine answers from the world (``look``,
``recall``, ``inventory``) and the action tools of intentions in tools mode (``move_to``,
``say``, ``act``, ``wait``). A declared phase (``[phases.<name>] tools = [...]``) may name
query tools that fit its subjects: a character can look, recall and check its inventory; a
location can look at who and what is there; the world as one subject has no place to look
from. Action tools decide a character's intention, so only intentions uses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sim.errors import InputError
from sim.llm.tools import ToolDeclaration, ToolRegistry
from sim.phases.intention_steps import QUERY_TOOLS
from sim.phases.intention_tools import TOOLS

REGISTRY = ToolRegistry((*QUERY_TOOLS, *TOOLS))
ACTION_NAMES = frozenset(tool.name for tool in TOOLS)
#: the query tools a declared phase may name, by its ``per``
FOR_SUBJECT: dict[str, tuple[str, ...]] = {
    "character": ("look", "recall", "inventory"),
    "location": ("look",),
    "world": (),
}
#: the tool a declared phase's model calls to give its answer (the answer schema's fields)
ANSWER = "answer"


def declared_tools(
    names: Sequence[str], per: str, source: Path, phase: str
) -> tuple[ToolDeclaration, ...]:
    """The declarations of the tools ``[phases.<phase>] tools`` names, checked.

    Raises:
        InputError: naming the phase and the tool: not in the registry, an action tool, a
            tool that does not fit the phase's subjects, or named twice.
    """
    where = f"phases.{phase}.tools"
    allowed = FOR_SUBJECT[per]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InputError(source, where, f"phase {phase!r} names tool {name!r} twice")
        seen.add(name)
        if name not in REGISTRY:
            raise InputError(
                source,
                where,
                f"phase {phase!r} names unknown tool {name!r}; the registry has: "
                f"{', '.join(REGISTRY.names)}",
            )
        if name in ACTION_NAMES:
            raise InputError(
                source,
                where,
                f"phase {phase!r} names action tool {name!r}: action tools decide a "
                'character\'s intention (intentions in mode = "tools"); a declared phase '
                f"answers its schema and may name: {', '.join(allowed) or 'none'}",
            )
        if name not in allowed:
            raise InputError(
                source,
                where,
                f"phase {phase!r} (per = {per!r}) names tool {name!r}, which needs "
                + (
                    'a character subject (per = "character")'
                    if per == "location"
                    else "a character or location subject"
                )
                + f"; it may name: {', '.join(allowed) or 'none'}",
            )
    return REGISTRY.get_tool_declarations(names)


__all__ = ["ACTION_NAMES", "ANSWER", "FOR_SUBJECT", "REGISTRY", "declared_tools"]
