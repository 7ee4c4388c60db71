"""The phases of a tick: the built-ins, and the list a world declares in ``[tick] phases``.

``resolve_phases`` turns the configured names into runnable ``PhaseSpec``s: built-ins by
name, ``[phases.<name>]`` sections as ``DeclaredPhase``, anything else from the ``sim.phases``
entry-point group. An order the engine cannot run is a named error (``check_order``).

Owns: the built-in phases (one module each), declared and entry-point phases, the tick
context phases build inputs from, prompt templates, references.

May import: ``sim.config``, ``sim.errors``, ``sim.llm``, ``sim.messages``, ``sim.mind``,
``sim.offline``, ``sim.plugins``, ``sim.providers`` (a kind's profile), ``sim.sections``,
``sim.ticklog``, ``sim.world``.

Next: a built-in phase is a module here, named in ``sim.config.BUILTIN_PHASES`` and in this
module's registry; a phase from a package goes in the ``sim.phases`` entry-point group.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sim import messages
from sim.config import BUILTIN_PHASES, DEFAULT_ORDER, Config, phase_section, routing
from sim.errors import InputError
from sim.llm.calls import digest, schema_digest
from sim.mind.strategy import memory_strategy
from sim.phases import (
    apply,
    conversation,
    intentions,
    memory,
    narrative,
    planning,
    reflection,
    resolution,
)
from sim.phases.base import TickContext
from sim.phases.declared import DeclaredPhase
from sim.phases.protocol import Phase, entry_point_phases, load_entry_point, run_phase
from sim.phases.templates import Prompts
from sim.providers import profile, selectable_kinds

PhaseRun = Callable[[TickContext], Awaitable[None]]

#: (name, run) of the built-ins in their default order: 1 intentions, 2a resolution,
#: 2b narrative, 3 apply, 4 memory; then reflection, which runs only where it is named
PHASES: tuple[tuple[str, PhaseRun], ...] = (
    (intentions.NAME, intentions.run),
    (resolution.NAME, resolution.run),
    (narrative.NAME, narrative.run),
    (apply.NAME, apply.run),
    (memory.NAME, memory.run),
    (reflection.NAME, reflection.run),
    (conversation.NAME, conversation.run),
    (planning.NAME, planning.run),
)
_BUILTIN_RUN = dict(PHASES)
_BUILTIN_SCHEMA: dict[str, type[BaseModel] | None] = {
    "intentions": intentions.Intention,
    "resolution": resolution.Resolution,
    "narrative": narrative.Narrative,
    "apply": None,
    "memory": memory.MemorySummary,
    "reflection": reflection.Reflection,
    "conversation": conversation.Utterance,
    "planning": planning.Plan,
}
#: a built-in phase -> the phases that must run before it, and why
REQUIRES: dict[str, tuple[tuple[str, str], ...]] = {
    "resolution": (("intentions", "it resolves the intentions"),),
    "narrative": (("intentions", "it tells what was intended and what happened"),),
    "apply": (("intentions", "it records what each character meant to do"),),
    "memory": (("apply", "it folds the memories apply writes"),),
    "reflection": (("apply", "it reflects on the memories apply writes and rates"),),
    "conversation": (("intentions", "a conversation opens from an intention to speak"),),
}


@dataclass(frozen=True)
class PhaseSpec:
    """One phase of the tick as the runner sees it.

    Attributes:
        name: the phase's name (log records, usage, chain keys).
        run: runs it on a tick's context.
        templates: names (in ``prompts/``) of the templates it renders.
        schema: its answer schema (digested in the tick log), if it has a fixed one.
        kind: ``builtin``, ``declared`` or ``entry-point``.
        per: a declared or entry-point phase's subjects, when one at a place at a time:
            ``character`` or ``location`` (``sim tick --workers`` runs it on each shard;
            a declared one's query tools look only where its subject is); ``None``: the
            world (or a phase that does not say).
    """

    name: str
    run: PhaseRun
    templates: tuple[str, ...] = ()
    schema: type[BaseModel] | None = None
    kind: str = "builtin"
    declared: DeclaredPhase | None = field(default=None, compare=False)
    per: str | None = None


#: the subjects of a phase that is about one place at a time (``PhaseSpec.per``)
PER_PLACE = ("character", "location")


def _config_source(root: Path | None) -> Path:
    if root is not None and (root / "config.toml").is_file():
        return root / "config.toml"
    return Path("config.toml")


def check_order(names: tuple[str, ...], source: Path | None = None) -> None:
    """Refuse a phase list the engine cannot run, naming the problem.

    Raises:
        InputError: no phases, a phase twice, a built-in before what it needs.
    """
    if not names:
        raise InputError(source, "tick.phases", "expected at least one phase")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InputError(source, "tick.phases", f"{name!r} is listed twice")
        for needed, why in REQUIRES.get(name, ()):
            if needed not in seen:
                problem = (
                    f"{name!r} must come after {needed!r} ({why})"
                    if needed in names
                    else f"{name!r} needs {needed!r} earlier in the list ({why})"
                )
                raise InputError(source, "tick.phases", problem)
        seen.add(name)


def check_memory(config: Config, source: Path | None = None) -> None:
    """Refuse a ``[memory.phases.<name>]`` for a phase the tick does not run, and
    ``embeddings = "provider"`` for a phase that retrieves on an endpoint sim fetches no
    embeddings from (its kind's profile says whether they are fetched, with
    ``embedding_model`` named, or hashed locally, as the offline provider's are).

    Raises:
        InputError: naming the phase, its provider and the field.
    """
    declared = tuple(config.phases)
    for name in config.memory.phases:
        if name not in config.tick.phases:
            raise InputError(
                source,
                f"memory.phases.{name}",
                f"{name!r} is not in [tick] phases (now: {', '.join(config.tick.phases)})",
            )
    for name in ("intentions", "planning", "reflection", *declared):
        memory = config.memory.for_phase(name)
        if name not in config.tick.phases or memory.embeddings != "provider":
            continue
        if name != "reflection" and not memory_strategy(memory.mode).uses_situation:
            continue  # reflection always retrieves
        provider = config.call_settings(phase_section(name, declared)).provider
        kind = routing(config).endpoints[provider].kind
        embeddings = profile(kind).embeddings
        if embeddings == "hashed":
            continue
        if embeddings != "fetched":
            fetching = [k for k in selectable_kinds() if profile(k).embeddings == "fetched"]
            raise InputError(
                source,
                "memory.embeddings",
                f"phase {name!r} runs on provider {kind!r}, whose embeddings sim does not "
                f"fetch (only {', '.join(fetching)} endpoints'); use "
                'embeddings = "none" (lexical relevance), or run the phase on one of those',
            )
        if memory.embedding_model is None:
            override = config.memory.phases.get(name)
            field_name = (
                f"memory.phases.{name}.embedding_model"
                if override is not None and override.embeddings == "provider"
                else "memory.embedding_model"
            )
            raise InputError(
                source,
                field_name,
                f'phase {name!r} retrieves with memory.embeddings = "provider" on its '
                f"{kind!r} endpoint: name the embedding model, e.g. "
                f'embedding_model = "{profile(kind).embedding_example or "..."}"',
            )


#: phases every later one depends on: they run every tick
_EVERY_TICK = ("intentions", "resolution", "narrative", "conversation")


def check_when(config: Config, source: Path | None = None) -> None:
    """Refuse a ``when`` without ``[time]``, or on a phase the tick cannot do without.

    Raises:
        InputError: naming the section.
    """
    declared = tuple(config.phases)
    for name in config.tick.phases:
        if name == "apply" or (name not in BUILTIN_PHASES and name not in declared):
            continue
        section = phase_section(name, declared)
        if not config.phase(section).when:
            continue
        if name in _EVERY_TICK:
            raise InputError(
                source, f"{section}.when", f"{name!r} runs every tick (later phases need it)"
            )
        if config.time is None:
            raise InputError(
                source, f"{section}.when", "needs [time] (start, tick) to know when a tick is"
            )
    if "planning" in config.tick.phases and config.time is None:
        raise InputError(
            source, "tick.phases", "'planning' needs [time] (start, tick): plans are timed"
        )


def _timed(name: str, run: PhaseRun, when: tuple[str, ...]) -> PhaseRun:
    """``run`` only in ticks that contain one of ``when``'s in-world times; in the others
    the phase reports that it made no calls."""

    async def timed(ctx: TickContext) -> None:
        time = ctx.config.time
        if time is not None and not time.clock().due(ctx.tick, when):
            ctx.report(name)
            return
        await run(ctx)

    return timed


def resolve_phases(config: Config, root: Path) -> list[PhaseSpec]:
    """The configured phase list, ready to run, checked.

    Raises:
        InputError: an impossible order, an unknown phase, a declared phase that is not
            listed, a bad template path, schema or ``writes``, a broken entry point.
    """
    source = _config_source(root)
    names = config.tick.phases
    check_order(names, source)
    for name in config.phases:
        if name not in names:
            raise InputError(
                source,
                f"phases.{name}",
                "declared but not in [tick] phases; add it where it should run "
                f"(now: {', '.join(names)})",
            )
    check_memory(config, source)
    check_when(config, source)
    plugins: dict[str, object] | None = None
    specs: list[PhaseSpec] = []
    for name in names:
        if name in BUILTIN_PHASES:
            templates = () if name == "apply" else (f"{name}.md", f"{name}.input.md")
            schema = _BUILTIN_SCHEMA[name]
            if name == "intentions":
                schema = intentions.intention_schema(messages.actions(config))
            elif name == "resolution":
                schema = resolution.resolution_schema(config)
            specs.append(PhaseSpec(name, _BUILTIN_RUN[name], templates, schema))
            continue
        declared = config.phases.get(name)
        if declared is not None and (declared.schema_ or declared.instructions):
            phase = DeclaredPhase(name, declared, root, source)
            per = phase.per if phase.per in PER_PLACE else None
            specs.append(
                PhaseSpec(
                    name, _runner(phase), phase.templates, phase.schema, "declared", phase, per
                )
            )
            continue
        if plugins is None:
            plugins = dict(entry_point_phases())
        ep = plugins.get(name)
        if ep is None:
            raise InputError(
                source,
                "tick.phases",
                f"unknown phase {name!r}: not built in ({', '.join(BUILTIN_PHASES)}), "
                f"no [phases.{name}] with instructions and schema, and no installed package "
                "offers it (entry-point group 'sim.phases')",
            )
        if declared is not None and declared.tools:
            raise InputError(
                source,
                f"phases.{name}.tools",
                f"phase {name!r} comes from a package (entry point); tools are for phases "
                "declared with instructions and schema",
            )
        plugin = load_entry_point(ep)  # type: ignore[arg-type]
        schema = getattr(plugin, "schema", None)
        per = getattr(plugin, "per", None)
        specs.append(
            PhaseSpec(
                name,
                _runner(plugin),
                tuple(getattr(plugin, "templates", ()) or ()),
                schema if isinstance(schema, type) and issubclass(schema, BaseModel) else None,
                "entry-point",
                per=per if isinstance(per, str) and per in PER_PLACE else None,
            )
        )
    declared_names = tuple(config.phases)
    for i, spec in enumerate(specs):
        if spec.name == "apply" or (
            spec.name not in BUILTIN_PHASES and spec.name not in declared_names
        ):
            continue
        when = config.phase(phase_section(spec.name, declared_names)).when
        if when:
            specs[i] = replace(spec, run=_timed(spec.name, spec.run, when))
    return specs


def _runner(phase: Phase) -> PhaseRun:
    async def run(ctx: TickContext) -> None:
        await run_phase(phase, ctx)

    return run


def manifest(specs: list[PhaseSpec], prompts: Prompts) -> dict[str, Any]:
    """What the tick log's header records about the phases: the list, each template's
    digest (the world's or the built-in; partials in ``prompts/`` too) and each schema's."""
    names = tuple(name for spec in specs for name in spec.templates)
    templates = prompts.snapshot(names)
    schemas: dict[str, str] = {}
    for spec in specs:
        if spec.declared is not None:
            schemas[spec.name] = digest(spec.declared.schema_bytes)
        elif spec.schema is not None:
            schemas[spec.name] = schema_digest(spec.schema)
    return {"phases": [s.name for s in specs], "templates": templates, "schemas": schemas}


__all__ = [
    "DEFAULT_ORDER",
    "PHASES",
    "Phase",
    "PhaseSpec",
    "TickContext",
    "check_order",
    "manifest",
    "resolve_phases",
]
