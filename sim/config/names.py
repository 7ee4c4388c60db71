"""Phases by name: the config's phase sections and their aliases, the built-in phases, and
the keys the trust rule for world configs watches (what a provider kind offers is its
profile's to say: ``sim.providers.profile``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sim.errors import InputError

PHASE_SECTIONS = (
    "phase1",
    "phase2a",
    "phase2b",
    "phase4",
    "reflection",
    "conversation",
    "planning",
)


#: a numbered phase section by what its phase does: ``[resolution]`` is ``[phase2a]``, in a
#: config file and in a dotted key (``--set resolution.temperature=0.5``). The numbered names
#: stay the config's own (its fields, the tick log's copy of it). ``[phase4]``, the memory
#: phase's, has none: ``[memory]`` is the memory section (what of a memory phases see).
READABLE_SECTIONS = {"intentions": "phase1", "resolution": "phase2a", "narrative": "phase2b"}


#: the built-in memory strategies (``[memory] mode``): what a character keeps of its evicted
#: cells and what of its memory a phase's input shows (``sim.mind.strategy``)
MEMORY_STRATEGIES = ("window", "retrieve")


#: the entry-point group of memory strategies offered by installed packages
MEMORY_GROUP = "sim.memory"


PHASE_ALIASES = {
    "intentions": "phase1",
    "resolution": "phase2a",
    "narrative": "phase2b",
    "memory": "phase4",
    "reflection": "reflection",
    "conversation": "conversation",
    "planning": "planning",
}


#: the built-in phases, the default order first; the rest run only where [tick] phases
#: names them
BUILTIN_PHASES = (
    "intentions",
    "resolution",
    "narrative",
    "apply",
    "memory",
    "reflection",
    "conversation",
    "planning",
)


DEFAULT_ORDER = BUILTIN_PHASES[:5]


#: phase and verb names: they become chain keys (``opinion:{id}``) and file names
NAME_PATTERN = r"^[a-z][a-z0-9_]{0,39}$"


#: config keys that decide where requests (and the API key) go. The trust rule for world
#: configs applies to every key whose last part is in this set, wherever it appears:
#: ``llm.*``, ``phase1.*`` .. ``phase4.*`` and ``phases.<name>.*``.
ENDPOINT_KEYS = frozenset({"provider", "base_url", "api_key_env"})


#: ... and these too (a future ``api_key``, ``organization``, ``headers``; ``command``, the
#: program a ``cli`` provider runs), plus anything under ``[providers.*]``: a world's config
#: may not set them on its own (a shared world must not run commands of its choosing)
ROUTING_KEYS = ENDPOINT_KEYS | {"api_key", "organization", "headers", "command"}


ROUTING_TABLES = frozenset({"providers"})


#: a ``[providers.NAME]`` name: what a qualified model string starts with (``local/qwen``)
PROVIDER_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,39}$"


#: config section -> phase name, for the built-in LLM phases
SECTION_NAMES = {section: name for name, section in PHASE_ALIASES.items()}


def phase_section(name: str, declared: tuple[str, ...] = (), option: str = "--depth") -> str:
    """Map ``phase2a``, ``resolution`` or a declared phase's name (``opinion`` ->
    ``phases.opinion``) to its config section; raise on anything else, naming ``option``
    (the command-line option the name came from)."""
    section = PHASE_ALIASES.get(name, name)
    if section in PHASE_SECTIONS:
        return section
    bare = name.removeprefix("phases.")
    if bare in declared and bare not in BUILTIN_PHASES:
        return f"phases.{bare}"
    choices = ", ".join(
        (*PHASE_SECTIONS, *PHASE_ALIASES, *(d for d in declared if d not in BUILTIN_PHASES))
    )
    raise InputError(None, option, f"unknown phase {name!r}; expected one of: {choices}")


def numbered_sections(layer: Mapping[str, Any], source: Path | None) -> dict[str, Any]:
    """A config layer with its readable phase sections (``[resolution]``) under their
    numbered names (``[phase2a]``), as the config's models have them.

    Raises:
        InputError: a layer sets both names of one section (naming ``source``, ``None``:
            the command line, and both names).
    """
    for readable, numbered in READABLE_SECTIONS.items():
        if readable in layer and numbered in layer:
            raise InputError(
                source,
                readable,
                f"[{readable}] and [{numbered}] are the same section (phase {readable!r}): "
                "set it under one name",
            )
    return {READABLE_SECTIONS.get(key, key): value for key, value in layer.items()}


def known_memory(mode: str) -> bool:
    """A built-in memory strategy, or one an installed package offers (``sim.memory``)."""
    if mode in MEMORY_STRATEGIES:
        return True
    from importlib.metadata import entry_points  # read only for other names

    return any(ep.name == mode for ep in entry_points(group=MEMORY_GROUP))


def section_name(section: str) -> str:
    """The phase name of a config section (``phase2a`` -> ``resolution``)."""
    return SECTION_NAMES.get(section, section.removeprefix("phases."))
