"""``sim check`` for phases and prompts: resolve the phase list and render every template
against every entity it applies to, before any call is paid for."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from sim.config import BUILTIN_PHASES, Config
from sim.llm.enums import constrain
from sim.offline import generate
from sim.phases import PhaseSpec, resolve_phases
from sim.phases.base import TickContext, public
from sim.phases.declared import DeclaredPhase
from sim.phases.intentions import Intention
from sim.phases.intentions import template_context as intention_context
from sim.phases.refs import DeclaredRefs
from sim.phases.resolution import Resolution
from sim.phases.resolution import template_context as place_context
from sim.phases.templates import PROMPTS, Prompts, TemplateError
from sim.world import Entity, World


@dataclass
class PhaseCheck:
    """What checking the phases found: the list, template errors, warnings."""

    phases: list[PhaseSpec] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    renders: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors


class _Collector:
    def __init__(self, prompts: Prompts, ctx: TickContext) -> None:
        self.prompts = prompts
        self.ctx = ctx
        self.renders = 0
        #: message -> subjects it happened for
        self.failures: dict[str, list[str]] = {}

    def render(self, template: str, subject: str, context: Callable[[], dict[str, Any]]) -> None:
        try:
            if template.endswith(".input.md") and not self.prompts.exists(template):
                return
            self.renders += 1
            self.prompts.render(template, {**self.ctx.base_context(), **context()})
        except TemplateError as exc:
            self.failures.setdefault(str(exc), []).append(subject)

    def errors(self) -> list[str]:
        out = []
        for message, subjects in self.failures.items():
            more = f", and {len(subjects) - 1} more" if len(subjects) > 1 else ""
            out.append(f"{message} (rendering for {subjects[0]}{more})")
        return out


def _check_builtin(name: str, c: _Collector, world: World, ctx: TickContext) -> None:
    templates = (f"{name}.md", f"{name}.input.md")
    if name == "conversation":
        for cid, char in world.characters.items():
            talk = {"location": char["state"]["location"], "participants": [cid], "lines": []}

            def talking(char: Entity = char, talk: dict[str, Any] = talk) -> dict[str, Any]:
                return {"speaker": public(char), "conversation": talk, "turn": 1}

            for template in templates:
                c.render(template, cid, talking)
    elif name == "planning":
        for cid, char in world.characters.items():

            def planning(char: Entity = char) -> dict[str, Any]:
                return {"character": public(char), "memory": char["memory"]}

            for template in templates:
                c.render(template, cid, planning)
    elif name == "reflection":
        for cid, char in world.characters.items():
            cells = char["memory"]["cells"][:1] or [{"tick": 0, "text": "..."}]

            def reflecting(char: Entity = char, cells: list[Any] = cells) -> dict[str, Any]:
                return {"character": public(char), "memory": char["memory"], "memories": cells}

            for template in templates:
                c.render(template, cid, reflecting)
    elif name in ("intentions", "memory"):
        for cid, char in world.characters.items():
            here = ctx.occupancy.get(char["state"]["location"], [])
            for template in templates:

                def context(char: Entity = char, here: list[str] = here) -> dict[str, Any]:
                    if name == "intentions":
                        return intention_context(world, char, here)
                    cells = char["memory"]["cells"][:1] or [{"tick": 0, "text": "..."}]
                    return {"character": public(char), "memory": char["memory"], "evicted": cells}

                c.render(template, cid, context)
    elif name in ("resolution", "narrative"):
        for lid in world.locations:
            for template in templates:

                def place(lid: str = lid) -> dict[str, Any]:
                    out = place_context(ctx, lid)
                    if name == "narrative":
                        out["resolution"] = Resolution.empty().model_dump()
                    return out

                c.render(template, lid, place)


def check_phases(config: Config, world: World) -> PhaseCheck:
    """Resolve the phase list and render each template for each entity it applies to.

    Raises:
        InputError: the phase list itself is impossible (order, unknown phase, schema,
            ``writes``); template problems are collected in ``errors`` instead.
    """
    result = PhaseCheck()
    result.phases = resolve_phases(config, world.root)
    prompts = Prompts(world.root)
    ctx = TickContext(world, config, cast(Any, None), cast(Any, None), world.tick + 1)
    ctx.prompts = prompts
    ctx.occupancy = world.characters_at()
    collector = _Collector(prompts, ctx)
    where = world.characters_at()
    for spec in result.phases:
        # what the tick holds when this phase runs: intentions only once that phase has run
        # (a template that needs `intention` before then fails here, as it would in a tick)
        if spec.name == "intentions":
            _check_builtin(spec.name, collector, world, ctx)
            ctx.intentions = {cid: Intention.fallback() for cid in world.characters}
            continue
        if spec.name in BUILTIN_PHASES:
            _check_builtin(spec.name, collector, world, ctx)
        elif spec.declared is not None:
            phase = spec.declared
            for subject in phase.subjects(ctx):
                sid = phase.subject_id(subject)
                for template in phase.templates:

                    def context(
                        subject: Entity = subject, phase: DeclaredPhase = phase
                    ) -> dict[str, Any]:
                        return phase.context(ctx, subject, where)

                    collector.render(template, f"{spec.name}:{sid}", context)
    result.errors = collector.errors()
    result.renders = collector.renders
    result.warnings = _unused_prompts(world.root, result.phases)
    for spec in result.phases:
        if spec.declared is not None and spec.declared.writes:
            result.warnings.extend(_try_writes(spec.declared, ctx))
    return result


def _try_writes(phase: DeclaredPhase, ctx: TickContext) -> list[str]:
    """Apply ``writes`` with sample answers (the offline model's) to a copy of the first
    subject: a field whose type cannot take the answer would be undone every tick."""
    subjects = list(phase.subjects(ctx))
    if not subjects:
        return []
    schema = phase.schema.model_json_schema()
    if phase.refs:  # a sample names what the subject may name (``x-sim-ref``), as offline does
        ids = phase.ref_ids(ctx, subjects[0], ctx.world.characters_at())
        schema = constrain(schema, DeclaredRefs(phase.refs, ids).enums())
    problems: dict[str, None] = {}
    for n in range(4):
        answer = phase.schema.model_validate(generate(schema, "", seed=f"check:{n}"))
        problem = phase.write(copy.deepcopy(subjects[0]), answer)
        if problem is not None:
            problems.setdefault(problem, None)
    return [
        f"phases.{phase.name}.writes: a sample answer would be refused ({problem}); "
        "check the answer field's type against the entity field's"
        for problem in problems
    ]


def template_syntax_problems(root: Path) -> list[TemplateError]:
    """Each of the world's top-level prompt templates that does not compile (file and
    line), found without the world: what ``sim check`` adds to the problems of a world
    that does not load, which would otherwise hide them until it does."""
    folder = root / PROMPTS
    if folder.is_symlink() or not folder.is_dir():
        return []  # a linked or missing folder: loading the world says so
    prompts = Prompts(root)
    problems = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or not path.name.endswith(".md"):
            continue
        try:
            prompts.get(path.name)
        except TemplateError as exc:
            problems.append(exc)
    return problems


def _unused_prompts(root: Path, phases: list[PhaseSpec]) -> list[str]:
    """A top-level prompt file no phase uses is probably misnamed: warn (``_name.md`` is a
    partial for ``{% include %}`` and is not warned about)."""
    folder = root / PROMPTS
    if not folder.is_dir():
        return []
    used = {name for spec in phases for name in spec.templates}
    names = ", ".join(spec.name for spec in phases)
    out = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith(("_", ".")) or not path.name.endswith(".md"):
            continue
        if path.name not in used:
            out.append(
                f"{path}: matches no phase of this world ({names}); it is not used "
                "(a partial for {% include %} should start with '_')"
            )
    return out
