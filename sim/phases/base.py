"""What every phase shares: the tick's working state, per-phase reports, LLM client setup."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import orjson
from pydantic import BaseModel

from sim import messages
from sim.config import phase_section, routing
from sim.errors import InputError, RunError
from sim.llm.batching import BatchOptions
from sim.llm.budget import Budget
from sim.llm.calls import CallNamer
from sim.llm.client import LLMClient, LLMRequest
from sim.llm.embedding import Embedder, EmbeddingSent
from sim.llm.errors import LLMError
from sim.llm.events import EventSink, null_sink
from sim.llm.recovery import RetryPolicy
from sim.llm.redact import redact_text
from sim.llm.store import ResponseStore
from sim.llm.streaming import StreamHub
from sim.llm.types import Adapter, Usage
from sim.mind.dayplan import plan_view
from sim.mind.retrieve import candidates, situation
from sim.mind.strategy import Recall, memory_strategy
from sim.mind.window import recent_lines
from sim.phases.happenings import Happenings
from sim.phases.templates import Prompts
from sim.providers import profile
from sim.world import (
    Character,
    CharacterIdentity,
    CharacterState,
    Location,
    LocationIdentity,
    LocationState,
    Memory,
    WorldMeta,
)

if TYPE_CHECKING:
    from sim.config import Config
    from sim.mind.vectors import VectorCache
    from sim.phases.intentions import Intention
    from sim.phases.resolution import Resolution
    from sim.world import Entity, World

#: template variables that do not change within a tick
STATIC_NAMES = frozenset({"world", "tick", "actions", "time"})
#: engine bookkeeping, never shown to a model
ENGINE_KEYS = frozenset({"_openai"})
_WORLD_ENGINE = frozenset({"tick", "seed"})
#: built-in phases that never show retrieved memory (``TickContext.prepare_memory``)
NOT_RETRIEVING = frozenset({"resolution", "narrative", "apply", "memory", "conversation"})


def _known(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(f.alias or name for name, f in model.model_fields.items())


_KNOWN = {
    "world": _known(WorldMeta),
    "character": _known(Character) | ENGINE_KEYS,
    "character.identity": _known(CharacterIdentity),
    "character.state": _known(CharacterState),
    "character.memory": _known(Memory),
    "location": _known(Location) | ENGINE_KEYS,
    "location.identity": _known(LocationIdentity),
    "location.state": _known(LocationState),
}


def extras(part: Any, kind: str) -> dict[str, Any]:
    """The fields of an entity part the engine does not know (a world's own fields)."""
    if not isinstance(part, dict):
        return {}
    known = _KNOWN[kind]
    if known.issuperset(part):  # the usual case: no field of the world's own
        return {}
    return {k: v for k, v in part.items() if k not in known}


def _add(view: dict[str, Any], more: dict[str, Any]) -> None:
    for key, value in more.items():
        view.setdefault(key, value)  # a known field of the same name wins


def world_view(world: World) -> dict[str, Any]:
    """``world.json`` as the model sees it: name, description and the world's own fields."""
    view = {"name": world.meta["name"], "description": world.meta.get("description", "")}
    _add(view, {k: v for k, v in extras(world.meta, "world").items() if k not in _WORLD_ENGINE})
    return view


def character_view(char: Entity, *, full: bool = True) -> dict[str, Any]:
    """A character as the model sees it: the known fields, then the world's own fields
    (``identity``, ``state`` and top level), so a custom ``age`` or secret goal reaches it.

    Args:
        full: description, mood and inventory too (a memory summary needs neither).
    """
    identity, state = char["identity"], char["state"]
    view: dict[str, Any] = {"id": identity["id"], "name": identity["name"]}
    if full:
        view["description"] = identity["description"]
    view["personality"] = identity["personality"]
    view["goals"] = identity["goals"]
    _add(view, extras(identity, "character.identity"))
    if full:
        view["mood"] = state["mood"]
        view["inventory"] = state["inventory"]
    _add(view, extras(state, "character.state"))
    _add(view, extras(char, "character"))
    return view


def own_fields(char: Entity) -> dict[str, Any]:
    """A character's own fields (``identity``, ``state``, top level), in that order."""
    view: dict[str, Any] = {}
    _add(view, extras(char["identity"], "character.identity"))
    _add(view, extras(char["state"], "character.state"))
    _add(view, extras(char, "character"))
    return view


def place_view(loc: Entity, *, objects: bool = True) -> dict[str, Any]:
    """A location as the model sees it (input documents of phases 1, 2a and 2b), with the
    world's own fields after the known ones."""
    view = {
        "id": loc["identity"]["id"],
        "name": loc["identity"]["name"],
        "description": loc["identity"]["description"],
        "atmosphere": loc["state"]["atmosphere"],
    }
    if objects:
        view["objects"] = loc["state"]["objects"]
    _add(view, extras(loc["identity"], "location.identity"))
    _add(view, extras(loc["state"], "location.state"))
    _add(view, extras(loc, "location"))
    return view


def memory_view(
    memory: dict[str, Any], recent: int, recalled: list[str] | None = None
) -> dict[str, Any]:
    """A character's memory as the model sees it: the summary, the last ``recent`` cells
    (or, retrieving, the ``recalled`` ones under ``recall``), and the world's own memory
    fields."""
    shown = {"recent": recent_lines(memory, recent)} if recalled is None else {"recall": recalled}
    return memory_shown(memory, shown)


def memory_shown(memory: dict[str, Any], shown: dict[str, list[str]]) -> dict[str, Any]:
    """A character's memory as the model sees it: the summary, what its memory strategy
    recalled (``shown``), and the world's own memory fields."""
    view: dict[str, Any] = {"summary": memory["summary"], **shown}
    _add(view, extras(memory, "character.memory"))
    return view


def public(entity: Entity) -> dict[str, Any]:
    """An entity for templates: every field but the engine's bookkeeping."""
    return {k: v for k, v in entity.items() if k not in ENGINE_KEYS}


def exits_view(world: World, loc: Entity) -> list[dict[str, str]]:
    """Where one can go from a location: connected ids with their names."""
    return [
        {"id": lid, "name": world.locations[lid]["identity"]["name"]}
        for lid in loc["state"]["connections"]
    ]


def to_json(data: Any) -> str:
    """Compact JSON for model input; key order as built, so inputs are reproducible."""
    return orjson.dumps(data).decode()


class PhaseAnswer(BaseModel, extra="forbid"):
    """Base of the built-in phases' answer models: no field beyond the declared ones (each
    names its own schema ``title``, so a class rename never changes the schema digest)."""


@dataclass
class PhaseReport:
    """What one phase did: calls, failures with their reasons, fallbacks, rule violations."""

    name: str
    calls: int = 0
    failures: int = 0
    usage: Usage = field(default_factory=Usage)
    fallbacks: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: failed attempts that were retried or handed to a fallback model
    retries: int = 0
    #: entity key -> "primary -> fallback" model, where a fallback model answered
    model_fallbacks: dict[str, str] = field(default_factory=dict)
    #: when a phase makes several calls per entity (tools-mode steps): the entities its
    #: calls decided for, which the failure fraction is taken over (0: one call each)
    entities: int = 0
    #: attempts that timed out on the client: no usage came back, the server may bill them
    timed_out: int = 0
    #: what the phase left undone, named for the tick's summary (apply: characters present
    #: at a place whom no outcome reached)
    gaps: list[str] = field(default_factory=list)

    def fail(self, entity_key: str, error: LLMError) -> None:
        self.failures += 1
        self.fallbacks.append(entity_key)
        # printed and logged: any URL the error quotes without its credentials
        self.errors[entity_key] = redact_text(f"{error.code}: {error}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "calls": self.calls,
            "failures": self.failures,
            "usage": self.usage.to_dict(),
            "fallbacks": self.fallbacks,
            "errors": self.errors,
            "warnings": self.warnings,
            "retries": self.retries,
            "model_fallbacks": self.model_fallbacks,
            "timed_out": self.timed_out,
            # only when there are any: a log with none reads as every log before it
            **({"gaps": self.gaps} if self.gaps else {}),
        }


@dataclass
class TickContext:
    """The working state of one tick, passed from phase to phase.

    Phases read the world, add their typed results here, and mutate entities in place.
    """

    world: World
    config: Config
    adapter: Adapter
    store: ResponseStore
    tick: int
    events: EventSink = null_sink
    #: names each call of the tick (the tick recorder's ``name_call``); ``None``: anonymous
    namer: CallNamer | None = None
    #: where the tick's streamed answer text goes (the runner's ``StreamHub``), when set
    stream: StreamHub | None = None
    intentions: dict[str, Intention] = field(default_factory=dict)
    resolutions: dict[str, Resolution] = field(default_factory=dict)
    narratives: dict[str, str] = field(default_factory=dict)
    occupancy: dict[str, list[str]] = field(default_factory=dict)
    reports: list[PhaseReport] = field(default_factory=list)
    clients: list[LLMClient] = field(default_factory=list)
    #: results of phases declared by the world or a package, by phase name (for the log)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    prompts: Prompts | None = None
    #: send phases' calls through the OpenAI Batch API (``[llm] batch``), when set
    batch: BatchOptions | None = None
    #: events injected for this tick (``sim inject``), shown in its inputs as ``happenings``
    happenings: Happenings = field(default_factory=Happenings)
    _static: dict[str, str] = field(default_factory=dict)
    _has_input: dict[str, bool] = field(default_factory=dict)
    _world_view: dict[str, Any] | None = None
    _outcomes: tuple[int, dict[str, str]] | None = None
    _time: tuple[int, dict[str, Any]] | None = None
    #: a provider's embeddings by model (``[memory] embeddings = "provider"``), this tick
    vectors: dict[str, VectorCache] = field(default_factory=dict)
    #: the characters this context runs the phases for when it holds one shard of the
    #: world (``sim tick --workers``: those at its locations as the tick began); ``None``:
    #: every character. The rest of the world is there to be read, not to be run.
    part: frozenset[str] | None = None
    #: the places it runs the phases for as one shard: those of its part (and, for the
    #: first shard, every place empty as the tick began); ``None``: every place
    places: frozenset[str] | None = None
    #: this tick's conversations, (opener, participants) each, as a sharded tick's
    #: coordinator chose them over the whole world before the phase (its cap is per tick:
    #: ``sim.phases.conversation.choose``); each shard holds those of its part. ``None``:
    #: the phase chooses them itself (one process)
    talks: list[tuple[str, list[str]]] | None = None
    #: how many calls a phase's client may have in flight, when not ``[llm]
    #: max_concurrency``: a shard's worker running a local model's calls itself, each of
    #: which waits for the coordinator to log it (``sim.engine.shard_worker``)
    in_flight: int | None = None

    def characters(self) -> list[Entity]:
        """The characters the phases of this context are about, in the world's order:
        all of them, or this shard's part (``part``)."""
        chars = self.world.characters
        if self.part is None:
            return list(chars.values())
        return [char for cid, char in chars.items() if cid in self.part]

    def locations(self) -> list[Entity]:
        """The places the phases of this context are about, in the world's order: all of
        them, or this shard's (``places``)."""
        places = self.world.locations
        if self.places is None:
            return list(places.values())
        return [loc for lid, loc in places.items() if lid in self.places]

    def take_results(
        self,
        intentions: dict[str, Intention],
        resolutions: dict[str, Resolution],
        results: dict[str, dict[str, Any]],
    ) -> None:
        """Hold every shard's results of the phases run so far as one process holds them
        (a sharded tick's coordinator, before a phase it runs by itself on the whole
        world: ``sim.engine.sharded_tick.take_over``)."""
        self.intentions = intentions
        self.resolutions = resolutions
        self.results.update(results)
        self._outcomes = None

    def drop_phase_state(self) -> None:
        """Let go of what only the phases use (their typed results, logged by then, and
        their caches) once all have run: a big world's commit then needs less memory."""
        self.intentions = {}
        self.resolutions = {}
        self.results = {}
        self.talks = None
        self.occupancy = {}
        self._static = {}
        self._has_input = {}
        self._world_view = None
        self._outcomes = None

    @property
    def templates(self) -> Prompts:
        if self.prompts is None:
            self.prompts = Prompts(self.world.root)
        return self.prompts

    def world_as_seen(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The world's fields (``world.json``), and the view of them this tick's models
        see (``world_view``, once built: ``None`` before), for a sharded tick's workers
        after a phase the coordinator ran on the whole world (``take_world``)."""
        return self.world.meta, self._world_view

    def take_world(self, meta: dict[str, Any], view: dict[str, Any] | None) -> None:
        """Hold the world's fields and their view as another shard's context holds them
        (``world_as_seen``), so this shard's next phases see the world as it does."""
        self.world.meta = meta
        self._world_view = view

    @property
    def world_view(self) -> dict[str, Any]:
        """The world as models see it, built once per tick; with ``[time]``, its ``time``
        (this tick's in-world time) after the description."""
        if self._world_view is None:
            view = world_view(self.world)
            now = self.time
            if now is not None:
                timed = {"name": view["name"], "description": view["description"], "time": now}
                for key, value in view.items():
                    timed.setdefault(key, value)
                view = timed
            self._world_view = view
        return self._world_view

    @property
    def time(self) -> dict[str, Any] | None:
        """This tick's in-world time (``[time]``): now, date, weekday, time, part of day,
        elapsed since tick 1; ``None`` when ticks are plain numbers."""
        if self.config.time is None:
            return None
        if self._time is None or self._time[0] != self.tick:
            try:
                self._time = (self.tick, self.config.time.clock().view(self.tick))
            except OverflowError:
                raise InputError(
                    None, "time", f"tick {self.tick} falls beyond the year 9999 of [time]"
                ) from None
        return self._time[1]

    def outcomes(self) -> dict[str, str]:
        """Character id -> this tick's resolved outcome text (the first one given), built
        once per set of resolutions rather than searched per character."""
        if self._outcomes is None or self._outcomes[0] != len(self.resolutions):
            found: dict[str, str] = {}
            for resolution in self.resolutions.values():
                for item in resolution.outcomes:
                    found.setdefault(item.character_id, item.outcome)
            self._outcomes = (len(self.resolutions), found)
        return self._outcomes[1]

    def base_context(self) -> dict[str, Any]:
        """What every template sees: ``world``, ``tick``, the world's ``actions`` and the
        in-world ``time`` (``None`` without ``[time]``)."""
        return {
            "world": self.world_view,
            "tick": self.tick,
            "actions": messages.actions(self.config),
            "time": self.time,
        }

    def memory_for(
        self, char: Entity, here: Sequence[str], happenings: Sequence[str], phase: str
    ) -> dict[str, Any]:
        """A character's memory as phase ``phase``'s input shows it: what its memory
        strategy recalls (``[memory] mode``; the built-ins: ``[memory] k`` cells, the last
        ones, ``window``, or the best for its situation, ``retrieve``)."""
        config = self.config.memory.for_phase(phase)
        strategy = memory_strategy(config.mode)
        request = Recall(char["memory"], config)
        if strategy.uses_situation:
            now = situation(self.world, char, here, happenings, self.tick)
            request = Recall(char["memory"], config, now, self.vectors_for(phase))
        view = memory_shown(char["memory"], strategy.recall(request))
        plan = plan_view(char["memory"], self.time)
        if plan is not None:  # the planning phase's plan for today: its item for now
            view["plan"] = plan
        return view

    def vectors_for(self, phase: str) -> VectorCache | None:
        """The provider embeddings phase ``phase`` scores relevance with: ``None`` unless
        its ``[memory] embeddings = "provider"`` and its model runs on a network
        endpoint (the offline provider's embeddings are hashed, ``sim.mind.embed``)."""
        memory = self.config.memory.for_phase(phase)
        if memory.embeddings != "provider" or memory.embedding_model is None:
            return None
        provider, _ = self._endpoint_of(phase)
        if profile(routing(self.config).endpoints[provider].kind).embeddings != "fetched":
            return None
        cache = self.vectors.get(memory.embedding_model)
        if cache is None:
            from sim.mind.vectors import VectorCache  # numpy: only where a phase needs it

            cache = self.vectors[memory.embedding_model] = VectorCache(
                self.world.root, memory.embedding_model
            )
        return cache

    def _endpoint_of(self, phase: str) -> tuple[str, float]:
        """The endpoint phase ``phase``'s model runs on, and its calls' timeout; for a
        phase without a section of its own (an installed one): ``[llm]``'s."""
        try:
            section = phase_section(phase, tuple(self.config.phases))
        except InputError:
            return routing(self.config).default, self.config.llm.timeout_seconds
        settings = self.config.call_settings(section)
        return settings.provider, settings.timeout_seconds

    def embedded(self, phase: str) -> VectorCache | None:
        """The provider embeddings phase ``phase`` retrieves with, which ``prepare_memory``
        fetches before it (``None``: it needs none)."""
        if phase in NOT_RETRIEVING:
            return None
        memory = self.config.memory.for_phase(phase)
        if phase != "reflection" and not memory_strategy(memory.mode).uses_situation:
            return None
        return self.vectors_for(phase)

    def embedding_texts(self, phase: str) -> list[tuple[str, list[str]]]:
        """Per character of this context (``characters()``), in the world's order, the
        texts phase ``phase``'s retrieval scores: its candidate cells, then its situation."""
        world = self.world
        where = world.characters_at()
        out = []
        for char in self.characters():
            lid = char["state"]["location"]
            texts = [c["text"] for c in candidates(char["memory"])]
            now = situation(world, char, where.get(lid, []), self.happenings.here(lid), self.tick)
            texts.append(now.text)
            out.append((char["identity"]["id"], texts))
        return out

    async def prepare_memory(
        self,
        phase: str,
        budget: Budget | None = None,
        embedder_of: Callable[[str], Embedder | None] | None = None,
        on_sent: Callable[[EmbeddingSent], None] | None = None,
        texts: Sequence[str] | None = None,
    ) -> None:
        """Before phase ``phase`` builds its inputs: fetch the provider embeddings its
        retrieval needs (every character's cells and situation) that the world's cache
        lacks, from the endpoint its model runs on (``embedder_of(endpoint name)``: the
        stack's, ``sim.engine.stack.Stack.embedder``), in a few batched requests (and
        count them against ``budget``; each answered request goes to ``on_sent``: the
        tick's log, ``sim.engine.recorder.TickRecorder.embedded``). Nothing for a phase
        that does not retrieve with a provider's embeddings. ``texts``: the texts to have
        vectors of, in the order one process finds them (a sharded tick's coordinator
        gives every shard's, ``sim.engine.sharded_tick``); ``None``: those of this context's
        characters (``embedding_texts``).

        Raises:
            RunError: the endpoint has no embeddings (a stack without one, as
                ``sim replay`` without ``--live`` when the cache lacks a text).
            LLMError: a request failed.
        """
        cache = self.embedded(phase)
        if cache is None:
            return
        if texts is None:
            texts = [text for _, some in self.embedding_texts(phase) for text in some]
        if not cache.missing(texts):
            return
        provider, timeout = self._endpoint_of(phase)
        embedder = embedder_of(provider) if embedder_of is not None else None
        if embedder is None:
            raise RunError(
                f"phase {phase!r} needs embeddings of {cache.model!r} that "
                f"{cache.rel} does not hold, and its endpoint fetches none here (`sim "
                "replay` sends nothing without --live)"
            )
        from sim.mind.vectors import fetch

        llm = self.config.llm
        retry = RetryPolicy(
            transient_retries=llm.transient_retries,
            backoff_base_seconds=llm.backoff_base_seconds,
            backoff_cap_seconds=llm.backoff_cap_seconds,
        )
        await fetch(
            cache, embedder, texts, timeout, budget, provider, retry, phase=phase, on_sent=on_sent
        )

    def report(self, name: str) -> PhaseReport:
        report = PhaseReport(name)
        self.reports.append(report)
        return report

    def refs_mode(self, section: str) -> Literal["schema", "validate"]:
        """How this phase's references are held to their ids (``sim.phases.refs``): the
        phase's ``constrain_refs``, else ``[llm]``'s, ``auto`` resolved for the provider
        its model runs on."""
        from sim.phases.refs import mode_for

        setting = self.config.phase(section).constrain_refs or self.config.llm.constrain_refs
        provider = self.config.call_settings(section).provider
        return mode_for(setting, routing(self.config).endpoints[provider].kind)

    def endpoint_kind(self, section: str) -> str:
        """The kind of the endpoint a config section's model runs on (``offline``, ...)."""
        return routing(self.config).endpoints[self.config.call_settings(section).provider].kind

    def client(self, section: str, entities: Sequence[Entity], phase: str) -> LLMClient:
        """An ``LLMClient`` for one phase, configured from its config section."""
        phase_config = self.config.phase(section)
        settings = self.config.call_settings(section)
        # a phase whose model runs on a provider without a Batch API runs live
        kind = routing(self.config).endpoints[settings.provider].kind
        batch = self.batch if profile(kind).batch_api else None
        client = LLMClient(
            self.adapter,  # routes each model to its endpoint (``sim.llm.router.Router``)
            entities,
            phase_config.response_chain_depth,
            settings=settings,
            store=self.store,
            chain_mode=self.config.llm.chain_mode,
            max_concurrency=self.in_flight or self.config.llm.max_concurrency,
            events=self.events,
            phase=phase,
            batch=batch,
            namer=self.namer,
            stream=self.stream,
        )
        self.clients.append(client)
        return client

    def render(self, template: str, context: Callable[[], dict[str, Any]]) -> str:
        """A template rendered for one subject; one that uses only ``world``, ``tick`` and
        ``actions`` is rendered once a tick (static instructions keep provider caching)."""
        text = self._static.get(template)
        if text is not None:
            return text
        prompts = self.templates
        if prompts.is_static(template, STATIC_NAMES):
            text = self._static[template] = prompts.render(template, self.base_context())
            return text
        return prompts.render(template, {**self.base_context(), **context()})

    def prompt(self, name: str, context: Callable[[], dict[str, Any]] | None = None) -> str:
        """The instructions for a phase: the template ``prompts/<name>.md`` (the world's,
        else the built-in) rendered for a subject."""
        return self.render(f"{name}.md", context or dict)

    def input_for(
        self, name: str, default: Callable[[], str], context: Callable[[], dict[str, Any]]
    ) -> str:
        """A subject's input: the world's ``prompts/<name>.input.md`` rendered, else the
        default JSON document."""
        template = f"{name}.input.md"
        has = self._has_input.get(template)
        if has is None:
            has = self._has_input[template] = self.templates.exists(template)
        return self.render(template, context) if has else default()

    def request(
        self,
        name: str,
        schema: type[BaseModel],
        entity_key: str,
        context: Callable[[], dict[str, Any]],
        default: Callable[[], str],
        **extra: Any,
    ) -> LLMRequest:
        """One subject's request for built-in phase ``name``: its instructions and input
        rendered from the world's templates (else the defaults), chained on ``entity_key``
        (``extra``: ``LLMRequest``'s other fields: tools, enums, check)."""
        instructions = self.prompt(name, context)
        return LLMRequest(
            instructions, self.input_for(name, default, context), schema, entity_key, **extra
        )


async def ask(client: LLMClient, requests: Sequence[LLMRequest], report: PhaseReport) -> list[Any]:
    """Send one phase's batch and count its calls; results in request order."""
    results = await client.create_batch(requests)
    report.calls += len(requests)
    return results
