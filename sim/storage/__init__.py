"""A world's files on disk: loaded and validated, committed atomically, locked.

Owns: ``store`` (``Storage``: a world folder read and checked, its changed files, the
``.sim`` folders, the world's lock), ``filetext`` (what a world file's text may be beyond
its JSON: depth, repeated keys, 64-bit integers), ``normal`` (a world file's normal form, without
pydantic's dump when the file already is it), ``journal`` (the commit's redo journal: written,
fsynced, renamed, replayed after a crash), ``journalcheck`` (what a pending journal may
hold, checked before any of it is applied), ``statefiles`` (the engine's state files
under ``.sim`` and what each must hold) and ``forms`` (a world moved between its folders
and its pack: ``sim pack``, ``sim unpack``).

May import: ``sim.errors``, ``sim.world`` (the entities' models), ``sim.safefs`` (every
path inside a world opened without following a link out of it), ``sim.bundle`` (the
journal's form), ``sim.pack`` (a packed world's entity files) and ``sim.ticklog`` (the
logs a journal moves, the records a state file holds). Nothing above it: the engine, the
interventions, runs and studies import it.

Next: the next module of its kind (a file the engine keeps in a world, and how it is written or
checked) goes here; a new state file under ``.sim`` is named in ``statefiles`` and in the
commit paths of ``journal`` (``COMMIT_PATHS``), so a pending journal may write it.

``from sim.storage import Storage`` (and the other names of ``store``) keeps working:
they are imported from ``store`` on first use, so a module that needs only ``journal`` or
``statefiles`` does not load the world's models.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sim.storage.store import (
        ENTITY_KINDS,
        ENTITY_LIMIT,
        MAX_DEPTH,
        MAX_ENTITY_BYTES,
        MAX_PROMPT_BYTES,
        PROMPTS_DIR,
        Storage,
        dump_json,
        entity_forms,
        normal_bytes,
        prompt_problems,
        read_prompt,
    )

__all__ = [
    "ENTITY_KINDS",
    "ENTITY_LIMIT",
    "MAX_DEPTH",
    "MAX_ENTITY_BYTES",
    "MAX_PROMPT_BYTES",
    "PROMPTS_DIR",
    "Storage",
    "dump_json",
    "entity_forms",
    "normal_bytes",
    "prompt_problems",
    "read_prompt",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'sim.storage' has no attribute {name!r}")
    value = getattr(importlib.import_module("sim.storage.store"), name)
    globals()[name] = value
    return value
