"""A phase a world declares in ``[phases.<name>]``: templates, a JSON Schema, writes.

::

    [phases.opinion]
    per = "character"                     # character | location | world
    instructions = "prompts/opinion.md"   # template
    input = "prompts/opinion.input.md"    # optional; default: the subject's JSON view
    schema = "schemas/opinion.json"       # JSON Schema of the answer
    writes = { "state.stance" = "stance" }   # entity field <- answer field
    tools = ["look", "recall"]            # optional: query tools from the registry

Each subject gets one request (chain key ``opinion:<id>``); with ``tools``, a conversation
of steps instead (``sim.phases.tool_steps``): the model may call the named query tools,
which the engine answers from the world, up to ``max_tool_steps`` times, and answers by
calling ``answer`` (its parameters are the answer schema). After the batch, ``writes``
copies answer fields into the subject entity; a write that would make the entity invalid
(by the same models ``Storage`` loads with) is undone and reported, so what commits is
always a valid world. Fields the engine relies on (ids, a character's location, a place's
connections, memory, chains, the tick) cannot be written.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import orjson
from pydantic import BaseModel, ValidationError

from sim.config import DeclaredPhaseConfig
from sim.errors import InputError
from sim.llm.client import LLMClient, LLMRequest
from sim.llm.errors import LLMError, LLMSchemaError
from sim.llm.tools import FunctionCall, ToolCalls, ToolDeclaration
from sim.phases.base import (
    TickContext,
    character_view,
    exits_view,
    place_view,
    public,
    to_json,
)
from sim.phases.files import read_world_file
from sim.phases.intention_steps import answer_query, look_from
from sim.phases.intention_tools import UnknownToolError
from sim.phases.refs import DeclaredRefs, check_for, subject_ids
from sim.phases.schema import answer_field, load_schema, ref_fields, without_refs
from sim.phases.templates import template_name
from sim.phases.tool_registry import ANSWER, declared_tools
from sim.phases.tool_steps import converse
from sim.providers import profile
from sim.world import (
    Character,
    Entity,
    Location,
    WorldMeta,
    relationship_problems,
    relationships_view,
)

#: entity fields a phase may not write: what the engine's rules and files depend on
PROTECTED = {
    "character": ("identity.id", "state.location", "memory", "_openai"),
    "location": ("identity.id", "state.connections", "_openai"),
    "world": ("tick", "seed", "name"),
}
_VALIDATORS: dict[str, type[BaseModel]] = {
    "character": Character,
    "location": Location,
    "world": WorldMeta,
}


_ABSENT = object()


#: the ``writes`` target that merges relationship updates into a character's relationships
RELATIONSHIPS = ("relationships",)
#: the field of a relationship update naming the other character
TO = "to"


@dataclass(frozen=True)
class Write:
    """One ``writes`` entry: entity field path <- answer field path. A write to
    ``relationships`` merges a list of updates ``{"to": id, <field>: value, ...}``."""

    target: tuple[str, ...]
    answer: tuple[str, ...]

    @property
    def merges_relationships(self) -> bool:
        return self.target == RELATIONSHIPS


def _item_model(annotation: Any) -> Any:
    """The item model of a list-of-objects answer field (``None`` for any other type)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _item_model(args[0])
    if origin in (Union, UnionType):
        found = [_item_model(a) for a in args if a is not type(None)]
        return found[0] if len(found) == 1 else None
    if origin is list and args:
        item = args[0]
        item = get_args(item)[0] if get_origin(item) is Annotated else item
        return item if isinstance(item, type) and issubclass(item, BaseModel) else None
    return None


def _path(text: str) -> tuple[str, ...]:
    return tuple(text.split("."))


def parse_writes(
    writes: Mapping[str, str], per: str, schema: type[BaseModel], source: Path, name: str
) -> tuple[Write, ...]:
    """Check ``writes`` against the subject kind and the answer schema.

    Raises:
        InputError: a protected or malformed target, an answer field the schema lacks.
    """
    out: list[Write] = []
    for target, answer in writes.items():
        where = f"phases.{name}.writes.{target}"
        parts = _path(target)
        if not all(p.isidentifier() or p.replace("-", "_").isidentifier() for p in parts):
            raise InputError(source, where, "expected a dotted field path like state.stance")
        dotted = ".".join(parts)
        for protected in PROTECTED[per]:
            if dotted == protected or dotted.startswith(protected + "."):
                raise InputError(
                    source, where, f"{protected} is the engine's; it cannot be written"
                )
        fields = _path(answer)
        model: Any = schema
        for i, part in enumerate(fields):
            known = getattr(model, "model_fields", None)
            attribute = None if known is None else answer_field(model, part)
            if known is None or attribute is None:
                raise InputError(
                    source, where, f"the answer schema has no field {'.'.join(fields[: i + 1])!r}"
                )
            model = known[attribute].annotation
        if parts == RELATIONSHIPS:
            item = _item_model(model)
            if per != "character" or item is None or answer_field(item, TO) is None:
                raise InputError(
                    source,
                    where,
                    "relationships takes a list of updates: the answer field must be an "
                    f'array of objects with a "{TO}" property (the other character\'s id), '
                    "in a phase per character",
                )
        out.append(Write(parts, fields))
    return tuple(out)


def _get(answer: Any, path: tuple[str, ...]) -> Any:
    value = answer
    for part in path:
        attribute = answer_field(type(value), part) if isinstance(value, BaseModel) else None
        value = None if attribute is None else getattr(value, attribute, None)
    if isinstance(value, list):
        return [v.model_dump(mode="json") if isinstance(v, BaseModel) else v for v in value]
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def _merge_relationships(
    entity: dict[str, Any], updates: Any, known: Collection[str] | None
) -> str | None:
    """Merge ``[{"to": id, <field>: value}]`` into ``entity["relationships"]``: a field
    given (not null) replaces the one held; a new id starts a relationship. ``known``: the
    world's character ids (``None``: do not check the references)."""
    me = entity["identity"]["id"]
    ties = entity.get("relationships")
    ties = {} if ties is None else ties
    for update in updates or ():
        other = update.get(TO)
        if known is not None and (other == me or other not in known):
            return f"relationships: {other!r} is not another character of this world"
        fields = {k: v for k, v in update.items() if k != TO and v is not None}
        current = ties.get(other)
        ties[other] = {**current, **fields} if isinstance(current, dict) else fields
    if ties:
        entity["relationships"] = ties
    return None


def _set(entity: dict[str, Any], path: tuple[str, ...], value: Any) -> str | None:
    node = entity
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            return f"{'.'.join(path)}: {part} is not an object"
        node = child
    node[path[-1]] = value
    return None


def answer_tool(phase: str, schema_file: bytes) -> ToolDeclaration:
    """The tool a declared phase's model calls to answer: its parameters are the phase's
    answer schema as the world wrote it (without ``$schema``/``$id``)."""
    raw = without_refs(orjson.loads(schema_file))
    parameters = {k: v for k, v in raw.items() if k not in ("$schema", "$id")}
    return ToolDeclaration(
        name=ANSWER,
        description=f"Give your answer for {phase}: call this once you have decided.",
        parameters=parameters,
    )


class DeclaredPhase:
    """A ``[phases.<name>]`` phase (follows ``sim.phases.protocol.Phase``)."""

    def __init__(self, name: str, config: DeclaredPhaseConfig, root: Path, source: Path) -> None:
        self.name = name
        self.per = config.per
        if not config.instructions:
            raise InputError(source, f"phases.{name}.instructions", "required: a template path")
        if not config.schema_:
            raise InputError(source, f"phases.{name}.schema", "required: a JSON Schema path")
        self.instructions = template_name(
            config.instructions, source, f"phases.{name}.instructions"
        )
        self.input = (
            template_name(config.input, source, f"phases.{name}.input") if config.input else None
        )
        data = read_world_file(root, config.schema_, field=f"phases.{name}.schema", source=source)
        self.schema_bytes = data
        self.schema = load_schema(data, name, root / config.schema_)
        #: the answer fields marked ``x-sim-ref`` (checked: the schema loaded)
        self.refs = ref_fields(orjson.loads(data))
        self.writes = parse_writes(config.writes, self.per, self.schema, source, name)
        #: query tools the model may call before answering (none: one call per subject)
        self.tools = declared_tools(config.tools, self.per, source, name) if config.tools else ()
        self.max_tool_steps = config.max_tool_steps
        self.answer_tool = answer_tool(name, data) if self.tools else None

    @property
    def templates(self) -> tuple[str, ...]:
        return (self.instructions, *([self.input] if self.input else []))

    # -- the protocol ----------------------------------------------------------------------

    def subjects(self, ctx: TickContext) -> Sequence[Entity]:
        if self.per == "character":
            return ctx.characters()
        if self.per == "location":
            return ctx.locations()
        return [ctx.world.meta]

    def subject_id(self, subject: Entity) -> str:
        return "world" if self.per == "world" else str(subject["identity"]["id"])

    def context(
        self, ctx: TickContext, subject: Entity, where: Mapping[str, list[str]]
    ) -> dict[str, Any]:
        """What this phase's templates see for one subject (``where``: location id -> ids
        of the characters there now)."""
        world = ctx.world
        if self.per == "world":
            return {
                "characters": [public(c) for c in world.characters.values()],
                "locations": [public(loc) for loc in world.locations.values()],
                "happenings": self._all_happenings(ctx),
            }
        if self.per == "location":
            lid = subject["identity"]["id"]
            here = [world.characters[c] for c in where.get(lid, [])]
            return {
                "location": public(subject),
                "exits": exits_view(world, subject),
                "present": [public(c) for c in here],
                "happenings": ctx.happenings.here(lid),
            }
        cid = subject["identity"]["id"]
        loc = world.locations[subject["state"]["location"]]
        here = [world.characters[c] for c in where.get(loc["identity"]["id"], [])]
        intention = ctx.intentions.get(cid)
        return {
            "character": public(subject),
            "memory": subject["memory"],
            "location": public(loc),
            "exits": exits_view(world, loc),
            "present": [public(c) for c in here if c is not subject],
            "intention": intention.model_dump() if intention is not None else None,
            "outcome": self._outcome(ctx, cid),
            "happenings": ctx.happenings.here(loc["identity"]["id"]),
        }

    @staticmethod
    def _all_happenings(ctx: TickContext) -> list[dict[str, Any]]:
        """Every event injected this tick: ``{"at": location id or null, "text"}``."""
        return [{"at": at, "text": text} for at, text in ctx.happenings.all]

    @staticmethod
    def _outcome(ctx: TickContext, cid: str) -> str | None:
        return ctx.outcomes().get(cid)

    @staticmethod
    def _brief(char: Entity) -> dict[str, Any]:
        return {
            "id": char["identity"]["id"],
            "name": char["identity"]["name"],
            "mood": char["state"]["mood"],
        }

    def default_input(
        self, ctx: TickContext, subject: Entity, where: Mapping[str, list[str]]
    ) -> str:
        """The subject's JSON view: the subject first (the offline model takes its words
        from the start of the input), then this tick so far, then the world."""
        world = ctx.world
        doc: dict[str, Any] = {}
        if self.per == "character":
            cid = subject["identity"]["id"]
            loc = world.locations[subject["state"]["location"]]
            intention = ctx.intentions.get(cid)
            doc["character"] = character_view(subject)
            lid = loc["identity"]["id"]
            here = ctx.happenings.here(lid)
            doc["memory"] = ctx.memory_for(subject, where.get(lid, [cid]), here, self.name)
            if intention is not None:
                doc["intention"] = intention.model_dump()
            outcome = self._outcome(ctx, cid)
            if outcome is not None:
                doc["outcome"] = outcome
            doc["location"] = place_view(loc)
            doc["present"] = [
                self._brief(world.characters[c])
                for c in where.get(loc["identity"]["id"], [])
                if c != cid
            ]
            ties = relationships_view(world, subject)
            if ties:
                doc["relationships"] = ties
        elif self.per == "location":
            lid = subject["identity"]["id"]
            doc["location"] = place_view(subject)
            doc["exits"] = exits_view(world, subject)
            doc["present"] = [self._brief(world.characters[c]) for c in where.get(lid, [])]
        else:
            doc["characters"] = [
                {
                    "id": c["identity"]["id"],
                    "name": c["identity"]["name"],
                    "location": c["state"]["location"],
                    "mood": c["state"]["mood"],
                }
                for c in world.characters.values()
            ]
            doc["locations"] = [
                {"id": lid, "name": loc["identity"]["name"]} for lid, loc in world.locations.items()
            ]
        if self.per == "world":
            events: list[Any] = self._all_happenings(ctx)
        else:
            lid = subject["identity"]["id"] if self.per == "location" else None
            events = ctx.happenings.here(lid or subject["state"]["location"])
        if events:  # injected by `sim inject`; left out when none
            doc["happenings"] = events
        doc["world"] = ctx.world_view
        doc["tick"] = ctx.tick
        return to_json(doc)

    def ref_ids(
        self, ctx: TickContext, subject: Entity, where: Mapping[str, list[str]]
    ) -> dict[str, tuple[str, ...]]:
        """The ids each ``x-sim-ref`` kind may name for one subject (``REF_KINDS``)."""
        return subject_ids(ctx.world, {kind for _, kind in self.refs}, self.per, subject, where)

    def requests(self, ctx: TickContext, subjects: Sequence[Entity]) -> Sequence[LLMRequest]:
        out = []
        where = ctx.world.characters_at()  # now: apply may have moved people
        # the offline model is bound by the ids as enums (it has no other way to know
        # them), whatever the mode: nothing goes on a wire
        section = f"phases.{self.name}"
        constrain = (
            bool(self.refs)
            and self.answer_tool is None
            and (
                ctx.refs_mode(section) == "schema"
                or profile(ctx.endpoint_kind(section)).refs_as_enums
            )
        )
        for subject in subjects:

            def context(subject: Entity = subject) -> dict[str, Any]:
                return self.context(ctx, subject, where)

            def default(subject: Entity = subject) -> str:
                return self.default_input(ctx, subject, where)

            instructions = ctx.render(self.instructions, context)
            text = ctx.render(self.input, context) if self.input else default()
            key = f"{self.name}:{self.subject_id(subject)}"
            tools = (self.answer_tool, *self.tools) if self.answer_tool is not None else None
            refs = DeclaredRefs(self.refs, self.ref_ids(ctx, subject, where)) if self.refs else None
            out.append(
                LLMRequest(
                    instructions,
                    text,
                    self.schema,
                    key,
                    tools=tools,
                    enums=refs.enums() if refs is not None and constrain else None,
                    check=check_for(refs.problem) if refs is not None else None,
                )
            )
        return out

    async def ask(
        self,
        ctx: TickContext,
        client: LLMClient,
        subjects: Sequence[Entity],
        requests: Sequence[LLMRequest],
    ) -> tuple[list[Any], int]:
        """With ``tools``: each subject's conversation of query steps, then its answer
        (the ``answer`` call's arguments as the schema's model, or an ``LLMError``).
        Without: one batch."""
        if self.answer_tool is None:
            return list(await client.create_batch(requests)), len(requests)
        world = ctx.world
        where = world.characters_at()

        def answer(i: int, call: FunctionCall) -> dict[str, Any]:
            subject = subjects[i]
            if self.per == "character":
                here = where.get(subject["state"]["location"], [])
                return answer_query(world, subject, here, call)
            here = where.get(subject["identity"]["id"], [])  # a location: it can only look
            return look_from(world, subject, here, str(call.arguments.get("target") or ""))

        results, calls = await converse(
            client,
            requests,
            finals=(self.answer_tool,),
            queries=self.tools,
            answer=answer,
            max_steps=self.max_tool_steps,
        )
        return [self._answer(result) for result in results], calls

    def _answer(self, result: Any) -> Any:
        """The ``answer`` call of a subject's last step, validated by the answer schema."""
        if not isinstance(result, ToolCalls):
            return result  # an LLMError
        for call in result.calls:
            if call.name == ANSWER:
                try:
                    return self.schema.model_validate(call.arguments)
                except ValidationError as exc:
                    err = exc.errors()[0]
                    where = ".".join(str(p) for p in err["loc"]) or "(root)"
                    return LLMSchemaError(
                        f"the answer of phase {self.name!r} does not fit its schema: "
                        f"{where}: {err['msg'].lower()}"
                    )
        names = ", ".join(call.name for call in result.calls) or "no call"
        return UnknownToolError(f"the model did not call {ANSWER} ({names}); ignored")

    def apply(
        self, ctx: TickContext, subjects: Sequence[Entity], results: Sequence[Any]
    ) -> Mapping[str, Any]:
        logged: dict[str, Any] = {}
        report = ctx.reports[-1]
        for subject, result in zip(subjects, results, strict=True):
            if isinstance(result, LLMError) or not isinstance(result, BaseModel):
                continue  # fallback: nothing written for this subject this tick
            sid = self.subject_id(subject)
            logged[sid] = result.model_dump(mode="json")
            if not self.writes:
                continue
            problem = self.write(subject, result, ctx.world.characters)
            if problem is not None:
                report.warnings.append(f"{self.name}:{sid}: writes ignored: {problem}")
        return logged

    def write(
        self, subject: Entity, answer: BaseModel, known: Collection[str] | None = None
    ) -> str | None:
        """Apply ``writes`` to one subject; undo them all and say why if the entity would
        not be valid (by the models ``Storage`` loads with), or a relationship would name
        no other character of ``known`` (the world's character ids; ``None``: unchecked).
        Only the top-level parts the writes touch are copied for the undo."""
        before = {
            key: copy.deepcopy(subject[key]) if key in subject else _ABSENT
            for key in dict.fromkeys(w.target[0] for w in self.writes)
        }
        problem = None
        for write in self.writes:
            value = copy.deepcopy(_get(answer, write.answer))
            if write.merges_relationships:
                problem = _merge_relationships(subject, value, known)
            else:
                problem = _set(subject, write.target, value)
            if problem:
                break
        if problem is None:
            try:
                _VALIDATORS[self.per].model_validate(subject)
            except ValidationError as exc:
                err = exc.errors()[0]
                problem = f"{'.'.join(str(p) for p in err['loc'])}: {err['msg'].lower()}"
        if problem is None and self.per == "character" and known is not None:
            cid = subject["identity"]["id"]
            # ``known`` as it is (a world's characters by id): a set of it made for each
            # subject cost O(characters) a subject, 30 s a tick at 40,000 characters
            for _, field, message in relationship_problems({cid: subject}, known):
                problem = f"{field}: {message}"
                break
        if problem is not None:
            for key, value in before.items():
                if value is _ABSENT:
                    subject.pop(key, None)
                else:
                    subject[key] = value
        return problem
