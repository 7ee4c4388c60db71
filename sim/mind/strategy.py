"""Memory strategies (``[memory] mode``): what a character remembers, and what of its memory
a phase's input shows for one request.

A strategy says two things. What to remember: whether a character's evicted cells are kept
in its long-term store (``memory.archive``) for later recall (``keeps_evicted``). What to
recall for a request: the memory lines the input shows beside the summary (``recall``),
given the character's memory, the phase's ``[memory]`` settings and, for a strategy that
weighs cells against the moment (``uses_situation``), the character's situation and the
provider embeddings the phase scores with (fetched before the phase builds its inputs).

Built in: ``window`` (``sim.mind.window``) and ``retrieve`` (``sim.mind.retrieve``). A
package adds one in the ``sim.memory`` entry-point group; a config names it in
``[memory] mode`` (or ``[memory.phases.<name>] mode``)::

    [project.entry-points."sim.memory"]
    diary = "my_package.memory:Diary"

The entry point names an instance, or a class called without arguments; its ``name`` must
be the entry point's name. A built-in's name cannot be taken. The next built-in goes in a
module of its own beside ``window.py``, named in ``BUILTIN`` and in
``sim.config.MEMORY_STRATEGIES``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sim.config import MEMORY_GROUP, MEMORY_STRATEGIES, MemoryConfig
from sim.errors import InputError
from sim.mind.retrieve import RetrieveMemory, Situation
from sim.mind.window import WindowMemory
from sim.plugins import load_plugin

if TYPE_CHECKING:
    from sim.mind.vectors import VectorCache


@dataclass(frozen=True, slots=True)
class Recall:
    """One request's memory, as a strategy recalls from it.

    Attributes:
        memory: the character's memory (``summary``, ``cells``, ``archive``...).
        config: the phase's ``[memory]`` settings (``k``, weights, decay...).
        situation: the character's situation now; ``None`` unless the strategy
            ``uses_situation``.
        vectors: the provider embeddings the phase scores relevance with (``[memory]
            embeddings = "provider"``); ``None`` otherwise.
    """

    memory: dict[str, Any]
    config: MemoryConfig
    situation: Situation | None = None
    vectors: VectorCache | None = None


@runtime_checkable
class MemoryStrategy(Protocol):
    """A memory strategy (see the module docstring)."""

    #: its ``[memory] mode`` name
    name: str
    #: what to remember: a character's evicted cells are kept in its long-term store
    keeps_evicted: bool
    #: recall weighs cells against the character's situation (and, with ``embeddings =
    #: "provider"``, the phase fetches the embeddings it scores with)
    uses_situation: bool

    def recall(self, request: Recall) -> dict[str, list[str]]:
        """What to recall for one request: the memory fields the input shows beside the
        summary (the built-ins: ``recent``, the window's lines; ``recall``, the
        retrieved ones), each a list of lines."""
        ...


#: the built-in strategies by name
BUILTIN: dict[str, MemoryStrategy] = {"window": WindowMemory(), "retrieve": RetrieveMemory()}
assert tuple(BUILTIN) == MEMORY_STRATEGIES


@functools.cache
def memory_strategy(name: str) -> MemoryStrategy:
    """The strategy ``[memory] mode`` names: a built-in, else an installed package's.

    Raises:
        InputError: no built-in and no installed package offers it, its entry point cannot
            be loaded, or it does not follow ``MemoryStrategy``.
    """
    builtin = BUILTIN.get(name)
    if builtin is not None:
        return builtin
    offered = {ep.name: ep for ep in entry_points(group=MEMORY_GROUP) if ep.name not in BUILTIN}
    ep = offered.get(name)
    if ep is None:
        choices = ", ".join((*BUILTIN, *sorted(offered)))
        raise InputError(
            None, "memory.mode", f"unknown memory strategy {name!r}; expected one of: {choices}"
        )
    strategy: MemoryStrategy = load_plugin(
        ep,
        MemoryStrategy,
        "memory.mode",
        "a memory strategy: it needs a name, keeps_evicted, uses_situation and recall(request)",
    )
    return strategy


__all__ = ["BUILTIN", "MemoryStrategy", "Recall", "memory_strategy"]
