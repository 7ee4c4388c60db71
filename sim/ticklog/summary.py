"""Per-tick summaries: a committed tick's numbers without reading its log.

``.sim/log/tick-000004.summary.jsonl.gz`` is written when tick 4 has committed (a crash
before that is made good by ``recover_logs``, from the log) and holds three lines (gzip: the
second is large and repetitive, and reading the first decompresses only its start):

1. ``summary`` (``TickSummary``): the header's facts (seed, scope, phases, the ``[prices]``
   in effect), the tick's totals as ``sim.ticklog.books.tick_books`` computes them from the
   full log (calls, failures, tokens, cost at the tick's prices, timeouts, embeddings
   requests), wall time, resumes and the commit's digests. ``sim log --tick all`` and
   ``sim check`` read only this line.
2. ``groups`` (``UsageGroups``): per (phase, entity key, model), the call records,
   failures, timeouts and tokens, and per (phase, model) the embeddings requests and their
   tokens: what ``sim usage`` prices at any ``[prices]`` table and groups by entity,
   phase or tick, and what the report's per-character totals use.
3. ``places`` (``Places``, optional: summaries written before it have two lines): where
   each character was at the start of the tick, as the log's state snapshot says: what
   ``sim report`` places characters by without unpacking every tick's snapshot.

``summarize`` builds a summary from a full ``TickLog``; the recorder feeds the same
``SummaryBuilder`` call by call as it logs them, so the summary a commit writes equals the
one the log gives (a test checks it). Ticks without a summary (logs of older sims, an
interrupted tick, logs set aside) are summarised from their log when a view needs them,
and so are ticks whose summary cannot be read: a summary is derived data, the log is the
record.
"""

from __future__ import annotations

import gzip
import logging
import os
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from sim import safefs
from sim.errors import LogError
from sim.llm.budget import Cost, Price, price_usage
from sim.llm.types import Usage
from sim.ticklog.books import TIMEOUT, Books
from sim.ticklog.format import ABANDONED_DIR, LOG_DIR, list_logs, summary_rel
from sim.ticklog.reader import TickLog, packed_damage, read_log, read_regular
from sim.ticklog.records import (
    AttemptRecord,
    CallRecord,
    CommitRecord,
    EmbeddingRecord,
    HeaderRecord,
    TokenCounts,
    price_table,
)

SUMMARY_FORMAT = 1
logger = logging.getLogger(__name__)


class _SummaryModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class TickSummary(_SummaryModel):
    """One tick in numbers (the first line of its summary file)."""

    type: Literal["summary"] = "summary"
    format: int = SUMMARY_FORMAT
    tick: int
    committed: bool = False
    seed: int = 0
    scope: str = ""
    phases: list[str] | None = None
    #: the ``[prices]`` table in effect when the tick ran (as its header holds it)
    prices: dict[str, Any] = {}
    #: calls as they ended (one per request id) and how many of those failed
    calls: int = 0
    failures: int = 0
    #: every attempt of every call record, superseded ones included, and every embeddings
    #: request
    usage: TokenCounts = TokenCounts()
    #: at the tick's prices; ``None``: a model had no price (``unpriced`` names them)
    cost: float | None = 0.0
    unpriced: list[str] = []
    timed_out: int = 0
    #: embeddings requests (not calls: ``calls`` never counts them) and their part of
    #: ``usage`` (absent in summaries written before they were counted: none)
    embedding_requests: int = 0
    embedding_tokens: int = 0
    wall: float | None = None
    resumes: int = 0
    state_before: str | None = None
    state_after: str | None = None
    committed_at: float | None = None
    #: ``sim log --compact`` dropped the tick's call detail (the log cannot be replayed)
    compacted: bool = False


#: the integer columns of ``UsageGroups``, one entry per row
COUNT_COLUMNS = ("phase", "model", "requests", "failures", "timed_out", "input", "cached", "output")


#: the integer columns of ``UsageGroups``' embeddings requests, one entry per row
EMBEDDING_COLUMNS = (
    "embedding_phase",
    "embedding_model",
    "embedding_requests",
    "embedding_input",
)


class UsageGroups(_SummaryModel):
    """What a tick's call records used, per (phase, entity key, model): the second line.

    Column by column, one entry per row in each list, all flat lists of integers (and the
    keys), which validate several times faster than rows of mixed types: ``phase`` indexes
    ``phases``, ``model`` indexes ``models`` (with ``providers``, where it ran, and
    ``factors``, the fraction of the list price charged, ``0.5`` for a Batch API call;
    each absent when all are "" or 1: a model on two providers, or at list price and in a
    batch, is two entries). A call's ``requests`` and ``failures`` are counted in the row
    of its final attempt's model; every attempt's tokens, and its timeout, in the row of
    the model that attempt used (as ``sim usage --by model`` splits a call).
    """

    type: Literal["groups"] = "groups"
    models: list[str] = []
    #: per entry of ``models``, the provider it ran on ("": an older log's attempt)
    providers: list[str] = []
    factors: list[float] = []
    phases: list[str] = []
    keys: list[str | None] = []
    phase: list[int] = []
    model: list[int] = []
    requests: list[int] = []
    failures: list[int] = []
    timed_out: list[int] = []
    input: list[int] = []
    cached: list[int] = []
    output: list[int] = []
    #: embeddings requests, one entry per (phase, model): ``embedding_phase`` indexes
    #: ``phases``, ``embedding_model`` ``models``; how many requests and the input tokens
    #: the servers counted (absent in summaries written before they were counted)
    embedding_phase: list[int] = []
    embedding_model: list[int] = []
    embedding_requests: list[int] = []
    embedding_input: list[int] = []

    def embedding_rows(self) -> Iterator[tuple[str, int, int, int]]:
        """(phase, model index, requests, input tokens) of each embeddings entry."""
        columns = zip(
            self.embedding_phase,
            self.embedding_model,
            self.embedding_requests,
            self.embedding_input,
            strict=True,
        )
        for phase, model, requests, tokens in columns:
            yield self.phases[phase], model, requests, tokens

    def factor(self, index: int) -> float:
        return self.factors[index] if self.factors else 1.0

    def provider(self, index: int) -> str:
        return self.providers[index] if self.providers else ""

    @model_validator(mode="after")
    def _columns_agree(self) -> UsageGroups:
        for extra in (self.factors, self.providers):
            if extra and len(extra) != len(self.models):
                raise ValueError("factors or providers and models differ in length")
        size = len(self.keys)
        if any(len(getattr(self, name)) != size for name in COUNT_COLUMNS):
            raise ValueError("the group columns differ in length")
        if size and (
            min(min(getattr(self, name)) for name in COUNT_COLUMNS) < 0
            or max(self.phase) >= len(self.phases)
            or max(self.model) >= len(self.models)
        ):
            raise ValueError("a count is negative or an index out of range")
        embedding = [getattr(self, name) for name in EMBEDDING_COLUMNS]
        if any(len(column) != len(self.embedding_phase) for column in embedding):
            raise ValueError("the embedding columns differ in length")
        if self.embedding_phase and (
            min(min(column) for column in embedding) < 0
            or max(self.embedding_phase) >= len(self.phases)
            or max(self.embedding_model) >= len(self.models)
        ):
            raise ValueError("an embedding count is negative or an index out of range")
        return self


class Places(_SummaryModel):
    """Where each character was at the start of a tick (the third line, optional).

    ``characters`` are ids, sorted; ``at`` holds, per character, an index into
    ``locations``. Characters whose file has no readable ``state.location`` are left out
    (the report skips them too).
    """

    type: Literal["places"] = "places"
    locations: list[str] = []
    characters: list[str] = []
    at: list[int] = []

    def where(self) -> dict[str, str]:
        """Character id -> location id."""
        return {c: self.locations[i] for c, i in zip(self.characters, self.at, strict=True)}

    @model_validator(mode="after")
    def _columns_agree(self) -> Places:
        if len(self.at) != len(self.characters):
            raise ValueError("characters and at differ in length")
        if self.at and (min(self.at) < 0 or max(self.at) >= len(self.locations)):
            raise ValueError("a location index is out of range")
        return self


def places_of(files: Mapping[str, bytes]) -> Places:
    """Each character's location in a state snapshot's files (relative path -> bytes)."""
    where: dict[str, str] = {}
    for rel, raw in files.items():
        if not rel.startswith("characters/"):
            continue
        try:
            data = orjson.loads(raw)
            where[str(data["identity"]["id"])] = str(data["state"]["location"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue
    return places_at(where)


def places_at(where: Mapping[str, str]) -> Places:
    """``Places`` from each character's location by id."""
    locations: dict[str, int] = {}
    characters = sorted(where)
    at = [locations.setdefault(where[c], len(locations)) for c in characters]
    return Places(locations=list(locations), characters=characters, at=at)


@dataclass
class Summary:
    head: TickSummary
    groups: UsageGroups
    #: ``None``: a summary written before places were (or without a state snapshot)
    places: Places | None = None


class SummaryBuilder:
    """Accumulates a tick's summary from its call records, in log order.

    Args:
        header: the tick's header record (prices, seed, scope, phases).
    """

    def __init__(self, header: HeaderRecord) -> None:
        self.header = header
        self._prices = header.prices
        self._cache: dict[str, Price | None] = {}
        self.books = Books()
        self._last_failed: dict[str, bool] = {}
        #: (phase, entity key, model index) -> [requests, failures, timed out, in, cached, out]
        self._rows: dict[tuple[str, str | None, int], list[int]] = {}
        self._models: dict[tuple[str, str, float], int] = {}
        #: (phase, model index) -> [requests, input tokens] of embeddings requests
        self._embedding_rows: dict[tuple[str, int], list[int]] = {}
        #: the order phases first appear in, calls and embeddings alike
        self._phases: dict[str, None] = {}

    def _row(self, call: CallRecord, attempt: AttemptRecord) -> list[int]:
        entry = (attempt.model, attempt.provider, call.price_factor)
        index = self._models.setdefault(entry, len(self._models))
        self._phases.setdefault(call.phase)
        key = (call.phase, call.entity_key, index)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = [0, 0, 0, 0, 0, 0]
        return row

    def add_call(self, call: CallRecord, cost: Cost | None = None) -> None:
        """Count ``call``; ``cost``: its cost at the header's prices, when known."""
        self.books.add_call(call, self._prices, self._cache, cost)
        self._last_failed.pop(call.request_id, None)
        self._last_failed[call.request_id] = call.failed
        attempts = call.every_attempt()
        final = self._row(call, attempts[-1])
        final[0] += 1
        final[1] += 1 if call.failed else 0
        for attempt in attempts:
            row = self._row(call, attempt)
            row[2] += 1 if attempt.error_code == TIMEOUT else 0
            row[3] += attempt.usage.input_tokens
            row[4] += attempt.usage.cached_input_tokens
            row[5] += attempt.usage.output_tokens

    def add_embedding(self, record: EmbeddingRecord) -> None:
        """Count an embeddings request (its tokens and cost; not a call)."""
        self.books.add_embedding(record, self._prices, self._cache)
        index = self._models.setdefault((record.model, record.provider, 1.0), len(self._models))
        self._phases.setdefault(record.phase)
        row = self._embedding_rows.setdefault((record.phase, index), [0, 0])
        row[0] += 1
        row[1] += record.input_tokens

    def add(self, record: CallRecord | EmbeddingRecord) -> None:
        """Count a record of ``TickLog.billed``."""
        if isinstance(record, CallRecord):
            self.add_call(record)
        else:
            self.add_embedding(record)

    def finish(
        self,
        *,
        committed: bool,
        wall: float | None,
        resumes: int,
        state_before: str | None,
        commit: CommitRecord | None,
        places: Places | None = None,
    ) -> Summary:
        books = self.books
        usage = books.usage
        head = TickSummary(
            tick=self.header.tick,
            committed=committed,
            seed=self.header.seed,
            scope=self.header.scope,
            phases=self.header.phases,
            prices=dict(self.header.config.get("prices") or {}),
            calls=len(self._last_failed),
            failures=sum(self._last_failed.values()),
            usage=TokenCounts.of(usage),
            cost=books.cost.value,
            unpriced=sorted(books.cost.unpriced),
            timed_out=books.timed_out,
            embedding_requests=books.embedding_requests,
            embedding_tokens=books.embedding_tokens,
            wall=wall,
            resumes=resumes,
            state_before=state_before,
            state_after=commit.state_after if commit else None,
            committed_at=commit.committed_at if commit else None,
        )
        phases = {phase: n for n, phase in enumerate(self._phases)}
        columns: dict[str, list[Any]] = {name: [] for name in ("keys", *COUNT_COLUMNS)}
        for (phase, key, model), counts in self._rows.items():
            columns["keys"].append(key)
            columns["phase"].append(phases[phase])
            columns["model"].append(model)
            for name, value in zip(COUNT_COLUMNS[2:], counts, strict=True):
                columns[name].append(value)
        for (phase, model), (requests, tokens) in self._embedding_rows.items():
            columns.setdefault("embedding_phase", []).append(phases[phase])
            columns.setdefault("embedding_model", []).append(model)
            columns.setdefault("embedding_requests", []).append(requests)
            columns.setdefault("embedding_input", []).append(tokens)
        models = [model for model, _, _ in self._models]
        providers = [provider for _, provider, _ in self._models]
        factors = [factor for _, _, factor in self._models]
        groups = UsageGroups(
            models=models,
            providers=providers if any(providers) else [],
            factors=factors if any(f != 1.0 for f in factors) else [],
            phases=list(phases),
            **columns,
        )
        return Summary(head, groups, places)


def summarize(log: TickLog, places: bool = False) -> Summary:
    """A tick's summary from its full log (what its commit wrote, for a committed tick).

    ``places``: also unpack the log's state snapshot for where characters were (what a
    commit writes; a view that only wants the numbers leaves it out).
    """
    builder = SummaryBuilder(log.header)
    for record in log.billed():
        builder.add(record)
    summary = builder.finish(
        committed=log.committed,
        wall=log.usage.elapsed if log.usage is not None else None,
        resumes=log.resumes,
        state_before=log.state_before.digest if log.state_before is not None else None,
        commit=log.commit,
        places=places_of(log.state()) if places and log.state_before is not None else None,
    )
    if log.compacted is not None:
        head = summary.head.model_copy(update={"compacted": True})
        return Summary(head, summary.groups, summary.places)
    return summary


#: fields a summary line leaves out while they hold their default (a tick without
#: embeddings requests): its file is then what sims before them wrote, byte for byte
_QUIET = frozenset({"embedding_requests", "embedding_tokens", *EMBEDDING_COLUMNS})


def _dumped(part: _SummaryModel) -> dict[str, Any]:
    data = part.model_dump(mode="json")
    fields = type(part).model_fields
    for name in _QUIET.intersection(data):
        if getattr(part, name) == fields[name].default:
            del data[name]
    return data


def dump_summary(summary: Summary) -> bytes:
    """A summary file's bytes: its two or three lines, compressed (the same summary always
    gives the same bytes)."""
    parts: list[_SummaryModel] = [summary.head, summary.groups]
    if summary.places is not None:
        parts.append(summary.places)
    lines = b"".join(orjson.dumps(_dumped(part)) + b"\n" for part in parts)
    return gzip.compress(lines, compresslevel=6, mtime=0)


def _lines(path: Path, count: int) -> list[bytes]:
    try:
        fd = safefs.open_regular(path)
    except OSError as exc:
        raise LogError(f"{path}: cannot read the tick summary: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as handle:
            return [handle.readline() for _ in range(count)]
    except (OSError, EOFError, zlib.error) as exc:
        raise LogError(f"{path}: damaged tick summary ({exc})") from None


def _parse(path: Path, line: bytes, model: type[_SummaryModel], number: int) -> Any:
    try:
        return model.model_validate_json(line)
    except ValidationError as exc:
        problem = str(exc).splitlines()[0]
        raise LogError(f"{path}: line {number}: not a tick summary ({problem})") from None


def summary_path(root: Path, tick: int) -> Path:
    return root / summary_rel(tick)


def read_head(path: Path) -> TickSummary:
    """The first line of a summary file: the tick's totals.

    Raises:
        LogError: the file cannot be read or is not a summary.
    """
    head: TickSummary = _parse(path, _lines(path, 1)[0], TickSummary, 1)
    return head


def read_summary(path: Path, places: bool = False) -> Summary:
    """The lines of a summary file: totals and groups, and with ``places`` its third line
    (``Summary.places`` is ``None`` for a summary written without one).

    Raises:
        LogError: the file cannot be read or is not a summary.
    """
    lines = _lines(path, 3 if places else 2)
    head = _parse(path, lines[0], TickSummary, 1)
    groups = _parse(path, lines[1], UsageGroups, 2)
    where = _parse(path, lines[2], Places, 3) if places and lines[2].strip() else None
    return Summary(head, groups, where)


def write_summary(root: Path, summary: Summary) -> Path:
    """Write a summary file outside a commit (``sim log --compact``), atomically."""
    path = summary_path(root, summary.head.tick)
    tmp = path.with_name(path.name + ".tmp")
    if os.path.lexists(tmp):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(dump_summary(summary))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return path


# -- what views read ------------------------------------------------------------------------


@dataclass
class Listed:
    """A logged tick as the views see it: its summary (from its file or its log), or why
    neither could be read."""

    tick: int
    path: Path
    summary: Summary | None = None
    head: TickSummary | None = None
    problem: LogError | None = None


def _from_log(tick: int, path: Path) -> Listed:
    try:
        summary = summarize(read_log(path))
    except LogError as exc:
        return Listed(tick, path, problem=exc)
    return Listed(tick, path, summary, summary.head)


def heads(root: Path, folder: str = LOG_DIR) -> Iterator[Listed]:
    """Each logged tick's totals, oldest first: from its summary's first line when it has
    one, else from its full log (one in memory at a time)."""
    for tick, path in list_logs(root, folder):
        summary_file = summary_path(root, tick) if folder == LOG_DIR else None
        if summary_file is not None and os.path.lexists(summary_file):
            try:
                yield Listed(tick, path, head=read_head(summary_file))
                continue
            except LogError as exc:  # derived data: the log still says it all
                logger.warning("%s; reading the tick's log instead", exc)
        yield _from_log(tick, path)


def summaries(root: Path, folder: str = LOG_DIR) -> Iterator[Listed]:
    """Each logged tick's whole summary (totals and groups), oldest first."""
    for tick, path in list_logs(root, folder):
        summary_file = summary_path(root, tick) if folder == LOG_DIR else None
        if summary_file is not None and os.path.lexists(summary_file):
            try:
                summary = read_summary(summary_file)
            except LogError as exc:  # derived data: the log still says it all
                logger.warning("%s; reading the tick's log instead", exc)
            else:
                yield Listed(tick, path, summary, summary.head)
                continue
        yield _from_log(tick, path)


def summary_books(summary: Summary, prices: Mapping[str, Any] | None = None) -> Books:
    """What ``tick_books`` gives from a tick's full log, from its summary alone: calls and
    failures as they ended, every record's tokens and timeouts, and the cost priced from
    the usage groups, once per model, at ``prices`` (default: the tick's own, as
    ``tick_books``). Reading a summary costs milliseconds; parsing the log of a tick of
    thousands of calls, about a second of CPU."""
    head, groups = summary.head, summary.groups
    table = price_table(head.prices) if prices is None else prices
    tokens: dict[int, list[int]] = {}
    columns = zip(groups.model, groups.input, groups.cached, groups.output, strict=True)
    for index, inp, cached, out in columns:
        sums = tokens.setdefault(index, [0, 0, 0])
        sums[0] += inp
        sums[1] += cached
        sums[2] += out
    for _, index, _, inp in groups.embedding_rows():
        tokens.setdefault(index, [0, 0, 0])[0] += inp
    cost = Cost()
    cache: dict[str, Price | None] = {}
    for index, (inp, cached, out) in sorted(tokens.items()):
        usage = Usage(input_tokens=inp, cached_input_tokens=cached, output_tokens=out)
        cost = cost + price_usage(
            usage, groups.models[index], table, cache, groups.provider(index), groups.factor(index)
        )
    return Books(
        calls=head.calls,
        failures=head.failures,
        usage=head.usage.to_usage(),
        cost=cost,
        timed_out=head.timed_out,
        embedding_requests=head.embedding_requests,
        embedding_tokens=head.embedding_tokens,
    )


def logged_books(
    root: Path, prices: Mapping[str, Any] | None = None
) -> Iterator[tuple[Path, bool, Books]]:
    """(log path, whether it was set aside, books) of each logged tick of ``root``, in
    ``.sim/log`` then ``.sim/log/abandoned``: a committed tick's from its summary, any
    other's from its log (``summary_books``); a log that cannot be read is left out."""
    for folder, aside in ((LOG_DIR, False), (f"{LOG_DIR}/{ABANDONED_DIR}", True)):
        for item in summaries(root, folder):
            if item.summary is not None:
                yield item.path, aside, summary_books(item.summary, prices)


@dataclass
class HistoryCheck:
    """What ``sim check`` says about a world's logs."""

    #: (tick, calls already logged) of an interrupted tick the next ``sim tick`` resumes
    interrupted: tuple[int, int] | None = None
    problems: list[LogError] = field(default_factory=list)


def check_history(root: Path, world_tick: int) -> HistoryCheck:
    """Each committed tick's summary line (or, without one, its log) and the log of the
    tick after ``world_tick`` if there is one: what ``sim check`` reports, reading neither
    whole logs of summarised ticks nor their usage groups."""
    out = HistoryCheck()
    for item in heads(root):
        if item.problem is not None:
            out.problems.append(item.problem)
            continue
        damage = packed_damage(item.path)  # a summary read instead says nothing of the log
        if damage is not None:
            out.problems.append(LogError(f"{item.path}: {damage}"))
        elif item.head is not None and not item.head.committed and item.tick == world_tick + 1:
            out.interrupted = (item.tick, item.head.calls)
    for marker in sorted((root / LOG_DIR).glob("tick-*.commit.json")):
        problem = marker_problem(marker)
        if problem is not None:
            out.problems.append(
                LogError(f"{marker}: {problem}; the next tick sets it aside as {marker.name}.bad")
            )
    return out


def marker_problem(path: Path) -> str | None:
    """Why a commit marker left by a crash cannot be read (``recover_logs`` sets such a
    marker aside), or ``None``."""
    try:
        CommitRecord.model_validate_json(read_regular(path))
    except OSError as exc:
        return f"cannot be read as a commit marker ({exc.strerror})"
    except ValidationError as exc:
        return f"not a commit marker ({str(exc).splitlines()[0]})"
    return None


def summary_numbers(head: TickSummary) -> dict[str, Any]:
    """One tick in numbers, as ``sim log --tick all`` shows them (``view.summary``)."""
    return {
        "tick": head.tick,
        "committed": head.committed,
        "calls": head.calls,
        "failures": head.failures,
        "tokens": head.usage.input_tokens + head.usage.output_tokens,
        "input_tokens": head.usage.input_tokens,
        "output_tokens": head.usage.output_tokens,
        "cost": head.cost,
        "timed_out": head.timed_out,
        "embedding_requests": head.embedding_requests,
        "embedding_tokens": head.embedding_tokens,
        "wall": head.wall,
        "resumes": head.resumes,
    }


__all__ = [
    "HistoryCheck",
    "Listed",
    "Places",
    "Summary",
    "SummaryBuilder",
    "TickSummary",
    "UsageGroups",
    "check_history",
    "dump_summary",
    "heads",
    "logged_books",
    "marker_problem",
    "places_at",
    "places_of",
    "read_head",
    "read_summary",
    "summaries",
    "summarize",
    "summary_books",
    "summary_numbers",
    "summary_path",
    "write_summary",
]
