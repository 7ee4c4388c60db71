"""What every phase shares: the tick's working state, per-phase reports, LLM client setup."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from sim.llm.client import LLMClient
from sim.llm.errors import LLMError
from sim.llm.events import EventSink, null_sink
from sim.llm.store import ResponseStore
from sim.llm.types import Adapter, Usage

if TYPE_CHECKING:
    from sim.config import Config
    from sim.phases.intentions import Intention
    from sim.phases.resolution import Resolution
    from sim.world import Entity, World

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"


def place_view(loc: Entity, *, objects: bool = True) -> dict[str, Any]:
    """A location as the model sees it (input documents of phases 1, 2a and 2b)."""
    view = {
        "id": loc["identity"]["id"],
        "name": loc["identity"]["name"],
        "description": loc["identity"]["description"],
        "atmosphere": loc["state"]["atmosphere"],
    }
    if objects:
        view["objects"] = loc["state"]["objects"]
    return view


def exits_view(world: World, loc: Entity) -> list[dict[str, str]]:
    """Where one can go from a location: connected ids with their names."""
    return [
        {"id": lid, "name": world.locations[lid]["identity"]["name"]}
        for lid in loc["state"]["connections"]
    ]


def to_json(data: Any) -> str:
    """Compact JSON for model input; key order as built, so inputs are reproducible."""
    return orjson.dumps(data).decode()


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
    #: attempts that timed out on the client: no usage came back, the server may bill them
    timed_out: int = 0

    def fail(self, entity_key: str, error: LLMError) -> None:
        self.failures += 1
        self.fallbacks.append(entity_key)
        self.errors[entity_key] = f"{error.code}: {error}"

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
    intentions: dict[str, Intention] = field(default_factory=dict)
    resolutions: dict[str, Resolution] = field(default_factory=dict)
    narratives: dict[str, str] = field(default_factory=dict)
    occupancy: dict[str, list[str]] = field(default_factory=dict)
    reports: list[PhaseReport] = field(default_factory=list)
    clients: list[LLMClient] = field(default_factory=list)
    _prompts: dict[str, str] = field(default_factory=dict)

    def report(self, name: str) -> PhaseReport:
        report = PhaseReport(name)
        self.reports.append(report)
        return report

    def client(self, section: str, entities: Sequence[Entity], phase: str) -> LLMClient:
        """An ``LLMClient`` for one phase, configured from its config section."""
        phase_config = self.config.phase(section)
        client = LLMClient(
            self.adapter,
            entities,
            phase_config.response_chain_depth,
            settings=phase_config.settings(self.config.llm),
            store=self.store,
            chain_mode=self.config.llm.chain_mode,
            max_concurrency=self.config.llm.max_concurrency,
            events=self.events,
            phase=phase,
        )
        self.clients.append(client)
        return client

    def prompt(self, name: str) -> str:
        """The instructions for a phase: the world's ``prompts/<name>.md`` if it has one."""
        text = self._prompts.get(name)
        if text is None:
            override = self.world.root / "prompts" / f"{name}.md"
            path = override if override.is_file() else PROMPTS_DIR / f"{name}.md"
            text = self._prompts[name] = path.read_text(encoding="utf-8").strip()
        return text
