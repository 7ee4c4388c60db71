"""What a world's LLM calls used and cost: ``sim usage``, and the rows of ``sim tune``.

Two sources, which agree when every tick is logged:

- the entities' ``_openai.usage`` (tokens and answered requests per character and location,
  every attempt counted, kept for the world's whole life);
- the tick logs in ``.sim/log/`` (one record per call, with its phase, tick, entity, model
  and attempts): the only place that knows which model used which tokens, so cost comes
  from here. Each committed tick's summary (``sim.ticklog.summary``, written at its
  commit) holds its calls' tokens per phase, entity and model, so ``sim usage`` reads the
  summaries, not the logs, and prices the tokens at the ``[prices]`` table; a tick without
  a summary (an older sim's log, an interrupted or set-aside one) is summarised from its
  log. Every call record counts, including one a resume sent
  again, and so do the logs a tick set aside into ``.sim/log/abandoned/`` when it started
  afresh: their calls were sent, and billed.

Embeddings requests (``[memory] embeddings = "provider"``) are billed too: each view counts
them in ``embedding_requests`` (never in ``requests``, which counts model calls), their
tokens and cost in the row's: the phase they were sent before, the tick, their
``provider/model``; ``--by entity`` and ``--by endpoint`` (they belong to no entity, and
their server is not logged) in a row of their own, ``(embeddings)``.

A log that cannot be read is reported in ``problems``; its calls are missing from the
totals, never silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sim.errors import InputError, LogError
from sim.llm.budget import Cost, Price, price_usage
from sim.llm.redact import redact_url
from sim.llm.store import split_key
from sim.llm.types import Usage
from sim.ticklog.books import TIMEOUT, Books, attempts_cost
from sim.ticklog.format import ABANDONED_DIR, LOG_DIR
from sim.ticklog.reader import TickLog, read_logs
from sim.ticklog.records import CallRecord, EmbeddingRecord
from sim.ticklog.summary import Listed, UsageGroups, summaries

By = Literal["entity", "phase", "tick", "model", "endpoint"]
BY_CHOICES: tuple[By, ...] = ("entity", "phase", "tick", "model", "endpoint")
#: the ``--by endpoint`` row of calls that went over no network (offline, or logged
#: before endpoints were recorded)
NO_ENDPOINT = "-"
#: the ``--by endpoint`` row of the calls of ticks whose call detail ``sim log --compact
#: --before`` dropped: their summaries keep the numbers, not the server of each call
COMPACTED_ENDPOINT = "(compacted: server not kept)"
#: the ``--by entity`` and ``--by endpoint`` row of embeddings requests
EMBEDDINGS_ROW = "(embeddings)"


class _UsageCount:
    """A count of a row's ``usage`` (``Usage``), read as the row's own of that name."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, row: Books, owner: type | None = None) -> int:
        count: int = getattr(row.usage, self.name)
        return count


@dataclass
class UsageRow(Books):
    """Calls, tokens and cost of one group (an entity, a phase, a tick) or of all of them:
    the books of the calls with one ``key``, shown with ``calls`` as ``requests``."""

    key: str

    @property
    def requests(self) -> int:
        """The model calls, by the name ``sim usage`` shows them (docs/api.md reads it)."""
        return self.calls

    # a row of ``sim.usage_report`` is read by the names ``sim usage --json`` gives them
    input_tokens = _UsageCount()
    cached_input_tokens = _UsageCount()
    output_tokens = _UsageCount()
    total_tokens = _UsageCount()

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "requests": self.calls,
            "failures": self.failures,
            "input_tokens": self.usage.input_tokens,
            "cached_input_tokens": self.usage.cached_input_tokens,
            "output_tokens": self.usage.output_tokens,
            "total_tokens": self.usage.total_tokens,
            "cost_usd": self.cost.value,
            "unpriced_models": sorted(self.cost.unpriced),
            "timed_out": self.timed_out,
            "embedding_requests": self.embedding_requests,
        }


@dataclass
class UsageReport:
    by: By
    rows: list[UsageRow]
    total: UsageRow
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "by": self.by,
            "rows": [row.to_dict() for row in self.rows],
            "total": self.total.to_dict(),
            "problems": self.problems,
            "notes": self.notes,
        }


def entity_id(call: CallRecord) -> str | None:
    return split_key(call.entity_key)[1] if call.entity_key else None


def model_rows(
    call: CallRecord, prices: Mapping[str, Any], cache: dict[str, Price | None] | None = None
) -> list[UsageRow]:
    """One logged call split by where its attempts ran: a row per ``provider/model`` (an
    attempt of a log older than the provider field: its model alone), with that
    attempt's tokens and cost. The request (and its failure) counts for the last attempt's
    row: the model that answered, or failed last."""
    rows: dict[str, UsageRow] = {}
    attempts = call.every_attempt()
    for n, attempt in enumerate(attempts, 1):
        key = attempt.target
        row = rows.setdefault(key, UsageRow(key))
        row.usage += attempt.usage.to_usage()
        row.cost = row.cost + attempts_cost([attempt], prices, cache, call.price_factor)
        row.timed_out += 1 if attempt.error_code == TIMEOUT else 0
        if n == len(attempts):
            row.calls += 1
            row.failures += 1 if call.failed else 0
    return list(rows.values())


def embedding_key(by: By, tick: int, record: EmbeddingRecord) -> str:
    """The row an embeddings request counts in, grouped ``by``."""
    if by == "tick":
        return str(tick)
    if by == "phase":
        return record.phase
    if by == "model":
        return f"{record.provider}/{record.model}" if record.provider else record.model
    return EMBEDDINGS_ROW  # no entity; the server is not logged


def group_calls(logs: Iterable[TickLog], by: By, prices: Mapping[str, Any]) -> dict[str, UsageRow]:
    """The logs' call records (and embeddings requests) summed per phase, tick, entity id,
    ``provider/model`` or endpoint.

    Every record counts (``TickLog.call_records``): a call a resume sent again was paid for
    each time. ``calls`` (the requests) counts records, so a resent call counts once per
    sending.
    """
    groups: dict[str, UsageRow] = {}
    cache: dict[str, Price | None] = {}
    for log in logs:
        for record in log.embeddings:
            key = embedding_key(by, log.tick, record)
            groups.setdefault(key, UsageRow(key)).add_embedding(record, prices, cache)
        for call in log.call_records:
            if by == "endpoint":
                _add_by_endpoint(groups, call, prices, cache)
                continue
            if by == "model":  # each attempt where it ran: a fallback's tokens are its own
                for row in model_rows(call, prices, cache):
                    groups.setdefault(row.key, UsageRow(row.key)).add(row)
                continue
            if by == "tick":
                key = str(log.tick)
            elif by == "phase":
                key = call.phase
            else:
                key = entity_id(call) or "-"
            groups.setdefault(key, UsageRow(key)).add_call(call, prices, cache)
    return groups


def _add_by_endpoint(
    groups: dict[str, UsageRow],
    call: CallRecord,
    prices: Mapping[str, Any],
    cache: dict[str, Price | None],
) -> None:
    """One call into the rows of the servers it went to: each attempt's tokens, cost and
    timeout where it was sent; the request (and its failure, if it failed) where it ended.
    A call a pool moved off a failing server thus costs that server only what was sent
    there."""
    final = redact_url(call.endpoint) if call.endpoint else NO_ENDPOINT
    row = groups.setdefault(final, UsageRow(final))
    row.calls += 1
    row.failures += 1 if call.failed else 0
    for attempt in call.every_attempt():
        key = redact_url(attempt.endpoint) if attempt.endpoint else final
        part = groups.setdefault(key, UsageRow(key))
        part.usage += attempt.usage.to_usage()
        part.cost = part.cost + attempts_cost([attempt], prices, cache, call.price_factor)
        part.timed_out += 1 if attempt.error_code == TIMEOUT else 0


def entity_usage(world_dir: Path) -> dict[str, UsageRow]:
    """Tokens and answered requests per entity, from their ``_openai.usage``."""
    from sim.storage import Storage  # the other groupings read no entity

    world = Storage(world_dir).load()
    rows: dict[str, UsageRow] = {}
    for entities in (world.characters, world.locations):
        for eid, entity in entities.items():
            stats = (entity.get("_openai") or {}).get("usage") or {}
            if not stats:
                continue
            rows[eid] = UsageRow(
                eid,
                calls=int(stats.get("total_requests", 0)),
                usage=Usage(
                    input_tokens=int(stats.get("total_input_tokens", 0)),
                    cached_input_tokens=int(stats.get("total_cached_input_tokens", 0)),
                    output_tokens=int(stats.get("total_output_tokens", 0)),
                ),
            )
    return rows


def group_rows(
    items: Iterable[Listed], by: By, prices: Mapping[str, Any], embeddings: bool = True
) -> dict[str, UsageRow]:
    """The ticks' calls summed per phase, tick or entity id, from their summaries (each
    tick's per-(phase, entity) tokens by model), priced at ``prices`` once per group and
    model; with ``embeddings``, their embeddings requests too (as ``group_calls`` counts
    them).

    Every call record counts, as in ``group_calls``: a call a resume sent again was paid for
    each time, and ``calls`` (the requests) counts records.
    """
    # (model, provider, price factor) -> key -> [requests, failures, timed out, input,
    # cached, output, embeddings requests]: one lookup per row of a summary (110,000 rows
    # for 100 ticks of 500 characters) by the key's string alone; ``order`` keeps each
    # (key, model) in the order it first appears (the order of the cost's sum)
    tables: dict[tuple[str, str, float], dict[str, list[int]]] = {}
    order: list[tuple[str, tuple[str, str, float], list[int]]] = []
    ids: dict[str | None, str] = {}  # entity key -> entity id ("-": none), across ticks
    for item in items:
        if item.summary is None:
            continue
        groups = item.summary.groups
        if by == "tick":
            keys = [str(item.tick)] * len(groups.keys)
        elif by == "phase":
            keys = [groups.phases[i] for i in groups.phase]
        elif by == "model":  # each attempt where it ran, as ``model_rows`` splits a call
            named = named_models(groups)
            keys = [named[i] for i in groups.model]
        else:
            keys = []
            for entity_key in groups.keys:
                eid = ids.get(entity_key)
                if eid is None:
                    eid = (split_key(entity_key)[1] if entity_key else None) or "-"
                    ids[entity_key] = eid
                keys.append(eid)
        priced = [(m, groups.provider(i), groups.factor(i)) for i, m in enumerate(groups.models)]
        by_model = [tables.setdefault(price, {}) for price in priced]
        for phase, index, sent, tokens in groups.embedding_rows() if embeddings else ():
            if by == "tick":
                key = str(item.tick)
            elif by == "phase":
                key = phase
            elif by == "model":
                key = named_models(groups)[index]
            else:  # no entity's
                key = EMBEDDINGS_ROW
            table = by_model[index]
            sums = table.get(key)
            if sums is None:
                sums = table[key] = [0, 0, 0, 0, 0, 0, 0]
                order.append((key, priced[index], sums))
            sums[3] += tokens
            sums[6] += sent
        columns = zip(
            keys,
            groups.model,
            groups.requests,
            groups.failures,
            groups.timed_out,
            groups.input,
            groups.cached,
            groups.output,
            strict=True,
        )
        for key, model, requests, failures, timeouts, inp, cached, out in columns:
            table = by_model[model]
            sums = table.get(key)
            if sums is None:
                sums = table[key] = [requests, failures, timeouts, inp, cached, out, 0]
                order.append((key, priced[model], sums))
                continue
            sums[0] += requests
            sums[1] += failures
            sums[2] += timeouts
            sums[3] += inp
            sums[4] += cached
            sums[5] += out
    rows: dict[str, UsageRow] = {}
    cache: dict[str, Price | None] = {}
    for key, (model, provider, factor), sums in order:
        row = rows.get(key)
        if row is None:
            row = rows[key] = UsageRow(key)
        requests, failures, timeouts, input_tokens, cached, output, embedded = sums
        row.calls += requests
        row.embedding_requests += embedded
        row.failures += failures
        row.timed_out += timeouts
        usage = Usage(input_tokens=input_tokens, cached_input_tokens=cached, output_tokens=output)
        row.usage += usage
        row.cost = row.cost + price_usage(usage, model, prices, cache, provider, factor)
    return rows


def named_models(groups: UsageGroups) -> list[str]:
    """Each model of a summary's groups as ``--by model`` names it: ``provider/model``."""
    return [
        f"{groups.provider(i)}/{m}" if groups.provider(i) else m
        for i, m in enumerate(groups.models)
    ]


def _by_entity(world_dir: Path, items: list[Listed], prices: Mapping[str, Any]) -> UsageReport:
    rows = entity_usage(world_dir)
    logged = group_rows(items, "entity", prices)
    notes: list[str] = []
    partial = []
    for eid, row in rows.items():
        seen = logged.get(eid)
        if seen is not None and seen.usage.total_tokens == row.usage.total_tokens:
            row.cost = seen.cost
        else:  # ticks the logs no longer hold (pruned, rewound, or from before logging)
            row.cost = Cost(
                seen.cost.usd if seen else 0.0,
                frozenset({"(ticks without a log)"}) | (seen.cost.unpriced if seen else set()),
            )
            partial.append(eid)
    embedded = logged.get(EMBEDDINGS_ROW)
    if embedded is not None:  # billed, but no entity's: a row of their own
        rows[EMBEDDINGS_ROW] = embedded
    if partial:
        notes.append(
            f"cost unknown for {len(partial)} entities: their usage includes ticks with no "
            "readable log (pruned by [history] keep_ticks, rewound, or unreadable), and only "
            "the logs say which model used which tokens"
        )
    return _report("entity", list(rows.values()), notes)


def _add_compacted(
    groups: dict[str, UsageRow],
    full: list[TickLog],
    listed: list[Listed],
    prices: Mapping[str, Any],
) -> list[str]:
    """The calls of the compacted ticks among ``full`` (their call records dropped), from
    their summaries in ``listed``, as one row (``COMPACTED_ENDPOINT``), so every grouping
    counts the same calls; the note that says so."""
    compacted = {log.tick for log in full if log.compacted is not None}
    if not compacted:
        return []
    kept = [item for item in listed if item.tick in compacted]
    row = groups.setdefault(COMPACTED_ENDPOINT, UsageRow(COMPACTED_ENDPOINT))
    # their embeddings requests are in their logs still: ``group_calls`` counted them
    for part in group_rows(kept, "tick", prices, embeddings=False).values():
        row.add(part)
    return [
        f"{len(compacted)} ticks' call detail was dropped by `sim log --compact --before`: "
        f"their {row.calls} requests are counted as {COMPACTED_ENDPOINT!r}, from their "
        "summaries, which do not keep the server of each call"
    ]


def _report(by: By, rows: list[UsageRow], notes: list[str] | None = None) -> UsageReport:
    if by == "tick":  # in tick order (a row that is not a tick's after them)
        rows.sort(key=lambda r: (0, int(r.key), "") if r.key.isdigit() else (1, 0, r.key))
    else:
        rows.sort(key=lambda r: (-r.cost.usd, -r.usage.total_tokens, r.key))
    total = UsageRow("total")
    for row in rows:
        total.add(row)
    return UsageReport(by, rows, total, notes=notes or [])


def usage_report(world_dir: Path, by: By, prices: Mapping[str, Any]) -> UsageReport:
    """Tokens, requests and cost of a world, grouped ``by`` entity, phase, tick or
    ``provider/model`` (each attempt where it ran), or endpoint (the server each attempt
    went to: a pool's servers apart; read from the full logs, which alone record it).

    Rows are sorted by cost, then tokens, most expensive first; by tick, in tick order.

    Raises:
        InputError: no such world folder, or (``by="entity"``) the world cannot be loaded.
    """
    if not world_dir.is_dir():
        raise InputError(world_dir, None, "world folder not found")
    # each tick's summary (written at its commit), or its log for ticks without one
    listed = list(summaries(world_dir))
    logs = [item for item in listed if item.summary is not None]
    problems = [item.problem for item in listed if item.problem is not None]
    if by == "entity":
        report = _by_entity(world_dir, logs, prices)
    elif by == "endpoint":  # only the full logs record each attempt's server
        full, unread = read_logs(world_dir)
        set_aside, unread_aside = read_logs(world_dir, f"{LOG_DIR}/{ABANDONED_DIR}")
        problems = [*unread, *unread_aside]
        groups = group_calls([*full, *set_aside], by, prices)
        notes = _add_compacted(groups, full, logs, prices)
        report = _report(by, list(groups.values()), notes)
        if set_aside:
            report.notes.append(
                f"includes {len(set_aside)} abandoned logs (.sim/log/{ABANDONED_DIR}/): runs "
                "of a tick set aside when it started afresh; their calls were sent and billed"
            )
    else:
        aside_listed = list(summaries(world_dir, f"{LOG_DIR}/{ABANDONED_DIR}"))
        aside = [item for item in aside_listed if item.summary is not None]
        problems += [item.problem for item in aside_listed if item.problem is not None]
        report = _report(by, list(group_rows([*logs, *aside], by, prices).values()))
        if aside:
            report.notes.append(
                f"includes {len(aside)} abandoned logs (.sim/log/{ABANDONED_DIR}/): runs of a "
                "tick set aside when it started afresh; their calls were sent and billed"
            )
    report.problems = [str(p) for p in problems]
    _add_interviews(report, world_dir, prices)
    if not logs and by != "entity":
        report.notes.append("no tick logs yet (run `sim tick` first)")
    if report.total.embedding_requests:
        report.notes.append(
            f"{report.total.embedding_requests} embeddings requests ([memory] embeddings = "
            '"provider") are counted under embeds, not requests; their tokens and cost are '
            "in the rows and totals"
        )
    if report.total.timed_out:
        report.notes.append(
            f"{report.total.timed_out} attempts timed out on the client (may be billed): "
            "their tokens are unknown and not in these totals"
        )
    return report


def _add_interviews(report: UsageReport, world_dir: Path, prices: Mapping[str, Any]) -> None:
    """``sim ask``'s calls (``.sim/interviews.jsonl``) as one row, ``ask``, in any grouping."""
    from sim.interview import INTERVIEWS, interviews_usage

    try:
        asked, failed, usage, cost = interviews_usage(world_dir, prices)
    except LogError as exc:
        report.problems.append(str(exc))
        return
    if not asked:
        return
    row = UsageRow("ask", calls=asked, failures=failed, usage=usage, cost=cost)
    report.rows.append(row)
    report.total.add(row)
    report.notes.append(f"ask: {asked} interviews (sim ask, {INTERVIEWS}), outside the ticks")


def log_totals(logs: Iterable[TickLog], prices: Mapping[str, Any]) -> UsageRow:
    """Every logged call of ``logs`` in one row."""
    total = UsageRow("total")
    for row in group_calls(logs, "tick", prices).values():
        total.add(row)
    return total


__all__ = [
    "BY_CHOICES",
    "EMBEDDINGS_ROW",
    "By",
    "UsageReport",
    "UsageRow",
    "entity_usage",
    "log_totals",
    "usage_report",
]
