"""``sim sweep``: many runs of one world, the cross product of seeds and config settings.

Each run is a fork of the world's current state in its own folder, ``OUT/<run-name>/``,
named from its seed and settings (``seed-3_phase1.temperature=0.5``). The fork is a world
like any other: its ``world.json`` holds the run's seed, its ``config.toml`` the source
world's own config layer with the run's overrides (never the user's endpoints or keys, so
``sim tick --world OUT/<run-name>`` continues it under the trust rule, as for any world),
and ``sweep-run.json`` records the source world, the tick it started from, the seed and
the overrides. A run is one ``sim tick`` process on its folder: ``--jobs N`` runs N at a
time.

The run folders are untrusted input: anyone may edit them. A run's endpoints and key
variables come only from what the user trusts: the sweep's ``--config`` (else the
``./config.toml`` of the folder the sweep was started in), passed to each ``sim tick``
with the run's settings as ``--set`` flags, never ``--trust-world-config``; the child runs
in the sweep's own working folder, not in the run folder. A folder of runs that holds runs
of another world, or of other settings' keys, is refused by name before anything is
written. Each child dies with the sweep (``SIM_PARENT_PID``, ``sim.lifeline``).

Re-running a sweep skips the runs that reached their last tick (their folders are not
written to at all) and runs the others on: a run whose process was killed resumes its
interrupted tick from its log (the engine's resume), answering the calls already logged
without sending them again.

A budget (``--budget-usd``, ``--budget-tokens``) caps the whole sweep. What every run
spent is read from its tick logs (``sim.ticklog.books``: every attempt, abandoned logs
included). A run is given, as its own cap, a share of what is left when it starts: the
remainder less what runs still going were given, split among the runs that may start now
(at most ``--jobs``). The engine holds each run to its cap (each attempt reserves its
worst case before it is sent), so the sweep never spends more than its cap; what a run
did not use goes back to the pool when it ends. A run that meets its cap stops in the
middle of a tick and resumes on the next sweep; a run that cannot get a share is not
started.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

from sim.config import user_layers
from sim.runs.design import SweepPlan
from sim.runs.fork import RUN_FILE, RunRecord, check_out, current_tick, finished, prepare
from sim.runs.inputs import inputs_of
from sim.runs.ledger import Ledger, spend
from sim.runs.process import (
    STOPPED,
    Executor,
    RunOutcome,
    SweepResult,
    failed_message,
    run_one,
    run_tasks,
    tick_command,
    trusted_flags,
)
from sim.storage import Storage
from sim.ticklog.books import Books
from sim.ticklog.recovery import recover_logs


def run_sweep(
    plan: SweepPlan,
    jobs: int = 1,
    budget_usd: float | None = None,
    budget_tokens: int | None = None,
    on_outcome: Callable[[RunOutcome], None] | None = None,
    executor: Executor = run_one,
    on_interrupt: Callable[[str], None] | None = None,
) -> SweepResult:
    """Make the runs' folders, then run every unfinished run to its last tick, ``jobs`` at a
    time, each through ``executor`` (a local process by default; ``ray_executor``). A
    Ctrl-C stops it as ``sim.runs.process.run_tasks`` says (``on_interrupt`` is told).

    Raises:
        InputError: a run folder holds another run, or runs made from other inputs
            (``sim.runs.inputs``), or the world cannot be forked.
    """
    inputs = inputs_of(plan.world, user_layers(plan.config_file, plan.cwd), exclude=(RUN_FILE,))
    check_out(plan, inputs=inputs)
    dirs = [plan.out / spec.name for spec in plan.runs]
    # the folders made before: checked now; the others are forked by the worker that runs
    # them (``prepare`` in ``work``), so a world copy overlaps the runs already going
    # instead of delaying the first one by a copy per run
    records: dict[int, RunRecord] = {
        i: prepare(plan, spec, inputs=inputs)
        for i, spec in enumerate(plan.runs)
        if dirs[i].exists()
    }
    spent = {i: spend(dirs[i]) for i in records}
    total = Books()
    for one in spent.values():
        total.add(one)
    ledger = Ledger(budget_usd, budget_tokens, total, jobs)
    outcomes: list[RunOutcome | None] = [None] * len(plan.runs)
    todo = [
        i
        for i in range(len(plan.runs))
        if i not in records or not finished(dirs[i], records[i].start_tick + plan.ticks)
    ]
    waiting = [len(todo)]
    count_lock = threading.Lock()
    stopping = threading.Event()

    def report(index: int, outcome: RunOutcome) -> None:
        outcomes[index] = outcome
        if on_outcome is not None:
            on_outcome(outcome)

    for i, r in records.items():
        if i not in todo:
            target = r.start_tick + plan.ticks
            outcome = RunOutcome(
                r.name, r.seed, r.overrides, "finished", current_tick(dirs[i]), target
            )
            report(i, outcome)

    def work(index: int) -> None:
        run_dir = dirs[index]
        record = records.get(index)
        if stopping.is_set():
            return  # reported as not begun
        if record is None:
            record = prepare(plan, plan.runs[index], inputs=inputs)
        target = record.start_tick + plan.ticks
        with count_lock:
            left = waiting[0]
            waiting[0] -= 1
        base = RunOutcome(record.name, record.seed, record.overrides, "not started", 0, target)
        storage = Storage(run_dir)
        with storage.lock():  # complete a commit cut short, so the tick count is right
            storage.recover()
            recover_logs(run_dir)
        base.tick = current_tick(run_dir)
        if finished(run_dir, target):
            base.status = "done"
            report(index, base)
            return
        grant = ledger.grant(left)
        if isinstance(grant, str):
            base.message = grant
            report(index, base)
            return
        # the trusted layers and the command line's settings, never the run's folder: its
        # record's settings only matched them by value (``1 == true``)
        overrides = plan.runs[index].overrides
        config = plan.config(overrides)
        ticks = target - current_tick(run_dir)
        trusted = trusted_flags(plan, overrides)
        command = tick_command(run_dir, ticks, grant, config, trusted, plan.workers)
        code = executor(run_dir, command, plan.cwd)
        after = spend(run_dir)
        ledger.settle(grant, spent.get(index, Books()), after)
        base.tick, base.exit_code = current_tick(run_dir), code
        base.granted_usd, base.granted_tokens = grant.usd, grant.tokens
        if code == 0 and finished(run_dir, target):
            base.status = "done"
        else:
            base.status = "failed"
            base.message = STOPPED if stopping.is_set() else failed_message(run_dir, code)
        report(index, base)

    interrupted = run_tasks(
        jobs, [functools.partial(work, i) for i in todo], executor, stopping, on_interrupt
    )
    for i, spec in enumerate(plan.runs):  # not begun: Ctrl-C came first
        if outcomes[i] is None:
            tick = current_tick(dirs[i]) if i in records else 0
            outcomes[i] = RunOutcome(
                spec.name, spec.seed, spec.overrides, "not started", tick, 0, None, STOPPED
            )
    return SweepResult(
        [o for o in outcomes if o is not None],
        None if ledger.unpriced else round(ledger.spent_usd, 8),
        ledger.spent_tokens,
        interrupted,
    )


__all__ = [
    "run_sweep",
]
