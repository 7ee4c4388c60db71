"""A study file and its expanded design.

A study file is TOML (``StudyFile``; its JSON Schema is written by ``sim schema``)::

    world = "../worlds/village"        # relative to the study file
    seeds = "1-5"
    ticks = 7
    [factors]
    "phase1.temperature" = [0.5, 0.9]
    [conditions.control]
    [conditions.announce]
    inject = [{ tick = 3, at = "square", text = "The lord will pay half the mill." }]
    set = [{ tick = 2, path = "bram.state.mood", value = "angry" }]
    [[surveys]]
    ticks = [2, 6]
    question = "Will you vote to rebuild the mill?"
    format = "yesno"

Ticks count from the world's tick when the study starts: an intervention at tick 3 is in
the inputs of the run's third tick (queued once its second is committed); a survey at tick
2 asks every character once the second tick is committed (tick 0: before the first).

The design (``expand``) is one *unit* per seed and combination of factor values, and one
*arm* per unit and condition. The arms of a unit share every tick before the first
intervention of any condition (the prefix): the prefix runs once, in
``DIR/_shared/<run>``, and each arm is forked from it into ``DIR/<condition>/<run>``. A
study of one condition has no prefix (nothing shares it): its runs fork the world.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sim.errors import InputError
from sim.interventions import parse_assignment
from sim.interview import MAX_QUESTION, MAX_SCHEMA_BYTES, AnswerFormat, answer_format, schema_format
from sim.runs.design import (
    MAX_RUNS,
    count_runs,
    parse_seeds,
    parse_setting,
    run_name,
    shown_count,
)
from sim.safefs import read_capped
from sim.storage.statefiles import MAX_TEXT
from sim.study.network import NETWORK_FACTOR, ConditionNetwork, parse_spec, read_beside, read_edges
from sim.world import MAX_SEED

if TYPE_CHECKING:
    from sim.config import Config

#: the folder of the shared prefixes, beside the conditions' folders
SHARED = "_shared"
#: the copy of the study's file in its folder (beside its record, ``sim.runs.fork.STUDY_RECORD``)
STUDY_COPY = "study.toml"
_CONDITION = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
_MAX_FILE_BYTES = 1024 * 1024


class Inject(BaseModel):
    """An event in the inputs of tick ``tick``: at a location, or everywhere."""

    model_config = ConfigDict(extra="forbid")

    tick: int = Field(ge=1, le=1_000_000, description="the tick whose inputs show it")
    at: str | None = Field(default=None, description="the location id where it happens")
    everywhere: bool = Field(default=False, description="it happens at every location")
    text: str = Field(min_length=1, max_length=MAX_TEXT, description="what happens")

    @model_validator(mode="after")
    def _where(self) -> Inject:
        if (self.at is None) == (not self.everywhere):
            raise ValueError("expected exactly one of at = LOCATION or everywhere = true")
        return self


class SetField(BaseModel):
    """A field set before tick ``tick`` runs (``sim set``)."""

    model_config = ConfigDict(extra="forbid")

    tick: int = Field(ge=1, le=1_000_000, description="the tick that starts with it set")
    path: str = Field(description="ENTITY.field.path, e.g. bram.state.mood")
    value: Any = Field(description="the new value (any JSON value)")

    @model_validator(mode="after")
    def _assignment(self) -> SetField:
        try:
            parse_assignment(self.assignment)
        except InputError as exc:
            raise ValueError(exc.problem) from None
        return self

    @property
    def assignment(self) -> str:
        return f"{self.path}={orjson.dumps(self.value).decode()}"


class Condition(BaseModel):
    """One arm of the study: its scheduled interventions (none: a control), and the
    network its characters start in (``sim.study.network``; none: the world's)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    inject: list[Inject] = Field(default_factory=list)
    set_: list[SetField] = Field(default_factory=list, alias="set")
    network: str | None = Field(
        default=None, description="ring, small-world, star or random:p (as sim init --network)"
    )
    edges: str | None = Field(
        default=None, description="a CSV file of ties, from,to (relative to the study file)"
    )

    @model_validator(mode="after")
    def _one_network(self) -> Condition:
        if self.network is not None and self.edges is not None:
            raise ValueError("expected network or edges, not both")
        return self

    def first_tick(self) -> int | None:
        ticks = [i.tick for i in self.inject] + [s.tick for s in self.set_]
        if self.network is not None or self.edges is not None:
            ticks.append(1)  # set before the first tick: nothing is shared with another arm
        return min(ticks) if ticks else None


class Survey(BaseModel):
    """A question every character answers at the given ticks."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    ticks: list[int] = Field(min_length=1, description="after which ticks (0: before the first)")
    question: str = Field(min_length=1, max_length=MAX_QUESTION)
    format: str = Field(
        default="text", description="text, yesno, likert5, number, character or choice:A,B,..."
    )
    schema_file: str | None = Field(
        default=None,
        alias="schema",
        description="a JSON Schema file for the answer (relative to the study file)",
    )


class StudyFile(BaseModel):
    """A study: the world, its runs, its conditions and its surveys (``sim study run``)."""

    model_config = ConfigDict(extra="forbid", title="sim study file")

    world: str = Field(description="the world folder, relative to the study file")
    seeds: str | list[int] = Field(default="0", description='"1-5", "1,4,9" or [1, 2]')
    ticks: int = Field(ge=1, le=1_000_000, description="ticks each run gets")
    factors: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="config keys (as sim sweep --set) and the values each takes",
    )
    conditions: dict[str, Condition] = Field(
        min_length=1, description="name -> scheduled interventions (an empty table: control)"
    )
    surveys: list[Survey] = Field(default_factory=list)


@dataclass(frozen=True)
class Unit:
    """A seed and factor values: the runs that share a prefix."""

    seed: int
    overrides: dict[str, Any]
    #: the value of the ``network`` factor (``sim.study.network``): not a config setting
    network: str | None = None

    @property
    def name(self) -> str:
        if self.network is None:
            return run_name(self.seed, self.overrides)
        return run_name(self.seed, {**self.overrides, NETWORK_FACTOR: self.network})


@dataclass(frozen=True)
class Arm:
    condition: str
    unit: Unit

    @property
    def rel(self) -> str:
        return f"{self.condition}/{self.unit.name}"


@dataclass
class Study:
    """A study file read and expanded."""

    path: Path
    text: str
    spec: StudyFile
    world: Path
    seeds: list[int]
    units: list[Unit]
    forms: list[AnswerFormat]
    #: ticks every arm of a unit shares (before any condition's first intervention)
    prefix: int
    #: condition -> the network its arms start in (``sim.study.network``), when it sets one
    networks: dict[str, ConditionNetwork] = field(default_factory=dict)

    def network_of(self, arm: Arm | None, unit: Unit) -> ConditionNetwork | None:
        """The network a run starts in: its condition's, else its unit's ``network``
        factor value; ``None``: the world's."""
        if arm is not None and arm.condition in self.networks:
            return self.networks[arm.condition]
        if unit.network is None:
            return None
        return parse_spec(self.path, f"factors.{NETWORK_FACTOR}", unit.network)

    #: each survey's schema file (as the study file names it) -> its contents' sha256
    schemas: dict[str, str] = field(default_factory=dict)

    @property
    def arms(self) -> list[Arm]:
        return [Arm(c, u) for u in self.units for c in self.spec.conditions]

    def design(self) -> dict[str, Any]:
        """The expanded design, as recorded in ``DIR/study.json`` (paths absolute)."""
        return {
            "world": str(self.world),
            "ticks": self.spec.ticks,
            "prefix_ticks": self.prefix,
            "factors": self.spec.factors,
            "conditions": {
                name: cond.model_dump(mode="json", by_alias=True)
                for name, cond in self.spec.conditions.items()
            },
            "surveys": [
                {**s.model_dump(mode="json", by_alias=True), "format": f.name}
                for s, f in zip(self.spec.surveys, self.forms, strict=True)
            ],
            "seeds": self.seeds,
            "runs": [arm.rel for arm in self.arms],
            **self._edge_digests(),
        }

    def _edge_digests(self) -> dict[str, Any]:
        """The edge files' digests, by condition (none: the key is left out, so a study
        without one keeps its identity)."""
        digests = {c: n.digest for c, n in self.networks.items() if n.digest is not None}
        return {"edge_files": digests} if digests else {}

    def identity(self) -> str:
        """What a folder of this study must match to be resumed: the design but its seeds."""
        design = {k: v for k, v in self.design().items() if k not in ("seeds", "runs")}
        return hashlib.sha256(orjson.dumps(design, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]

    def fingerprint(self) -> dict[str, Any]:
        """The design as a folder's inputs record it (``sim.runs.inputs``): the identity
        (the design but its seeds) and the contents of the survey schema files."""
        return {"identity": self.identity(), "schemas": self.schemas}


def check_against_world(study: Study, config: Config | None = None) -> None:
    """Check every condition's interventions against the study's world, before anything
    runs: an injection's place, and each ``set`` as ``sim set`` checks it (the character or
    location, the path, the value; the sets of a condition in tick order, each on the
    world as the earlier left it).

    Raises:
        InputError: the study file and the field named (``conditions.X.set.0.path``).
        InvalidWorld: the world does not load.
    """
    from sim.interventions import check_assignment
    from sim.storage import Storage

    for name, cond in study.spec.conditions.items():
        world = Storage(study.world).load()
        for j, event in enumerate(cond.inject):
            if event.at is not None and event.at not in world.locations:
                raise InputError(
                    study.path,
                    f"conditions.{name}.inject.{j}.at",
                    f"no location {event.at!r} in {study.world}; expected one of: "
                    f"{', '.join(world.locations)}",
                )
        for j, edit in sorted(enumerate(cond.set_), key=lambda pair: pair[1].tick):
            try:
                made = check_assignment(
                    study.world, world, parse_assignment(edit.assignment), config
                )
            except InputError as exc:
                raise InputError(
                    study.path, f"conditions.{name}.set.{j}.path", f"{edit.path}: {exc}"
                ) from None
            entities = world.characters if made.kind == "characters" else world.locations
            entities[edit.path.partition(".")[0]] = made.edited


def _problem(path: Path, exc: ValidationError) -> InputError:
    problem = exc.errors()[0]
    where = ".".join(str(p) for p in problem["loc"])
    return InputError(path, where or None, str(problem["msg"]))


def _schema_form(path: Path, rel: str, where: str) -> tuple[AnswerFormat, bytes]:
    """A survey's schema file, read as a world's files are (``sim.safefs``): inside the
    study file's folder, no link followed, no FIFO or device, size-limited; the child
    ``sim ask`` is given the same file.

    Raises:
        InputError: the path leaves the folder, is missing, a link or not a regular file
            (the study file and ``where`` named), or the schema is not one a survey takes.
    """
    raw = read_beside(path, rel, where, MAX_SCHEMA_BYTES)
    try:
        return schema_format(raw, path.parent / rel), raw
    except InputError as exc:  # not JSON, not a schema a survey takes
        raise InputError(path, where, str(exc)) from None


def read_study(path: Path) -> Study:
    """Read, validate and expand a study file.

    Raises:
        InputError: the file is missing, not TOML, or a field is wrong (file and field
            named); the world is missing; a factor, condition or survey is malformed.
    """
    raw = read_capped(path, _MAX_FILE_BYTES)
    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(path, None, f"not valid TOML: {exc}") from None
    try:
        spec = StudyFile.model_validate(data)
    except ValidationError as exc:
        raise _problem(path, exc) from None
    world = (path.parent / spec.world).resolve()
    if not (world / "world.json").is_file():
        raise InputError(path, "world", f"{world}: no world.json (is this a world folder?)")
    try:
        seeds = (
            parse_seeds(spec.seeds)
            if isinstance(spec.seeds, str)
            else list(dict.fromkeys(spec.seeds))
        )
    except InputError as exc:
        raise InputError(path, "seeds", exc.problem) from None
    if not seeds or any(s < 0 or s > MAX_SEED for s in seeds):
        raise InputError(path, "seeds", f"expected one or more seeds from 0 to {MAX_SEED}")
    for name in spec.conditions:
        if name == SHARED or not _CONDITION.match(name):
            raise InputError(
                path, f"conditions.{name}", f"a condition's name must match {_CONDITION.pattern}"
            )
    keys = list(spec.factors)
    for key, values in spec.factors.items():
        if not values:
            raise InputError(path, f"factors.{key}", "expected one or more values")
        if key == NETWORK_FACTOR:  # the network each unit's runs start in, not a setting
            for value in values:
                parse_spec(path, f"factors.{key}", value if isinstance(value, str) else repr(value))
            continue
        try:
            parse_setting(f"{key}=0")
        except InputError as exc:
            raise InputError(path, f"factors.{key}", exc.problem) from None
    # counted before anything is listed: a design of millions is refused, not made
    combos_count = count_runs(len(v) for v in spec.factors.values())
    count = count_runs([len(seeds), combos_count, len(spec.conditions)])
    if count > MAX_RUNS:
        field = "factors"  # what to cut: the part that alone passes the limit
        if len(spec.conditions) > MAX_RUNS:
            field = "conditions"
        elif combos_count == 1 or len(seeds) * len(spec.conditions) > MAX_RUNS:
            field = "seeds"
        raise InputError(
            path,
            field,
            f"{len(seeds)} seeds x {shown_count(combos_count)} combinations of factor values x "
            f"{len(spec.conditions)} conditions = {shown_count(count)} runs: more than "
            f"{MAX_RUNS}, the most a study may have",
        )
    combos = [
        dict(zip(keys, combo, strict=True))
        for combo in itertools.product(*(spec.factors[k] for k in keys))
    ]
    units = [
        Unit(
            seed,
            {k: v for k, v in combo.items() if k != NETWORK_FACTOR},
            combo.get(NETWORK_FACTOR),
        )
        for seed in seeds
        for combo in combos
    ]
    forms: list[AnswerFormat] = []
    schemas: dict[str, str] = {}
    asked: dict[str, int] = {}
    for i, survey in enumerate(spec.surveys):
        where = f"surveys.{i}"
        question = survey.question.strip()
        if question in asked:
            raise InputError(
                path,
                f"{where}.question",
                f"the same question as surveys.{asked[question]}: its answers would be "
                "asked and paid for twice and told apart by nothing; ask it once, at every "
                "tick it is due (ticks = [...])",
            )
        asked[question] = i
        if survey.schema_file is not None and "format" in survey.model_fields_set:
            raise InputError(
                path,
                f"{where}.format",
                "given with schema: a survey's answer has one form, a format or a schema "
                "file; remove one of them",
            )
        if any(t < 0 or t > spec.ticks for t in survey.ticks):
            raise InputError(path, f"{where}.ticks", f"expected ticks from 0 to {spec.ticks}")
        try:
            if survey.schema_file is None:
                forms.append(answer_format(survey.format))
            else:
                form, raw_schema = _schema_form(path, survey.schema_file, f"{where}.schema")
                forms.append(form)
                schemas[survey.schema_file] = hashlib.sha256(raw_schema).hexdigest()
        except InputError as exc:
            if exc.path == path:
                raise
            raise InputError(path, f"{where}.format", str(exc)) from None
    for name, cond in spec.conditions.items():
        scheduled: list[tuple[str, int, int]] = [
            *(("inject", j, item.tick) for j, item in enumerate(cond.inject)),
            *(("set", j, item.tick) for j, item in enumerate(cond.set_)),
        ]
        for kind, j, tick in scheduled:
            if tick > spec.ticks:
                raise InputError(
                    path,
                    f"conditions.{name}.{kind}.{j}.tick",
                    f"after the study's last tick ({spec.ticks})",
                )
    networks = _networks(path, spec, world)
    firsts = [c.first_tick() for c in spec.conditions.values()]
    # one condition shares with nothing: a prefix would only cost a world copy per run
    prefix = (
        min([spec.ticks, *(t - 1 for t in firsts if t is not None)])
        if len(spec.conditions) > 1
        else 0
    )
    return Study(path, text, spec, world, seeds, units, forms, prefix, networks, schemas)


def _networks(path: Path, spec: StudyFile, world: Path) -> dict[str, ConditionNetwork]:
    """The networks the conditions set, checked (edge files against the world's
    characters, the ids of its ``characters/*.json``)."""
    out: dict[str, ConditionNetwork] = {}
    characters: set[str] | None = None
    for name, cond in spec.conditions.items():
        if NETWORK_FACTOR in spec.factors and (cond.network or cond.edges) is not None:
            raise InputError(
                path,
                f"conditions.{name}.{'network' if cond.network is not None else 'edges'}",
                "the factor 'network' sets every run's network: set it there or here, not both",
            )
        if cond.network is not None:
            out[name] = parse_spec(path, f"conditions.{name}.network", cond.network)
        elif cond.edges is not None:
            if characters is None:
                characters = {p.stem for p in (world / "characters").glob("*.json")}
            out[name] = read_edges(path, f"conditions.{name}.edges", cond.edges, characters)
    return out


__all__ = [
    "SHARED",
    "STUDY_COPY",
    "Arm",
    "Condition",
    "Inject",
    "SetField",
    "Study",
    "StudyFile",
    "Survey",
    "Unit",
    "check_against_world",
    "read_study",
]
