"""Reading tick logs for people: what ``sim log`` and ``sim replay`` print.

Names, ids and answers come from the logged world and its models: untrusted. What is
printed inside a line (a name, a place's header, an intention, an outcome, a message) is
made one line here (``sim.terminal.one_line``), so a line break in it starts no line of its
own; the CLI shows the rest of the control characters (``printable``) as it prints."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson

from sim.errors import LogError
from sim.llm.redact import redact_text
from sim.terminal import one_line, wrapped
from sim.ticklog.books import call_cost, call_usage, embedding_cost
from sim.ticklog.format import list_logs
from sim.ticklog.reader import TickLog, read_log
from sim.ticklog.records import CallRecord, PolicyRecord
from sim.ticklog.summary import read_head, summarize, summary_numbers, summary_path

if TYPE_CHECKING:  # only their types: `sim log` must not import the runner
    from sim.engine.compact import Compacted
    from sim.engine.replay import ReplayReport, TickReplay
    from sim.providers.replay import Drift


def last_log(root: Path) -> TickLog:
    logs = list_logs(root)
    if not logs:
        raise LogError(f"{root}: no tick logs yet (run `sim tick` first)")
    return read_log(logs[-1][1])


def summary(log: TickLog) -> dict[str, Any]:
    """One tick in numbers: calls, failures, tokens and cost over every attempt (at the
    prices in effect when it ran; ``None``: a model had no price), attempts that timed out,
    wall time."""
    if log.compacted is not None:  # its calls are gone: the summary has the numbers
        path = summary_path(log.path.parent.parent.parent, log.tick)
        try:
            return summary_numbers(read_head(path))
        except LogError:
            pass
    return summary_numbers(summarize(log).head)


def compact_lines(done: Compacted) -> Iterator[str]:
    """What ``sim log --compact`` did."""
    mib = 1024 * 1024
    yield (
        f"compacted: {len(done.compressed)} logs compressed, {len(done.summarized)} "
        f"summaries written, call detail of {len(done.dropped)} ticks dropped "
        f"({done.calls_dropped} calls); logs {done.bytes_before / mib:.1f} MiB -> "
        f"{done.bytes_after / mib:.1f} MiB"
    )
    if done.dropped:
        ticks = _span(done.dropped)
        yield (
            f"note: {ticks} can no longer be replayed (`sim replay` answers from the calls "
            "dropped); `sim usage` and `sim log --tick all` keep their numbers, `sim export`'s "
            "calls table leaves them out, and `sim log`, `sim rewind`, `sim fork` still work"
        )
    for problem in done.problems:
        yield f"unreadable, left as it is: {problem}"


def _span(ticks: list[int]) -> str:
    """``tick 3`` or ``ticks 1-49`` (or ``ticks 1, 4, 9``: not a run)."""
    ordered = sorted(ticks)
    if len(ordered) == 1:
        return f"tick {ordered[0]}"
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"ticks {ordered[0]}-{ordered[-1]}"
    return "ticks " + ", ".join(str(t) for t in ordered)


def summary_line(data: dict[str, Any]) -> str:
    cost = "unknown" if data["cost"] is None else f"${data['cost']:.4f}"
    wall = "-" if data["wall"] is None else f"{data['wall']:.2f}s"
    state = "" if data["committed"] else "  (interrupted: not committed)"
    resumed = f"  resumed {data['resumes']}x" if data["resumes"] else ""
    timed = f"  {data['timed_out']} timed out (may be billed)" if data.get("timed_out") else ""
    embedded = (
        f"  +{data['embedding_requests']} embeddings requests "
        f"({data.get('embedding_tokens', 0)} tokens, in the totals)"
        if data.get("embedding_requests")
        else ""
    )
    return (
        f"{data['tick']:>6}  {data['calls']:>5}  {data['failures']:>8}  "
        f"{data['tokens']:>8}  {cost:>9}  {wall:>8}{resumed}{embedded}{timed}{state}"
    )


SUMMARY_HEAD = "  tick  calls  failures    tokens       cost      wall"


def _name(names: dict[str, str], key: str) -> str:
    """The display name of an id (else the id), on one line."""
    return one_line(names.get(key, key))


def _names(log: TickLog) -> dict[str, str]:
    """Location and character ids -> display names, from the logged state."""
    names: dict[str, str] = {}
    try:
        state = log.state()
    except (LogError, ValueError):
        return names
    for rel, data in state.items():
        if rel.startswith(("locations/", "characters/")):
            try:
                identity = orjson.loads(data)["identity"]
                names[identity["id"]] = identity["name"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
    return names


def tick_lines(log: TickLog) -> Iterator[str]:
    """The narrative, intentions and outcomes of one logged tick."""
    state = "" if log.committed else " (interrupted: not committed; `sim tick` resumes it)"
    yield f"== tick {log.tick} =={state}"
    yield from intervention_lines(log)
    narratives = log.phase_results("narrative")
    resolutions = log.phase_results("resolution")
    intentions = log.phase_results("intentions")
    names = _names(log)
    for lid in sorted(set(narratives) | set(resolutions)):
        yield ""
        yield f"[{_name(names, lid)}]"
        if lid in narratives:
            yield wrapped(str(narratives[lid]))
        for outcome in (resolutions.get(lid) or {}).get("outcomes", []):
            cid = str(outcome.get("character_id"))
            intent = intentions.get(cid) or {}
            target = f" {intent['target']}" if intent.get("target") else ""
            yield one_line(f"  {_name(names, cid)}: intends {intent.get('action', '?')}{target}")
            yield one_line(f"    -> {outcome.get('outcome', '')}")
    yield from declared_lines(log, names)
    yield from message_lines(log, names)
    for name, record in log.phases.items():
        for key, reason in record.report.errors.items():
            # a log written before errors were redacted may quote a server's credentials
            yield f"fallback: {name} {key}: {redact_text(reason)}"
        for key, models in record.report.model_fallbacks.items():
            yield one_line(f"fallback model: {name} {key}: {models}")
        for warning in record.report.warnings:
            yield one_line(f"ignored: {warning}")
        for gap in record.report.gaps:
            yield one_line(f"no outcome: {gap}")
    for decision in log.decisions:
        yield one_line(decision_line(decision))
    yield ""
    yield SUMMARY_HEAD
    yield summary_line(summary(log))


def message_lines(log: TickLog, names: dict[str, str]) -> Iterator[str]:
    """The messages the tick delivered (``[messages]``: the apply phase's results)."""
    sent = log.phase_results("apply").get("messages")
    if not isinstance(sent, list) or not sent:
        return
    yield ""
    yield "[messages]"
    for item in sent:
        if isinstance(item, dict):
            sender, recipient = str(item.get("from")), str(item.get("to"))
            who = f"{_name(names, sender)} -> {_name(names, recipient)}"
            yield one_line(f"  {who}: {item.get('text')}")


def decision_line(record: PolicyRecord) -> str:
    """One policy decision that was not "allow", as ``sim log`` shows it."""
    who = f"{record.phase} {record.entity_key or '-'} ({record.request_id})"
    if record.decision == "deny":
        return f"policy: denied {who} by {record.policy}: {record.reason}"
    if record.decision == "defer":
        until = f" until {record.until}" if record.until else ""
        return f"policy: deferred {who}{until} by {record.policy}: {record.reason}"
    return (
        f"policy: asked by {record.policy} before {who}: {record.reason} -> "
        f"{record.answer or '?'} ({record.by or '?'})"
    )


def intervention_lines(log: TickLog) -> Iterator[str]:
    """The ``sim inject`` / ``sim set`` interventions the tick applied, one line each."""
    from sim.interventions import describe, logged

    for record in logged(log):
        yield f"intervention {record.n}: {describe(record)}"


BUILTIN = ("intentions", "resolution", "narrative", "apply", "memory")


def answer_text(answer: object) -> str:
    """A declared phase's answer on one line: ``stance: for · mood: calm``."""
    if isinstance(answer, dict):
        return " · ".join(f"{k}: {answer_text(v)}" for k, v in answer.items())
    if isinstance(answer, list):
        return ", ".join(answer_text(v) for v in answer)
    return str(answer)


def conversation_lines(results: dict[str, Any], names: dict[str, str]) -> Iterator[str]:
    """The conversation phase's dialogues: each under its place, a line per utterance."""
    for talk in results.values():
        if not isinstance(talk, dict):
            continue
        yield ""
        where = str(talk.get("location"))
        yield f"[conversation at {_name(names, where)}]"
        for line in talk.get("lines") or ():
            if isinstance(line, dict):
                who = str(line.get("speaker"))
                yield one_line(f"  {_name(names, who)}: {line.get('says')}")
        yield one_line(f"  (ended: {talk.get('ended')})")


def declared_lines(log: TickLog, names: dict[str, str]) -> Iterator[str]:
    """The answers of the phases a world declared (or a package added), per subject."""
    for name in log.phases:
        if name in BUILTIN:
            continue
        results = log.phase_results(name)
        if not results:
            continue
        if name == "conversation":  # the built-in phase's dialogues, line by line
            yield from conversation_lines(results, names)
            continue
        yield ""
        yield f"[{one_line(name)}]"
        for subject, answer in results.items():
            yield one_line(f"  {_name(names, subject)}: {answer_text(answer)}")


CALLS_HEAD = (
    "request                                  model           depth  window  input tok  "
    "cached in  output tok       cost  error"
)


def _tools_called(result: dict[str, Any] | None) -> str:
    """The tools a tool-calling answer called (``look``, ``move_to``...), if it was one."""
    calls = result.get("calls") if isinstance(result, dict) else None
    if not isinstance(calls, list):
        return ""
    names = [str(c.get("name")) for c in calls if isinstance(c, dict)]
    return "tools: " + (", ".join(names) or "none")


def server_name(url: str) -> str:
    """A server as call lines show it: ``host:port`` (what tells a pool's servers apart;
    never a user or password written into the URL)."""
    netloc = urlsplit(url).netloc
    return netloc.rpartition("@")[2] or url


def _served_by(call: CallRecord) -> str:
    """``@ host:port`` of the server that ended the call, and the servers a pool moved it
    away from (``sim.llm.pool``); empty for calls that went over no network."""
    if call.endpoint is None:
        return ""
    away = [
        server_name(a.endpoint)
        for a in call.attempts
        if a.endpoint is not None and a.endpoint != call.endpoint and a.error_code is not None
    ]
    moved = f" (moved from {', '.join(dict.fromkeys(away))})" if away else ""
    return f"@ {server_name(call.endpoint)}{moved}"


def call_lines(log: TickLog) -> Iterator[str]:
    """One line per logged call: the model that answered (else the one asked), the depth
    asked for, the window actually sent (earlier exchanges, or a server-side chain), tokens
    over all attempts, and cost; for a tool-calling answer, the tools it called; the server
    that answered (and, with a pool, those the call moved away from); under a call that
    failed on several models, each model's error. A call a resume sent
    again has a line per record: the earlier one's attempts were sent too, so
    the lines add up to the tick's totals. Calls sent in a Batch API batch say ``batch``
    (priced at the batch rate), and each batch gets a line of its own after them."""
    if log.compacted is not None:
        yield (
            f"tick {log.tick}: call detail dropped by `sim log --compact --before "
            f"{log.compacted.before}` ({log.compacted.calls} calls); `sim usage` and "
            "`sim log --tick all` still have its numbers"
        )
        return
    yield CALLS_HEAD
    prices = log.header.prices
    for call in log.call_records:
        usage = call_usage(call)
        window = "chain" if call.previous_response_id else str(len(call.history))
        cost = call_cost(call, prices).text()
        model = call.response_model or call.model
        # the model a server said answered and the tools a model called: on one line
        yield one_line(
            f"{call.request_id:<40} {model!s:<15} "
            f"{call.depth:>5}  {window:>6}  {usage.input_tokens:>9}  "
            f"{usage.cached_input_tokens:>9}  {usage.output_tokens:>10}  "
            f"{cost:>9}  {call.error_code or ''}  {_served_by(call)}  "
            f"{_tools_called(call.result)}{'  batch' if call.batch_ids else ''}"
        ).rstrip()
        for failed in call.model_errors or ():  # each model of a fallback chain that failed
            yield f"    {failed.target}: {failed.error_code}: {failed.error}"
    for record in log.embeddings:  # [memory] embeddings = "provider": not calls
        model = f"{record.provider}/{record.model}" if record.provider else record.model
        yield one_line(
            f"embeddings before {record.phase}: {model}, {record.texts} texts, "
            f"{record.input_tokens} input tokens, "
            f"{embedding_cost(record, prices).text()}"
        )
    for batch in log.batches:  # sent through the OpenAI Batch API (half price)
        yield one_line(f"batch {batch.batch_id}: {batch.phase}, {len(batch.lines)} calls")


def drift_lines(drift: Drift) -> Iterator[str]:
    yield f"  {drift.request_id} ({drift.entity_key}): {', '.join(drift.fields)} differ"
    for line in drift.diff.splitlines():
        yield f"      {line}"


def change_lines(tick: TickReplay) -> Iterator[str]:
    """What changed since the tick was logged, by name."""
    if tick.config_note:
        yield f"  note: {tick.config_note}"
    if tick.phase_change:
        yield f"  phases changed: {tick.phase_change}"
    for change in tick.template_changes:
        yield f"  template {change}"
    for change in tick.schema_changes:
        yield f"  schema {change}"
    if tick.config_changes:
        yield "  config now differs from the logged one (the replay used the logged one):"
        for change in tick.config_changes:
            yield f"    {change}"


def replay_lines(report: ReplayReport, live: bool) -> Iterator[str]:
    for tick in report.ticks:
        if not tick.embeddings_match:  # a cache that lacked a text (--live fetched it)
            yield (
                f"tick {tick.tick}: its embeddings requests differ from the {tick.embeddings} "
                "logged (texts not in the world's .sim/embeddings were fetched again)"
            )
        if tick.identical:
            yield f"tick {tick.tick}: identical ({tick.served} calls served from the log)"
            if tick.reordered_files:
                yield (
                    "  the same state in normal key order (an earlier sim wrote these files "
                    f"with keys out of order): {', '.join(tick.reordered_files)}"
                )
            yield from change_lines(tick)
            continue
        what = []
        if tick.drifts:
            what.append(f"{len(tick.drifts)} requests drifted")
        what.append("state matches the log" if tick.state_matches else "state differs from the log")
        yield f"tick {tick.tick}: {', '.join(what)}"
        yield from change_lines(tick)
        for drift in tick.drifts:
            yield from drift_lines(drift)
        if tick.differing_files:
            yield f"  files that differ: {', '.join(tick.differing_files)}"
        if tick.edited_files:
            yield (
                "  the world's files differ from what this tick wrote (edited since it "
                f"committed): {', '.join(tick.edited_files)}"
            )
        if live:
            yield f"  sent live: {tick.sent}"
            for lid in sorted(set(tick.narratives) | set(tick.recorded_narratives)):
                old, new = tick.recorded_narratives.get(lid), tick.narratives.get(lid)
                if old != new:
                    yield f"  [{lid}] recorded: {old}"
                    yield f"  [{lid}] now:      {new}"
    yield "identical" if report.identical else "drifted"
