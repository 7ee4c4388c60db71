"""``sim study run``: a study's runs, with the sweep's machinery.

Every step of a run is one ``sim`` process on its folder, started by the executor of
``sim.runs.process`` (local processes or Ray tasks), with the user's trusted flags only
(``trusted_flags``: ``--config`` and the run's settings as ``--set``, the factors judged
first by the trust rule for study files, ``sim.study.trust``), never
``--trust-world-config``, in the folder the study was started in, and dying with it:

- ``sim tick`` up to the next stop (under a share of the study's budget);
- ``sim ask --all`` for a survey due at the run's tick (``--format`` or ``--schema``);
- ``sim inject`` / ``sim set`` for the interventions of the next tick.

Each step is found done or not from the run's own files (the tick in ``world.json``, the
answers in ``.sim/interviews.jsonl``, the pending ``.sim/interventions.json``), so running
the same study again resumes where it stopped and repeats nothing that completed.

**Matched arms.** The arms of a unit (a seed and factor values) share the ticks before the
first intervention of any condition. That prefix runs once, in ``DIR/_shared/<run>``
(with the surveys due in it); each arm is then forked from its current state into
``DIR/<condition>/<run>``, with the prefix's tick logs and survey answers copied byte for
byte, and runs on with its own interventions. The prefix's calls are made once per unit.

**Budget.** ``--budget-usd``/``--budget-tokens`` cap the whole study: what it has spent is
read from every folder's logs and answers, each copied log or answer counted once; each
step is given a share of what is left (``Ledger``), as ``--budget-usd`` for a tick and as
``budget.max_cost_usd`` for a survey.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from sim import safefs
from sim.config import Config, user_layers
from sim.errors import InputError
from sim.interventions import load_pending, parse_assignment
from sim.interview import INTERVIEW_DIGESTS, INTERVIEWS, Interview, read_interviews
from sim.llm.types import Usage
from sim.runs.design import SweepPlan
from sim.runs.fork import (
    MAX_STUDY_RECORD_BYTES,
    RUN_FILE,
    STUDY_RECORD,
    RunRecord,
    current_tick,
    finished,
    fork_current,
    read_record,
)
from sim.runs.inputs import Inputs, changed, inputs_of
from sim.runs.ledger import Grant, Ledger
from sim.runs.process import (
    STOPPED,
    Executor,
    RunOutcome,
    Status,
    SweepResult,
    failed_message,
    run_one,
    run_tasks,
    tick_command,
    trusted_flags,
)
from sim.storage import Storage, dump_json
from sim.study.design import SHARED, STUDY_COPY, Arm, Study, Unit, check_against_world
from sim.study.network import NETWORK_FACTOR, ConditionNetwork, apply_network
from sim.study.trust import check_factors
from sim.ticklog.books import Books
from sim.ticklog.format import LOG_DIR, list_logs, summary_rel
from sim.ticklog.reader import read_regular
from sim.ticklog.recovery import recover_logs
from sim.ticklog.summary import logged_books


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class StudyBooks:
    """What folders' logs and answers say was spent, each copied file or answer once."""

    seen: set[str]
    spend: Books

    @classmethod
    def empty(cls) -> StudyBooks:
        return cls(set(), Books())

    def add_folder(self, run_dir: Path, prices: Mapping[str, Any]) -> None:
        # a committed tick's books from its summary, not its whole log (``logged_books``):
        # the study's process reads every folder's, one after another
        for path, aside, books in logged_books(run_dir, prices):
            try:
                key = _digest(read_regular(path))
            except OSError:
                continue
            if key in self.seen:
                continue
            self.seen.add(key)
            self.spend.add(books, billed_only=aside)
        try:
            interviews = read_interviews(run_dir)
        except Exception:  # a damaged record: counted as nothing, `sim usage` names it
            interviews = []
        for interview in interviews:
            key = _digest(orjson.dumps(interview.model_dump(mode="json")))
            if key in self.seen:
                continue
            self.seen.add(key)
            self.spend.usage = self.spend.usage + _usage(interview)
            self.spend.cost = self.spend.cost + interview.cost(prices)
            self.spend.calls += 1
            self.spend.failures += int(interview.failed)


def _usage(interview: Interview) -> Usage:
    return interview.usage.to_usage()


def folder_spend(run_dir: Path, prices: Mapping[str, Any]) -> Books:
    books = StudyBooks.empty()
    books.add_folder(run_dir, prices)
    return books.spend


# -- the study's folder ----------------------------------------------------------------------


def _differing(recorded: Mapping[str, Any], design: Mapping[str, Any]) -> str:
    for key in ("world", "ticks", "prefix_ticks", "factors", "conditions", "surveys"):
        if recorded.get(key) != design.get(key):
            return key
    return "design"


def study_inputs(study: Study, layers: Mapping[str, Any]) -> Inputs:
    """The digests of a study's inputs: its world as forked, the user's config layers,
    its design (but its seeds) with its schema files, sim's version."""
    return inputs_of(study.world, layers, study.fingerprint(), exclude=(RUN_FILE,))


def check_folder(study: Study, out: Path, inputs: Inputs | None = None) -> None:
    """Refuse, before anything is written, a folder holding anything but this study, or
    this study run from other ``inputs`` (each one that changed named).

    Raises:
        InputError: ``out`` is a file, holds another study (names the field that differs)
            or files of something else (a sweep's runs, a world), or records other inputs.
    """
    if not out.exists():
        return
    if not out.is_dir() or out.is_symlink():
        raise InputError(out, None, "not a folder: expected the study's folder")
    _check_links(study, out)
    record = out / STUDY_RECORD
    if not os.path.lexists(record):
        if any(out.iterdir()):
            raise InputError(
                out,
                None,
                f"holds files of something else (no {STUDY_RECORD}): use another --out "
                "(nothing was written)",
            )
        return
    try:
        data = orjson.loads(safefs.read_file(out, STUDY_RECORD, MAX_STUDY_RECORD_BYTES))
        identity, recorded = data["identity"], data["design"]
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise InputError(record, None, f"cannot read the study's record: {exc}") from None
    if identity != study.identity():
        key = _differing(recorded if isinstance(recorded, dict) else {}, study.design())
        raise InputError(
            record,
            key,
            "records another study (its world or design differ): use another --out "
            "(nothing was written)",
        )
    if inputs is None:
        return
    try:
        recorded = None if data.get("inputs") is None else Inputs.model_validate(data["inputs"])
    except ValidationError as exc:
        raise InputError(record, "inputs", f"cannot read: {exc.errors()[0]['msg']}") from None
    differ = changed(recorded, inputs)
    if differ:
        raise InputError(
            record,
            "inputs",
            f"records this study run from other inputs; changed: {'; '.join(differ)}. Its "
            "runs would pool results of different inputs: use another --out (nothing was "
            "written)",
        )


def _check_links(study: Study, out: Path) -> None:
    """Refuse a link (or anything but a folder) where the study makes or continues a
    folder: ``_shared``, a condition's folder, a run's folder in them. Followed, it would
    put a whole run outside ``out``.

    Raises:
        InputError: naming the link.
    """
    for group in [SHARED, *study.spec.conditions]:
        folders = [out / group]
        if safefs.folder_problem(out / group) is None and (out / group).is_dir():
            folders += [out / group / unit.name for unit in study.units]
        for folder in folders:
            problem = safefs.folder_problem(folder)
            if problem is not None:
                raise InputError(
                    folder,
                    None,
                    f"{problem}: a study's folders must be its own, inside {out}; remove it "
                    "or use another --out (nothing was written)",
                )


def write_record(study: Study, out: Path, inputs: Inputs | None = None) -> None:
    """``DIR/study.json`` (the expanded design and the digests of its inputs) and
    ``DIR/study.toml`` (the file as given)."""
    out.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {
        "identity": study.identity(),
        "study_file": str(study.path.resolve()),
        "design": study.design(),
    }
    if inputs is not None:
        document["inputs"] = inputs.model_dump(mode="json")
    with safefs.open_dir(out, []) as dir_fd:
        for name, data in (
            (STUDY_RECORD, dump_json(document)),
            (STUDY_COPY, study.text.encode("utf-8")),
        ):
            # a link planted at the scratch name is removed, never written through
            tmp = f".{name}.tmp"
            safefs.unlink_at(dir_fd, tmp)
            safefs.write_stream_at(dir_fd, tmp, out / tmp, [data])
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _design(
    study: Study, unit: Unit, condition: str | None, fork_tick: int | None
) -> dict[str, Any]:
    out: dict[str, Any] = {"study": study.identity(), "condition": condition}
    if fork_tick is not None:
        out["fork_tick"] = fork_tick
    if unit.network is not None:  # the ``network`` factor: not a config override
        out[NETWORK_FACTOR] = unit.network
    return out


def _set_network(tmp: Path, network: ConditionNetwork | None, seed: int) -> None:
    """A fresh fork's relationships set to ``network`` (``sim.study.network``), before
    its first tick; nothing when ``None`` (the world's network)."""
    if network is None:
        return
    storage = Storage(tmp)
    world = storage.load()
    apply_network(world, network, seed)
    for rel, data in storage.changed_files(world).items():
        (tmp / rel).write_bytes(data)


def _check_run(run_dir: Path, study: Study, unit: Unit, condition: str | None) -> RunRecord:
    record = read_record(run_dir)
    design = record.design or {}
    if (
        record.seed != unit.seed
        or record.overrides != unit.overrides
        or design.get("study") != study.identity()
        or design.get("condition") != condition
        or design.get(NETWORK_FACTOR) != unit.network
    ):
        raise InputError(run_dir / RUN_FILE, None, "records another run of another design")
    return record


def _finish_fork(tmp: Path, dest: Path, record: RunRecord) -> None:
    (tmp / RUN_FILE).write_bytes(dump_json(record.model_dump(mode="json", exclude_none=True)))
    tmp.rename(dest)


def make_prefix(study: Study, out: Path, unit: Unit, inputs: Inputs | None = None) -> RunRecord:
    """``DIR/_shared/<run>``: a fork of the world for the unit's shared ticks."""
    run_dir = out / SHARED / unit.name
    if run_dir.exists():
        return _check_run(run_dir, study, unit, None)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    start = fork_current(study.world, run_dir, unit.seed, unit.overrides)
    tmp = run_dir.parent / f".{run_dir.name}.tmp"
    _set_network(tmp, study.network_of(None, unit), unit.seed)
    record = RunRecord(
        name=unit.name,
        seed=unit.seed,
        overrides=unit.overrides,
        source=str(study.world),
        start_tick=start,
        design=_design(study, unit, None, None),
        inputs=inputs,
    )
    _finish_fork(tmp, run_dir, record)
    return record


def make_arm(
    study: Study, out: Path, arm: Arm, start: int, inputs: Inputs | None = None
) -> RunRecord:
    """``DIR/<condition>/<run>``: forked from the unit's prefix at its current tick, with
    the prefix's logs and answers copied byte for byte (from the world without a prefix)."""
    run_dir = out / arm.rel
    if run_dir.exists():
        return _check_run(run_dir, study, arm.unit, arm.condition)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    prefix = out / SHARED / arm.unit.name if study.prefix > 0 else None
    source = prefix or study.world
    fork_tick = fork_current(source, run_dir, arm.unit.seed, arm.unit.overrides)
    tmp = run_dir.parent / f".{run_dir.name}.tmp"
    if prefix is None:  # forked from the world: its network set before its first tick
        _set_network(tmp, study.network_of(arm, arm.unit), arm.unit.seed)
    if prefix is not None:  # the prefix's folder is untrusted too: no link is followed
        for tick, path in list_logs(prefix):
            if tick > fork_tick:
                continue
            (tmp / LOG_DIR).mkdir(parents=True, exist_ok=True)
            rel = f"{LOG_DIR}/{path.name}"
            safefs.copy_file(prefix, rel, tmp / rel)
            with contextlib.suppress(FileNotFoundError):
                safefs.copy_file(prefix, summary_rel(tick), tmp / summary_rel(tick))
        for rel in (INTERVIEWS, INTERVIEW_DIGESTS):
            if os.path.lexists(prefix / rel):
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                safefs.copy_file(prefix, rel, tmp / rel)
    record = RunRecord(
        name=arm.unit.name,
        seed=arm.unit.seed,
        overrides=arm.unit.overrides,
        source=str(study.world),
        start_tick=start,
        design=_design(study, arm.unit, arm.condition, fork_tick),
        inputs=inputs,
    )
    _finish_fork(tmp, run_dir, record)
    return record


# -- one run's steps --------------------------------------------------------------------------


def _characters(run_dir: Path) -> set[str]:
    return {p.stem for p in (run_dir / "characters").glob("*.json")}


def survey_done(run_dir: Path, tick: int, question: str, form: str) -> bool:
    """Whether every character has a recorded answer to ``question`` at ``tick``."""
    try:
        interviews = read_interviews(run_dir)
    except Exception:
        return False
    answered = {
        i.character
        for i in interviews
        if i.tick == tick
        and i.question == question.strip()
        and (i.format or "text") == form
        and not i.failed
    }
    return _characters(run_dir) <= answered


def _queued(run_dir: Path) -> list[tuple[Any, ...]]:
    return [
        ("inject", r.text, r.location)
        if r.kind == "inject"
        else ("set", (r.target or "").partition("/")[2], r.path, orjson.dumps(r.after))
        for r in load_pending(run_dir).records
    ]


class StudyRunner:
    """Runs the steps of one study's runs (shared by the threads of ``run_study``)."""

    def __init__(
        self,
        study: Study,
        out: Path,
        plan: SweepPlan,
        ledger: Ledger,
        executor: Executor,
        waiting: int,
    ) -> None:
        self.study, self.out, self.plan, self.ledger = study, out, plan, ledger
        self.executor = executor
        self.waiting = waiting
        self.lock = threading.Lock()
        self.configs: dict[str, Config] = {}

    def config(self, overrides: Mapping[str, Any]) -> Config:
        key = orjson.dumps(dict(overrides), option=orjson.OPT_SORT_KEYS).decode()
        with self.lock:
            if key not in self.configs:
                self.configs[key] = self.plan.config(overrides)
            return self.configs[key]

    def _grant(self) -> Grant | str:
        with self.lock:
            waiting = self.waiting
        return self.ledger.grant(max(1, waiting))

    def _step(self, run_dir: Path, command: list[str], overrides: Mapping[str, Any]) -> int:
        return self.executor(run_dir, command, self.plan.cwd)

    def _paid_step(
        self, run_dir: Path, overrides: Mapping[str, Any], make: Callable[[Grant], list[str]]
    ) -> tuple[int, str]:
        grant = self._grant()
        if isinstance(grant, str):
            return -1000, grant.replace("sweep", "study")
        if self.ledger.cap_usd is None and self.ledger.cap_tokens is None:
            return self._step(run_dir, make(grant), overrides), ""  # nothing to count
        prices = self.config(overrides).prices
        before = folder_spend(run_dir, prices)
        code = self._step(run_dir, make(grant), overrides)
        self.ledger.settle(grant, before, folder_spend(run_dir, prices))
        return code, ""

    def _sim(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "sim", *args]

    def drive(
        self,
        run_dir: Path,
        start: int,
        ticks: int,
        condition: str | None,
        overrides: Mapping[str, Any],
    ) -> tuple[Status, str]:
        """Run a folder's steps to ``start + ticks``; (status, message)."""
        study = self.study
        target = start + ticks
        cond = study.spec.conditions.get(condition) if condition else None
        surveys = list(zip(study.spec.surveys, study.forms, strict=True))

        def due_surveys(tick: int) -> list[int]:
            return [
                i
                for i, (s, f) in enumerate(surveys)
                if tick - start in s.ticks and not survey_done(run_dir, tick, s.question, f.name)
            ]

        if finished(run_dir, target) and not due_surveys(current_tick(run_dir)):
            return "finished", ""
        trusted = trusted_flags(self.plan, overrides)
        config = self.config(overrides)
        storage = Storage(run_dir)
        with storage.lock():  # complete a commit cut short, so the tick count is right
            storage.recover()
            recover_logs(run_dir)
        while True:
            tick = current_tick(run_dir)
            k = tick - start
            for i in due_surveys(tick):
                survey, form = surveys[i]

                def ask(grant: Grant, survey: Any = survey, form: Any = form) -> list[str]:
                    command = self._sim("ask", "--world", str(run_dir.resolve()), *trusted)
                    if grant.usd is not None:
                        command += ["--set", f"budget.max_cost_usd={grant.usd!r}"]
                    if grant.tokens is not None:
                        command += ["--set", f"budget.max_total_tokens={grant.tokens}"]
                    if survey.schema_file is not None:
                        schema = (study.path.parent / survey.schema_file).resolve()
                        command += ["--schema", str(schema)]
                    elif form.name != "text":
                        command += ["--format", form.name]
                    return [*command, "--all", "--", survey.question]

                code, why = self._paid_step(run_dir, overrides, ask)
                if code != 0:
                    return "failed", why or f"survey at tick {k}: exit {code}"
            if tick >= target:
                return "done", ""
            if cond is not None:
                queued = _queued(run_dir)
                for event in cond.inject:
                    if event.tick != k + 1 or ("inject", event.text.strip(), event.at) in queued:
                        continue
                    where = ["--at", event.at] if event.at else ["--everywhere"]
                    command = self._sim("inject", "--world", str(run_dir.resolve()), *where)
                    code = self._step(run_dir, [*command, "--", event.text], overrides)
                    if code != 0:
                        return "failed", f"inject for tick {k + 1}: exit {code}"
                for edit in cond.set_:
                    parsed = parse_assignment(edit.assignment)
                    key = ("set", parsed.entity, ".".join(parsed.path), orjson.dumps(parsed.value))
                    if edit.tick != k + 1 or key in queued:
                        continue
                    command = self._sim("set", "--world", str(run_dir.resolve()))
                    if self.plan.trusted_config is not None:
                        command += ["--config", str(self.plan.trusted_config)]
                    code = self._step(run_dir, [*command, "--", edit.assignment], overrides)
                    if code != 0:
                        return "failed", f"set for tick {k + 1}: exit {code}"
            stops = [t for s in study.spec.surveys for t in s.ticks if t > k]
            if cond is not None:
                scheduled = [e.tick for e in cond.inject] + [e.tick for e in cond.set_]
                stops += [t - 1 for t in scheduled if t - 1 > k]
            stop = min([ticks, *stops])

            def tick_step(grant: Grant, n: int = stop - k) -> list[str]:
                return tick_command(run_dir, n, grant, config, trusted, self.plan.workers)

            code, why = self._paid_step(run_dir, overrides, tick_step)
            if code != 0 or current_tick(run_dir) < start + stop:
                if why:
                    return "not started" if current_tick(run_dir) == tick else "failed", why
                return "failed", failed_message(run_dir, code)

    def done_one(self) -> None:
        with self.lock:
            self.waiting -= 1


# -- the whole study -------------------------------------------------------------------------


def study_spend(study: Study, out: Path, plan: SweepPlan) -> Books:
    """What every folder of the study spent, each copied log or answer counted once."""
    books = StudyBooks.empty()
    for unit in study.units:
        prices = plan.config(unit.overrides).prices
        for rel in [f"{SHARED}/{unit.name}", *(f"{c}/{unit.name}" for c in study.spec.conditions)]:
            if (out / rel / RUN_FILE).is_file():
                books.add_folder(out / rel, prices)
    return books.spend


def run_study(
    study: Study,
    out: Path,
    jobs: int = 1,
    budget_usd: float | None = None,
    budget_tokens: int | None = None,
    config_file: Path | None = None,
    on_outcome: Callable[[RunOutcome], None] | None = None,
    executor: Executor = run_one,
    trust_study: bool = False,
    on_interrupt: Callable[[str], None] | None = None,
    workers: int = 1,
) -> SweepResult:
    """Run (or resume) every arm of ``study`` in ``out``: the shared prefixes first, then
    the arms forked from them, ``jobs`` folders at a time.

    A Ctrl-C stops it as ``sim.runs.process.run_tasks`` says (``on_interrupt`` is told);
    the result then says ``interrupted``.

    The study's factors are judged by the trust rule first (``sim.study.trust``: routing
    only with ``trust_study``, limits only tightened). ``workers``: each step's ticks on
    this many shards of its run's world (``sim tick --workers``).

    Raises:
        InputError: a factor the trust rule refuses, ``out`` holds something else
            (``check_folder``), a run folder in it records another run, a factor
            combination is not a valid config.
    """
    if out.resolve().is_relative_to(study.world.resolve()):  # each fork would copy the last
        raise InputError(
            out,
            "--out",
            f"inside the world {study.world}: each run would fork the runs before it; use a "
            "folder outside the world (nothing was written)",
        )
    plan = SweepPlan(study.world, out, [], study.spec.ticks, config_file, Path.cwd(), workers)
    layers = user_layers(config_file, plan.cwd)
    check_factors(study, layers, trust_study)
    for unit in study.units:  # every combination checked as a config before anything
        try:
            plan.config(unit.overrides)
        except InputError as exc:
            shown = ", ".join(f"{k}={v!r}" for k, v in unit.overrides.items())
            raise InputError(study.path, "factors", f"{shown}: {exc}") from None
    check_against_world(study, plan.config(study.units[0].overrides))
    inputs = study_inputs(study, layers)
    check_folder(study, out, inputs)
    now = current_tick(study.world)
    for unit in study.units:  # every existing run folder checked before anything is written
        for condition in [None, *study.spec.conditions]:
            rel = f"{condition or SHARED}/{unit.name}"
            if (out / rel).exists() and _check_run(
                out / rel, study, unit, condition
            ).start_tick != now:
                raise InputError(
                    out / rel / RUN_FILE,
                    "start_tick",
                    f"forked from {study.world} at another tick than its current one ({now}): "
                    "its runs would not start from one state; use another --out "
                    "(nothing was written)",
                )
    write_record(study, out, inputs)
    start = current_tick(study.world)
    ledger = Ledger(budget_usd, budget_tokens, study_spend(study, out, plan), jobs)
    arms = study.arms
    runner = StudyRunner(study, out, plan, ledger, executor, len(arms))
    outcomes: dict[str, RunOutcome] = {}
    prefix_failed: dict[str, str] = {}
    report_lock = threading.Lock()

    def report(outcome: RunOutcome, key: str) -> None:
        with report_lock:
            outcomes[key] = outcome
        if on_outcome is not None:
            on_outcome(outcome)

    def run_prefix(unit: Unit) -> None:
        if stopping.is_set():
            prefix_failed[unit.name] = STOPPED
            return
        record = make_prefix(study, out, unit, inputs)
        run_dir = out / SHARED / unit.name
        status, message = runner.drive(
            run_dir, record.start_tick, study.prefix, None, unit.overrides
        )
        if status not in ("done", "finished"):
            prefix_failed[unit.name] = f"shared prefix {SHARED}/{unit.name}: {message}"

    def run_arm(arm: Arm) -> None:
        target = start + study.spec.ticks
        base = RunOutcome(arm.rel, arm.unit.seed, arm.unit.overrides, "not started", 0, target)
        try:
            if arm.unit.name in prefix_failed:
                base.message = prefix_failed[arm.unit.name]
                base.status = "failed"
                return
            if stopping.is_set():
                base.message = STOPPED
                return
            record = make_arm(study, out, arm, start, inputs)
            run_dir = out / arm.rel
            base.target = record.start_tick + study.spec.ticks
            base.status, base.message = runner.drive(
                run_dir, record.start_tick, study.spec.ticks, arm.condition, arm.unit.overrides
            )
            base.tick = current_tick(run_dir)
            if stopping.is_set() and base.status not in ("done", "finished"):
                base.message = STOPPED
        finally:
            runner.done_one()
            report(base, arm.rel)

    stopping = threading.Event()
    interrupted = study.prefix > 0 and run_tasks(
        jobs,
        [functools.partial(run_prefix, unit) for unit in study.units],
        executor,
        stopping,
        on_interrupt,
    )
    if not interrupted:
        interrupted = run_tasks(
            jobs,
            [functools.partial(run_arm, arm) for arm in arms],
            executor,
            stopping,
            on_interrupt,
        )
    for arm in arms:  # not begun: Ctrl-C came first
        if arm.rel not in outcomes:
            tick = current_tick(out / arm.rel) if (out / arm.rel / RUN_FILE).is_file() else 0
            outcomes[arm.rel] = RunOutcome(
                arm.rel, arm.unit.seed, arm.unit.overrides, "not started", tick, 0, None, STOPPED
            )
    spent = study_spend(study, out, plan)
    unpriced = bool(spent.cost.unpriced)
    return SweepResult(
        [outcomes[arm.rel] for arm in arms],
        None if unpriced else round(spent.cost.usd, 8),
        spent.tokens,
        interrupted,
    )


__all__ = [
    "StudyBooks",
    "check_folder",
    "folder_spend",
    "make_arm",
    "make_prefix",
    "run_study",
    "study_inputs",
    "study_spend",
    "survey_done",
    "write_record",
]
