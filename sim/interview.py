"""``sim ask``: interview characters, in character, without changing the world.

A question goes to the configured provider with the character's identity, state and
memory (``interview_input``), under the ``[phase1]`` model and settings (the character's
own voice: the model that decides what it does). Nothing is written to the world's files:
the entities are read, no chain or usage is added to them, no response is stored. Every
question and answer is appended to ``.sim/interviews.jsonl`` (one ``Interview`` per line,
with the tick, the model and every attempt's usage), which ``sim usage`` counts.

An answer may be structured (``AnswerFormat``: ``yesno``, ``likert5``, ``number``,
``choice:a,b,c``, ``character`` or a JSON Schema file): the model then answers
``{"answer": <value>, "reason": "<why, in its own voice>"}``, validated (and retried) like
every structured output; the record keeps the value, the reason and the format beside the
answer's text.

An answer that names something in the world (the ``character`` format: one character id;
a schema's strings marked ``"x-sim-ref"``) is held to the ids as a declared phase's answer
is (``sim.phases.refs``): the ids valid for the character asked go out as the field's
``enum`` (unless ``constrain_refs = "validate"``: a survey's world-wide ids make one schema
per question, so ``auto`` sends them whatever the provider) and are named in the
instructions; an answer naming anything else is re-asked with the problem fed back, and
one still wrong is recorded as failed, which no table counts as an answer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from sim import safefs
from sim.errors import InputError, LogError
from sim.llm.budget import Cost, Price
from sim.llm.errors import LLMError
from sim.llm.types import Usage
from sim.ticklog.books import attempts_cost
from sim.ticklog.records import AttemptRecord, TokenCounts

if TYPE_CHECKING:  # asking imports the LLM stack; reading interviews (sim usage) does not
    from sim.config import Config
    from sim.llm.events import LLMEvent
    from sim.world import Entity, World

INTERVIEWS = ".sim/interviews.jsonl"
#: the sha256 of each line of ``INTERVIEWS`` as it was written, one a line: what ``sim
#: study verify`` holds the answers to (``sim.runs.verify``)
INTERVIEW_DIGESTS = ".sim/interviews.sha256"
#: the config section whose model and settings answer (the characters' own voice)
SECTION = "phase1"
PHASE = "ask"
RECENT_CELLS = 5
MAX_QUESTION = 2000

INSTRUCTIONS = """\
You are being interviewed as one character of a living, turn-based world simulation. The
JSON input describes the world, who you are (identity, goals, mood, belongings, where you
are, any other state), what you remember, and the interviewer's question.

Answer the question in character, in the first person, in your own voice, from what you
know, want, feel and remember. Do not invent events you could not know about, and do not
step out of character or mention the simulation. Keep the answer under 80 words.
"""


class InterviewAnswer(BaseModel):
    """What the model answers: the character's reply."""

    model_config = ConfigDict(extra="forbid", title="InterviewAnswer", defer_build=True)

    answer: str = Field(description="the character's reply, in the first person")


#: the answer formats ``--format`` names (``choice:a,b,c`` besides)
FORMATS = ("text", "yesno", "likert5", "number", "character")
#: the most options of a ``choice:`` format, and the longest option
MAX_CHOICES = 50
MAX_CHOICE_CHARS = 100
#: the most bytes of a ``--schema`` file
MAX_SCHEMA_BYTES = 256 * 1024
SURVEY_TITLE = "SurveyAnswer"
_REASON = Field(description="why, in a sentence or two, in your own voice")
#: the fields of an answer that name something in the world: (path from the answer's root,
#: with ``*`` for a list's items, and the kind: ``sim.phases.schema.REF_KINDS``) each
RefFields = tuple[tuple[tuple[str, ...], str], ...]


@dataclass(frozen=True)
class AnswerFormat:
    """How an answer is coded: free text, or a value of a fixed shape with a reason."""

    #: ``text``, ``yesno``, ``likert5``, ``number``, ``choice:a,b,c`` or ``schema:<file>``
    name: str
    #: the model the answer must validate against
    model: type[BaseModel]
    #: what the model is told about the answer's form
    hint: str
    #: the answer's fields that name something in the world (checked, sent as enums)
    refs: RefFields = ()

    @property
    def structured(self) -> bool:
        return self.name != "text"


def _survey_model(annotation: Any) -> type[BaseModel]:
    model: type[BaseModel] = create_model(
        SURVEY_TITLE,
        __config__=ConfigDict(extra="forbid", title=SURVEY_TITLE),
        answer=(annotation, Field(description="your answer, in the form asked")),
        reason=(str, _REASON),
    )
    return model


TEXT = AnswerFormat("text", InterviewAnswer, "")


def schema_format(raw: bytes, schema_file: Path) -> AnswerFormat:
    """The format of a JSON Schema's bytes ``raw``, read from ``schema_file`` (by
    ``answer_format``, or from a study's folder: ``sim.study.design``).

    Raises:
        InputError: larger than ``MAX_SCHEMA_BYTES``, not JSON, or not the JSON Schema
            subset of declared phases (``sim.phases.schema``).
    """
    from sim.phases.schema import model_from_schema, ref_fields, without_refs

    if len(raw) > MAX_SCHEMA_BYTES:
        raise InputError(schema_file, None, f"larger than {MAX_SCHEMA_BYTES} bytes")
    try:
        schema = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(schema_file, None, f"not valid JSON: {exc}") from None
    inner = model_from_schema(schema, "survey_value", schema_file)
    shown = orjson.dumps(without_refs(schema)).decode()[:2000]
    hint = "an object of the schema given: " + shown
    refs = tuple((("answer", *path), kind) for path, kind in ref_fields(schema))
    return AnswerFormat(f"schema:{schema_file.name}", _survey_model(inner), hint, refs)


def answer_format(spec: str | None = None, schema_file: Path | None = None) -> AnswerFormat:
    """The format ``--format SPEC`` or ``--schema FILE`` names (free text without either).

    Raises:
        InputError: an unknown format, a bad ``choice:`` list, an unreadable or unsupported
            schema (the JSON Schema subset of declared phases, ``sim.phases.schema``).
    """
    if schema_file is not None:
        if spec not in (None, "text"):
            raise InputError(None, "--schema", "give --format or --schema, not both")
        try:  # a FIFO or a device is refused, not waited on
            raw = safefs.read_named(schema_file, MAX_SCHEMA_BYTES)
        except OSError as exc:
            raise InputError(schema_file, None, f"cannot read: {exc.strerror or exc}") from None
        return schema_format(raw, schema_file)
    if spec is None or spec == "text":
        return TEXT
    if spec == "yesno":
        return AnswerFormat(spec, _survey_model(Literal["yes", "no"]), '"yes" or "no"')
    if spec == "likert5":
        scale = Annotated[int, Field(ge=1, le=5)]
        hint = "a whole number from 1 (strongly disagree) to 5 (strongly agree)"
        return AnswerFormat(spec, _survey_model(scale), hint)
    if spec == "number":
        return AnswerFormat(spec, _survey_model(float), "a number")
    if spec == "character":
        hint = "the id of one character of the world (not a name)"
        return AnswerFormat(spec, _survey_model(str), hint, ((("answer",), "character"),))
    head, sep, rest = spec.partition(":")
    if head == "choice" and sep:
        options = [o.strip() for o in rest.split(",")]
        if len(options) < 2 or not all(options) or len(set(options)) != len(options):
            raise InputError(None, "--format", "choice: needs two or more distinct options")
        if len(options) > MAX_CHOICES or max(map(len, options)) > MAX_CHOICE_CHARS:
            raise InputError(
                None, "--format", f"at most {MAX_CHOICES} options of {MAX_CHOICE_CHARS} chars"
            )
        model = _survey_model(Literal[tuple(options)])
        hint = "exactly one of: " + ", ".join(options)
        return AnswerFormat("choice:" + ",".join(options), model, hint)
    raise InputError(
        None,
        "--format",
        f"expected one of {', '.join(FORMATS)} or choice:A,B,... (got {spec!r})",
    )


class Interview(BaseModel):
    """One question and its answer, as ``.sim/interviews.jsonl`` holds it."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    tick: int
    character: str
    question: str
    #: the answer as text (a structured answer's value as JSON text); ``None``: it failed
    answer: str | None = None
    #: a structured answer: its format, its value and the reason given beside it
    format: str | None = None
    value: Any = None
    reason: str | None = None
    #: the model asked for, and the one that answered (a fallback model, a dated snapshot)
    model: str
    answered_by: str | None = None
    #: tokens over every attempt (a failed attempt may be billed)
    usage: TokenCounts = Field(default_factory=TokenCounts)
    attempts: list[AttemptRecord] = Field(default_factory=list)
    error_code: str | None = None
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.answer is None

    def cost(self, prices: Mapping[str, Any], cache: dict[str, Price | None] | None = None) -> Cost:
        """Every attempt at its model's price (unknown when a model has none)."""
        return attempts_cost(self.attempts, prices, cache)


@dataclass
class Asked:
    """What one ``ask`` did: an interview per character asked, in order."""

    tick: int
    question: str
    interviews: list[Interview] = field(default_factory=list)
    #: character id -> name, for printing
    names: dict[str, str] = field(default_factory=dict)

    @property
    def failures(self) -> int:
        return sum(1 for i in self.interviews if i.failed)


def interview_input(world: World, char: Entity, question: str) -> str:
    """The model's view of a character being interviewed (JSON, keys in a fixed order)."""
    identity, state, memory = char["identity"], char["state"], char.get("memory", {})
    place = world.locations.get(state["location"])
    custom = {k: v for k, v in state.items() if k not in ("location", "mood", "inventory")}
    you: dict[str, Any] = {
        "id": identity["id"],
        "name": identity["name"],
        "description": identity.get("description", ""),
        "personality": identity.get("personality", ""),
        "goals": identity.get("goals", []),
        "mood": state.get("mood", ""),
        "inventory": state.get("inventory", []),
        "location": {
            "id": state["location"],
            "name": place["identity"]["name"] if place else state["location"],
            "description": place["identity"].get("description", "") if place else "",
        },
    }
    if custom:
        you["state"] = custom
    from sim.world import relationships_view  # here: reading interviews loads no world

    ties = relationships_view(world, char)
    if ties:  # typed relationships (docs/world-format.md); left out when there are none
        you["relationships"] = ties
    return orjson.dumps(
        {
            "world": {
                "name": world.meta.get("name", ""),
                "description": world.meta.get("description", ""),
            },
            "tick": world.tick,
            "you": you,
            "memory": {
                "summary": memory.get("summary", ""),
                "recent": list(memory.get("cells", []))[-RECENT_CELLS:],
            },
            "question": question,
        }
    ).decode()


def _interview(
    tick: int,
    cid: str,
    question: str,
    model: str,
    result: object,
    events: Sequence[LLMEvent],
    form: AnswerFormat = TEXT,
) -> Interview:
    attempts = [
        AttemptRecord(
            attempt=event.attempt,
            model=event.response.model if event.response is not None else event.model,
            provider=event.provider,
            usage=TokenCounts.of(event.usage),
            latency=round(event.latency, 6),
            error_code=event.error_code,
        )
        for event in events
        if event.kind != "llm_called"
    ]
    total = Usage()
    for attempt in attempts:
        total = total + attempt.usage.to_usage()
    fields: dict[str, Any] = {
        "tick": tick,
        "character": cid,
        "question": question,
        "model": model,
        "usage": TokenCounts.of(total),
        "attempts": attempts,
    }
    if form.structured:
        fields["format"] = form.name
    if isinstance(result, form.model):
        if form.structured:
            value = result.model_dump(mode="json")["answer"]
            fields["value"] = value
            fields["reason"] = str(getattr(result, "reason", ""))
            fields["answer"] = value if isinstance(value, str) else orjson.dumps(value).decode()
        else:
            fields["answer"] = getattr(result, "answer", "")
        fields["answered_by"] = attempts[-1].model if attempts else model
    else:
        error = result if isinstance(result, LLMError) else LLMError(str(result))
        fields["error_code"] = error.code
        fields["error"] = str(error)
    return Interview(**fields)


def _instructions(form: AnswerFormat, ids: Mapping[str, Sequence[str]] | None = None) -> str:
    """The instructions for ``form``; ``ids``: the ids its references may name (kind ->
    ids), named too (a long list cut short: the schema's enum holds them all)."""
    if not form.structured:
        return INSTRUCTIONS
    text = (
        INSTRUCTIONS.replace("Keep the answer under 80 words.", "")
        + f"Put your answer in `answer` as {form.hint}, and in `reason`, in a sentence or "
        "two in your own voice, why.\n"
    )
    if ids:
        from sim.phases.refs import listed

        kinds = dict.fromkeys(kind for _, kind in form.refs)
        text += (
            "Where the answer names something in the world, use one of these ids: "
            + "; ".join(f"{kind}: {listed(ids.get(kind, ()))}" for kind in kinds)
            + ".\n"
        )
    return text


async def _ask(
    world: World,
    config: Config,
    question: str,
    ids: Sequence[str],
    form: AnswerFormat = TEXT,
) -> list[Interview]:
    from sim.engine.stack import build_stack
    from sim.llm.client import LLMClient, LLMRequest
    from sim.phases.refs import DeclaredRefs, check_for, subject_ids, verified

    section = config.phase(SECTION)
    # references: the ids valid for each character asked, checked on every answer; sent as
    # the field's enum unless the user chose "validate" (a survey's world-wide ids are one
    # schema per question, so ``auto`` sends them whatever the provider)
    kinds = {kind for _, kind in form.refs}
    where = world.characters_at() if form.refs else {}
    send = (section.constrain_refs or config.llm.constrain_refs) != "validate"
    refs = [
        DeclaredRefs(
            form.refs, subject_ids(world, kinds, "character", world.characters[cid], where)
        )
        if form.refs
        else None
        for cid in ids
    ]
    stack = build_stack(config, world.seed)
    adapter = stack.adapter
    by_request: dict[int, list[LLMEvent]] = {}
    try:
        # no entities: the calls are independent (no chain), and nothing is written into
        # the characters (no usage, no response ids)
        client = LLMClient(
            adapter,
            [],
            0,
            settings=config.call_settings(SECTION),
            chain_mode=config.llm.chain_mode,
            max_concurrency=config.llm.max_concurrency,
            events=lambda event: by_request.setdefault(id(event.request), []).append(event),
            phase=PHASE,
        )
        requests = [
            LLMRequest(
                _instructions(form, ref.ids if ref is not None else None),
                interview_input(world, world.characters[cid], question),
                form.model,
                enums=ref.enums() if ref is not None and send else None,
                check=check_for(ref.problem) if ref is not None else None,
            )
            for cid, ref in zip(ids, refs, strict=True)
        ]
        results = [
            verified(result, request.check)
            for request, result in zip(requests, await client.create_batch(requests), strict=True)
        ]
    finally:
        await stack.aclose()
    return [
        _interview(
            world.tick, cid, question, section.model, result, by_request.get(id(req), []), form
        )
        for cid, req, result in zip(ids, requests, results, strict=True)
    ]


def _check_record(root: Path) -> None:
    """Refuse, before anything is sent, a record that would be written through a link."""
    folder = root / ".sim"
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise InputError(folder, None, "expected a folder inside the world (not a link)")
    for rel in (INTERVIEWS, INTERVIEW_DIGESTS):
        path = root / rel
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise InputError(path, None, "expected a file inside the world (not a link)")


def line_digest(line: bytes) -> str:
    """The digest ``INTERVIEW_DIGESTS`` records of one line of ``INTERVIEWS``."""
    return hashlib.sha256(line.rstrip(b"\n")).hexdigest()


def answer_digests(root: Path) -> list[str] | None:
    """The digests recorded of a world's answers, in order (``None``: no record).

    Raises:
        UnsafePath: the record is a link or not a regular file.
    """
    raw = safefs.read_optional(root, INTERVIEW_DIGESTS)
    if raw is None:
        return None
    return [ln.decode("ascii", errors="replace") for ln in raw.splitlines() if ln.strip()]


def _append(root: Path, interviews: Sequence[Interview]) -> None:
    """Append to ``.sim/interviews.jsonl`` and the digest of each line to
    ``INTERVIEW_DIGESTS``, never through a symlink out of the world."""
    lines = [orjson.dumps(i.model_dump(mode="json")) for i in interviews]
    for rel, data in (
        (INTERVIEWS, b"".join(line + b"\n" for line in lines)),
        (INTERVIEW_DIGESTS, "".join(line_digest(line) + "\n" for line in lines).encode()),
    ):
        try:
            safefs.append_file(root, rel, data)
        except OSError as exc:
            raise InputError(root / rel, None, f"cannot append: {exc.strerror}") from None


def ask(
    world_dir: Path,
    config: Config,
    question: str,
    characters: Sequence[str] | None = None,
    form: AnswerFormat = TEXT,
) -> Asked:
    """Ask characters (``None``: every one) a question; record and return the answers
    (in the answer format ``form``: free text by default).

    Raises:
        InputError: an empty or overlong question, an unknown character.
        InvalidWorld: the world cannot be loaded.
        LLMConfigurationError: the provider cannot be set up (a missing key).
    """
    question = question.strip()
    if not question:
        raise InputError(None, "QUESTION", "expected a question (got an empty one)")
    if len(question) > MAX_QUESTION:
        raise InputError(None, "QUESTION", f"expected at most {MAX_QUESTION} characters")
    from sim import interrupts  # asyncio: `sim usage` reads this module without it
    from sim.storage import Storage

    world = Storage(world_dir).load()
    ids = sorted(world.characters) if characters is None else list(characters)
    for cid in ids:
        if cid not in world.characters:
            known = ", ".join(sorted(world.characters)) or "none"
            raise InputError(None, "CHARACTER", f"no character {cid!r} (known: {known})")
    _check_record(world_dir)
    interviews = interrupts.run(_ask(world, config, question, ids, form))
    _append(world_dir, interviews)
    names = {cid: str(world.characters[cid]["identity"]["name"]) for cid in ids}
    return Asked(world.tick, question, interviews, names)


def read_interviews(world_dir: Path) -> list[Interview]:
    """Every recorded interview of a world, oldest first (none when there is no file).

    Raises:
        LogError: a line is not an interview (names the file and line).
    """
    path = world_dir / INTERVIEWS
    try:
        raw = safefs.read_optional(world_dir, INTERVIEWS)
    except safefs.UnsafePath:
        return []  # `sim check` and `sim ask` name it; a report skips it
    if raw is None:
        return []
    out: list[Interview] = []
    lines = raw.splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(Interview.model_validate_json(line))
        except ValidationError as exc:
            if number == len(lines) and not raw.endswith(b"\n"):
                break  # a torn last line: the write was cut short
            problem = exc.errors()[0]
            where = ".".join(str(p) for p in problem["loc"])
            raise LogError(f"{path}: line {number}: {where or 'line'}: {problem['msg']}") from None
    return out


def interviews_usage(world_dir: Path, prices: Mapping[str, Any]) -> tuple[int, int, Usage, Cost]:
    """Interviews, failed ones, tokens (every attempt) and cost of a world's ``sim ask``s.

    Raises:
        LogError: ``.sim/interviews.jsonl`` holds a line that is not an interview.
    """
    usage, cost = Usage(), Cost()
    cache: dict[str, Price | None] = {}
    interviews = read_interviews(world_dir)
    for interview in interviews:
        usage = usage + interview.usage.to_usage()
        cost = cost + interview.cost(prices, cache)
    return len(interviews), sum(1 for i in interviews if i.failed), usage, cost


__all__ = [
    "FORMATS",
    "INSTRUCTIONS",
    "INTERVIEWS",
    "INTERVIEW_DIGESTS",
    "TEXT",
    "AnswerFormat",
    "Asked",
    "Interview",
    "InterviewAnswer",
    "answer_digests",
    "answer_format",
    "ask",
    "interview_input",
    "interviews_usage",
    "line_digest",
    "read_interviews",
]
