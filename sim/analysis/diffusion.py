"""Information diffusion in a study, measured as Generative Agents (Park et al. 2023, §7.1)
measured it in Smallville: awareness per tick, network density, and hallucinated
awareness.

A *topic* is a piece of news one character starts with (``examples/diffusion``: a party,
a candidacy), a yes/no survey question asking each character whether they have heard of
it, optionally a ``character`` survey asking from whom, and keywords that mark it in text.
From a study's folder (``sim study run``), per run and tick:

- **awareness**: how many characters answered yes (of how many asked), and its mean over
  runs with a 95% t interval;
- **network density**: the relationships (the ``edges`` table) as a directed graph,
  ``edges / (n (n - 1))`` for ``n`` characters, each character's ties to others only;
- **hallucinated awareness**: a yes from a character none of whose logged inputs so far
  held a keyword of the topic. A character's inputs up to tick ``t`` are its file as the
  run began (identity, state and memory, from the first tick log's state) and the input and
  history of every call made for it (``intention:ID``, ``plan:ID``, ...) in ticks 1..t. The
  share is over every awareness answer (yes or no), as the paper gives it (1.3%).

Only the study's folder is read: its tables (``sim.analysis.studytables``) and each run's
tick logs (``sim.ticklog.reader``).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sim.analysis.studyreport import Estimate, estimate
from sim.analysis.studytables import build_study_tables
from sim.errors import InputError
from sim.ticklog.format import list_logs
from sim.ticklog.reader import read_log


@dataclass(frozen=True)
class Topic:
    """A piece of news, the survey questions about it, and the words that mark it."""

    name: str
    question: str
    keywords: tuple[str, ...]
    source_question: str | None = None


@dataclass(frozen=True)
class Awareness:
    """A topic at one tick: aware characters per run, and the share's mean over runs."""

    tick: int
    aware: list[int]
    asked: list[int]
    share: Estimate

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TopicReport:
    """One topic's awareness per tick, its hallucinated yeses and the sources named."""

    topic: Topic
    ticks: list[Awareness]
    answers: int = 0
    hallucinated: int = 0
    sources: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic.name,
            "question": self.topic.question,
            "keywords": list(self.topic.keywords),
            "awareness": [a.to_dict() for a in self.ticks],
            "answers": self.answers,
            "hallucinated": self.hallucinated,
            "hallucinated_share": self.hallucinated / self.answers if self.answers else None,
            "sources": self.sources,
        }


@dataclass
class DiffusionReport:
    """Every topic's report, the network's density per tick, and the runs read."""

    topics: list[TopicReport]
    density: list[Estimate]
    runs: list[str]
    characters: int

    @property
    def hallucinated_share(self) -> float | None:
        answers = sum(t.answers for t in self.topics)
        return sum(t.hallucinated for t in self.topics) / answers if answers else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "characters": self.characters,
            "topics": [t.to_dict() for t in self.topics],
            "density": [d.to_dict() for d in self.density],
            "hallucinated_share": self.hallucinated_share,
        }


def _first_seen(run_dir: Path, keywords: Sequence[str], who: set[str]) -> dict[str, int]:
    """Each character's (of ``who``) first tick whose inputs held a keyword (0: its file as
    the run began)."""
    words = [k.casefold() for k in keywords]
    seen: dict[str, int] = {}

    def mark(character: str, tick: int, text: str) -> None:
        if character in who and character not in seen and any(w in text.casefold() for w in words):
            seen[character] = tick

    for i, (tick, path) in enumerate(list_logs(run_dir)):
        log = read_log(path)
        if i == 0:
            for rel, data in log.state().items():
                if rel.startswith("characters/") and rel.endswith(".json"):
                    name = rel.removeprefix("characters/").removesuffix(".json")
                    mark(name, tick - 1, data.decode("utf-8", "replace"))
        for call in log.call_records:
            _, _, character = (call.entity_key or "").partition(":")
            if character:
                mark(character, tick, "\n".join([call.input, *call.history]))
    return seen


def diffusion_report(out: Path, topics: Sequence[Topic]) -> DiffusionReport:
    """The diffusion of ``topics`` in the study in ``out``.

    Raises:
        InputError: not a study's folder, no run begun, or a topic whose question the
            study never asked.
        LogError: a tick log that cannot be read.
    """
    tables = build_study_tables(out)
    if not tables.runs:
        raise InputError(out, None, "no run of this study has begun: run sim study run first")
    surveys = tables.tables["surveys"].rows
    questions = {str(r.get("question")) for r in surveys}
    for topic in topics:
        for question in (topic.question, topic.source_question):
            if question is not None and question not in questions:
                raise InputError(
                    out, None, f"topic {topic.name}: the study never asked {question!r}"
                )
    characters: dict[str, set[str]] = {}
    for row in tables.tables["characters"].rows:
        characters.setdefault(f"{row['condition']}/{row['run']}", set()).add(str(row["character"]))
    reports: list[TopicReport] = []
    for topic in topics:
        report = TopicReport(topic, [])
        firsts = {
            rel: _first_seen(out / rel, topic.keywords, characters.get(rel, set()))
            for rel in tables.runs
        }
        counts: dict[tuple[str, int], list[int]] = {}
        sources: dict[tuple[str, int, str], str] = {}
        if topic.source_question is not None:
            for row in surveys:
                if row.get("question") == topic.source_question:
                    rel = f"{row['condition']}/{row['run']}"
                    sources[(rel, int(row["tick"]), str(row["character"]))] = str(row["answer"])
        source_counts: Counter[str] = Counter()
        last_tick = max(
            (int(r["tick"]) for r in surveys if r.get("question") == topic.question), default=0
        )
        for row in surveys:
            if row.get("question") != topic.question or row.get("answer") is None:
                continue
            rel, tick, who = (
                f"{row['condition']}/{row['run']}",
                int(row["tick"]),
                str(row["character"]),
            )
            yes = str(row["answer"]).strip().casefold() in ("yes", "true")
            tally = counts.setdefault((rel, tick), [0, 0])
            tally[0] += yes
            tally[1] += 1
            report.answers += 1
            first = firsts[rel].get(who)
            if yes and (first is None or first > tick):
                report.hallucinated += 1
            if yes and tick == last_tick and (rel, tick, who) in sources:
                source_counts[sources[(rel, tick, who)]] += 1
        for tick in sorted({t for _, t in counts}):
            runs = [rel for rel in tables.runs if (rel, tick) in counts]
            aware = [counts[(rel, tick)][0] for rel in runs]
            asked = [counts[(rel, tick)][1] for rel in runs]
            shares = [a / k for a, k in zip(aware, asked, strict=True)]
            report.ticks.append(Awareness(tick, aware, asked, estimate(tick, shares)))
        report.sources = dict(source_counts.most_common())
        reports.append(report)
    edges: dict[tuple[str, int], set[tuple[str, str]]] = {}
    for row in tables.tables["edges"].rows:
        rel = f"{row['condition']}/{row['run']}"
        if row["from"] != row["to"]:
            edges.setdefault((rel, int(row["tick"])), set()).add((str(row["from"]), str(row["to"])))
    ticks = sorted({int(r["tick"]) for r in tables.tables["characters"].rows})
    density = []
    for tick in ticks:
        values = []
        for rel in tables.runs:
            n = len(characters.get(rel, ()))
            if n > 1:
                values.append(len(edges.get((rel, tick), ())) / (n * (n - 1)))
        if values:
            density.append(estimate(tick, values))
    size = round(statistics.fmean(len(c) for c in characters.values())) if characters else 0
    return DiffusionReport(reports, density, list(tables.runs), size)


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def diffusion_lines(report: DiffusionReport) -> list[str]:
    """The report as text: awareness per topic and tick, density, hallucinations."""
    lines = [f"{len(report.runs)} runs of {report.characters} characters", ""]
    for topic in report.topics:
        lines.append(f"{topic.topic.name}: {topic.topic.question}")
        lines.append(f"{'tick':>6} {'aware (per run)':<22} {'share':>7}  95% interval")
        for a in topic.ticks:
            per_run = ", ".join(f"{x}/{n}" for x, n in zip(a.aware, a.asked, strict=True))
            ci = (
                f"[{_pct(a.share.low)}, {_pct(a.share.high)}]"
                if a.share.low is not None and a.share.high is not None
                else ""
            )
            lines.append(f"{a.tick:>6} {per_run:<22} {_pct(a.share.mean):>7}  {ci}")
        share = f"{_pct(topic.hallucinated / topic.answers)}" if topic.answers else "-"
        lines.append(
            f"hallucinated: {topic.hallucinated} of {topic.answers} answers ({share}): a yes "
            f"with no {'/'.join(topic.topic.keywords)} in the character's inputs so far"
        )
        if topic.sources:
            named = ", ".join(f"{who} {n}" for who, n in list(topic.sources.items())[:8])
            lines.append(f"heard it from (last tick, those aware): {named}")
        lines.append("")
    lines.append("network density (relationships, directed)")
    for d in report.density:
        ci = f"[{d.low:.3f}, {d.high:.3f}]" if d.low is not None and d.high is not None else ""
        lines.append(f"{d.tick:>6} {d.mean:.3f}  {ci}")
    total = report.hallucinated_share
    lines.append("")
    lines.append(f"hallucinated awareness, all topics: {'-' if total is None else _pct(total)}")
    return lines


__all__ = [
    "Awareness",
    "DiffusionReport",
    "Topic",
    "TopicReport",
    "diffusion_lines",
    "diffusion_report",
]
