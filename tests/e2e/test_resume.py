"""Interrupted ticks: crash, kill -9 and Ctrl-C, then resume without paying twice.

The child process runs ``sim tick`` through the real CLI with a slow offline adapter that
appends each answered call to a file (the provider's request count): forked for the kill -9
trials, a fresh ``crash_child.py`` process for Ctrl-C.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import orjson
import pytest
from click.testing import CliRunner
from conftest import copy_demo, hold_the_commit, tree

import sim.engine.runner
from sim.cli import main
from sim.config import load_config
from sim.engine.runner import Runner
from sim.engine.stack import Stack
from sim.errors import TickInterrupted
from sim.llm.types import AdapterResponse, ModelRequest
from sim.offline.adapter import OfflineAdapter
from sim.storage import Storage
from sim.storage.journal import JOURNAL
from sim.testing import CountingAdapter, call_digest, read_counts, read_in_flight
from sim.ticklog.format import log_path, marker_rel
from sim.ticklog.reader import TickLog, read_log
from sim.world import World

CHILD = Path(__file__).with_name("crash_child.py")
BASE_TICK = 5  # tick 6 of the demo calls every LLM phase (about 30 calls)
PHASES = ("intentions", "resolution", "narrative", "apply", "memory")
CONCURRENCY = 3  # crash_child.py runs `sim tick --concurrency 3`


class Crash(BaseException):
    """Stands in for the process dying: not an Exception, so nothing turns it into a failure."""


class CrashAt:
    """Answers like the offline model, but the process 'dies' as call number ``at`` starts."""

    name = "offline"

    def __init__(self, seed: int, at: int) -> None:
        self.inner = CountingAdapter(OfflineAdapter(seed=seed))
        self.at = at
        self.started = 0

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        self.started += 1
        if self.started == self.at:
            raise Crash
        return await self.inner.execute(request)

    async def delete_response(self, response_id: str) -> None:
        await self.inner.delete_response(response_id)


def config_for(world: Path, **overrides: object):
    return load_config(world_dir=world, cwd=world, overrides=overrides or None)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    world = copy_demo(tmp_path_factory.mktemp("base") / "demo")
    Runner(world, config_for(world)).run(BASE_TICK)
    return world


@pytest.fixture(scope="module")
def reference(base: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, TickLog]:
    """The files and log after an uninterrupted tick 6."""
    world = tmp_path_factory.mktemp("ref") / "demo"
    shutil.copytree(base, world)
    Runner(world, config_for(world, llm={"max_concurrency": 3})).run(1)
    return tree(world), read_log(log_path(world, BASE_TICK + 1))


def logged_calls(log: TickLog) -> set[str]:
    return {
        call_digest(log.instructions[c.instructions_digest], c.input) for c in log.calls.values()
    }


def resume(world: Path) -> CountingAdapter:
    adapter = CountingAdapter(OfflineAdapter(seed=7))
    Runner(world, config_for(world, llm={"max_concurrency": 3}), adapter=adapter).run(1)
    return adapter


@pytest.mark.parametrize("where", [0.0, 0.1, 0.3, 0.45, 0.6, 0.7, 0.85, 1.0])
def test_a_crash_mid_tick_resumes_to_the_same_result(
    base: Path, reference: tuple[dict, TickLog], tmp_path: Path, where: float
) -> None:
    """The process dies as call number ``at`` starts (``where`` = fraction of the tick)."""
    at = 1 + round(where * (len(reference[1].calls) - 1))
    world = tmp_path / "w"
    shutil.copytree(base, world)
    crashing = CrashAt(seed=7, at=at)
    with pytest.raises(BaseException) as caught:
        Runner(world, config_for(world, llm={"max_concurrency": 3}), adapter=crashing).run(1)
    assert (
        caught.group_contains(Crash)
        if isinstance(caught.value, BaseExceptionGroup)
        else isinstance(caught.value, Crash)
    )
    assert Storage(world).load().tick == BASE_TICK  # nothing committed
    partial = read_log(log_path(world, BASE_TICK + 1))
    assert not partial.committed
    assert logged_calls(partial) == set(crashing.inner.answered)  # nothing paid was lost

    again = resume(world)
    ref_tree, ref_log = reference
    assert not set(again.answered) & logged_calls(partial)  # nothing paid twice
    assert len(again.answered) + len(partial.calls) == len(ref_log.calls)
    assert tree(world) == ref_tree
    final = read_log(log_path(world, BASE_TICK + 1))
    assert final.committed and final.resumes == 1
    assert final.commit is not None and ref_log.commit is not None
    assert final.commit.state_after == ref_log.commit.state_after
    assert {c.digest for c in final.calls.values()} == {c.digest for c in ref_log.calls.values()}


def spawn(world: Path, count_file: Path, delay: float = 0.02, jitter: float = 0.03):
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(world), str(count_file), str(delay), str(jitter)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def fork_tick(
    world: Path,
    count_file: Path,
    delay: float = 0.02,
    jitter: float = 0.03,
    hold: str | None = None,
) -> int:
    """What ``crash_child.py`` does, in a forked child (no fresh interpreter per trial);
    ``hold``: see ``hold_the_commit``."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115

            def build(config: object, loaded: World) -> Stack:
                inner = OfflineAdapter(seed=loaded.seed)
                return Stack(
                    CountingAdapter(inner, delay=delay, jitter=jitter, count_file=count_file)
                )

            sim.engine.runner.build_run_stack = build  # type: ignore[assignment]
            if hold is not None:
                hold_the_commit(hold)
            main(["tick", "--world", str(world), "--concurrency", str(CONCURRENCY)])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            os._exit(code)
    return pid


def wait_for(predicate, timeout: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.001)
    return False


def log_has(world: Path, kind: str) -> bool:
    try:
        return f'"type":"{kind}"'.encode() in log_path(world, BASE_TICK + 1).read_bytes()
    except FileNotFoundError:
        return False


def past_the_commit_point(world: Path) -> bool:
    """The journal was renamed into place (it stays until the files are applied), or the
    files were applied, the log's commit marker among them."""
    return (world / JOURNAL).exists() or (world / marker_rel(BASE_TICK + 1)).exists()


#: where a trial kills the child: after this fraction of the tick's calls were answered,
#: in the commit before its commit point ("commit"), or after it, before the log is
#: completed ("committed")
TARGETS = [("calls", k / 14) for k in range(14)] + [("commit", 0.0)] * 4 + [("committed", 0.0)] * 2
#: the phases a kill must have landed in, besides the commit (each has calls in flight)
CALL_PHASES = ("intentions", "resolution", "narrative", "memory")
#: extra trials aimed at a phase no trial landed in (the parent can oversleep on a loaded
#: machine while the child moves on): at most this many per phase
AIM_RETRIES = 4


@pytest.mark.slow
def test_sigkill_at_random_instants_never_pays_twice(
    base: Path, reference: tuple[dict, TickLog], tmp_path: Path
) -> None:
    """≥30 kill -9 trials across every phase and the commit; each resumes to the same files."""
    rng = random.Random(4)
    ref_tree, ref_log = reference
    trials: list[tuple[str, float]] = [*TARGETS, *TARGETS[:12]]
    total = len(ref_log.calls)
    outcomes = {"before": 0, "after": 0}
    paid_twice = 0
    killed_in: set[str] = set()
    started = time.monotonic()
    cpu_started = os.times()

    def trial(i: int, kind: str, n: float) -> str:
        """Kill a tick at the target, recover, resume; check it; return where it was killed."""
        nonlocal paid_twice
        world = tmp_path / f"t{i}"
        shutil.copytree(base, world)
        counts = tmp_path / f"t{i}.calls"
        hold = {"commit": "before", "committed": "after"}.get(kind)
        child = fork_tick(world, counts, hold=hold)
        if kind == "calls":
            # past the goal, with calls in the provider's hands (no sleeping until then)
            goal = round(n * total)
            assert wait_for(
                lambda c=counts, g=goal: len(read_counts(c)) >= g and bool(read_in_flight(c))
            )
            # then a random instant, not at once: the poll wakes just after an answer was
            # counted, the one instant (before its log line) where a kill makes a call be
            # paid twice
            time.sleep(rng.uniform(0.0005, 0.02))
        elif kind == "commit":
            # any instant from the usage record to the journal's rename, which the child
            # holds until the kill: between the phases' end and the commit, while the
            # journal is written, or with it written and fsynced but not renamed
            assert wait_for(lambda: log_has(world, "usage"))
            time.sleep(rng.uniform(0, 0.004))
        else:
            # any instant from the commit point to the log's commit record, which the child
            # holds until the kill: the journal pending, files applied, the marker present
            assert wait_for(lambda: past_the_commit_point(world))
            time.sleep(rng.uniform(0, 0.004))
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        storage = Storage(world)
        with storage.lock():
            storage.recover()
        tick = storage.load().tick
        assert tick in (BASE_TICK, BASE_TICK + 1), f"trial {i}: world at tick {tick}"
        answered_before = read_counts(counts)
        durable: set[str] = set()
        where = "after the commit point"
        if tick == BASE_TICK:
            where = "before the log"
            if log_path(world, BASE_TICK + 1).is_file():
                # a log exists only with its header in it (created by rename)
                partial = read_log(log_path(world, BASE_TICK + 1))
                durable = logged_calls(partial)
                where = PHASES[len(partial.phases)] if len(partial.phases) < 5 else "commit"
        if kind == "commit":
            assert where == "commit", f"trial {i}: killed in {where}, not in the commit"
        elif kind == "committed":
            assert where == "after the commit point", f"trial {i}: killed in {where}"
        if tick == BASE_TICK:
            again = resume(world)
            outcomes["before"] += 1
            assert not set(again.answered) & durable, f"trial {i}: a logged call was re-sent"
            resent = set(again.answered) & set(answered_before)
            # only an answer arriving at the instant of the kill (answered, its log line not
            # yet written) can be paid twice: one of the last few, never an earlier one
            assert resent <= set(answered_before[-CONCURRENCY:]), f"trial {i}: {resent}"
            twice = len(resent)
            paid_twice += twice
            answered = len(answered_before) + len(again.answered)
        else:
            Runner(world, config_for(world)).run(0)  # completes the log from its marker
            outcomes["after"] += 1
            answered, twice = len(answered_before), 0
        final = read_log(log_path(world, BASE_TICK + 1))
        assert final.committed, f"trial {i}"
        files = tree(world)
        # killed after the commit, before the evicted responses were deleted: they stay
        # listed, to be deleted after the next tick's commit
        files.pop(".sim/pending_deletions.json", None)
        assert files == ref_tree, f"trial {i} ({kind} {n}) differs from an uninterrupted run"
        assert len(final.calls) == len(ref_log.calls)
        # what the provider answered for the tick = what the log records (+ any paid twice)
        assert answered == len(final.calls) + twice, f"trial {i}"
        return where

    for i, (kind, n) in enumerate(trials):
        killed_in.add(trial(i, kind, n))
    # a phase every planned trial missed (the parent overslept while the child moved on):
    # aim more trials just inside it, a bounded number, each checked like the others
    first_call = {
        p: sum(1 for c in ref_log.calls.values() if PHASES.index(c.phase) < k)
        for k, p in enumerate(PHASES)
    }
    aimed = 0
    for phase in CALL_PHASES:
        for _ in range(AIM_RETRIES):
            if phase in killed_in:
                break
            killed_in.add(trial(len(trials) + aimed, "calls", (first_call[phase] + 1) / total))
            aimed += 1
    assert killed_in >= {*CALL_PHASES, "commit", "after the commit point"}, killed_in
    ran = len(trials) + aimed
    assert outcomes["before"] >= 20 and outcomes["after"] + outcomes["before"] == ran
    # that instant is tens of microseconds per call (longer if the child is descheduled
    # there), so it is rare
    assert paid_twice <= len(trials) // 8, paid_twice
    # the trials are cheap (a forked child, no interpreter start-up): the CPU time they
    # take, not the wall clock, which a loaded machine stretches; the wall bound only
    # catches a hang
    cpu = os.times()
    used = sum(cpu[:4]) - sum(cpu_started[:4])
    assert used < 90, f"{used:.1f} s of CPU"
    assert time.monotonic() - started < 600
    print(
        f"kill -9 trials: {outcomes} ({aimed} aimed again), killed in: {sorted(killed_in)}, "
        f"paid twice: {paid_twice}, CPU {used:.1f} s"
    )


def test_ctrl_c_commits_nothing_prints_how_to_resume_and_exits_130(
    base: Path, reference: tuple[dict, TickLog], tmp_path: Path
) -> None:
    world = tmp_path / "w"
    shutil.copytree(base, world)
    counts = tmp_path / "calls"
    # slow calls (0.2 s or more each, three at a time): the intentions phase still has
    # calls in flight for most of a second after the poll sees one, however late a loaded
    # machine delivers the signal
    child = spawn(world, counts, delay=0.2)
    assert wait_for(lambda: len(read_counts(counts)) >= 4 and bool(read_in_flight(counts)))
    child.send_signal(signal.SIGINT)  # with calls in flight
    _, err = child.communicate(timeout=20)
    assert child.returncode == 130, err
    message = err.decode()
    assert f"nothing was committed for tick {BASE_TICK + 1}" in message
    assert f"run `sim tick --world {world}` again to resume tick {BASE_TICK + 1}" in message
    assert Storage(world).load().tick == BASE_TICK
    partial = read_log(log_path(world, BASE_TICK + 1))
    assert logged_calls(partial) == set(read_counts(counts))  # in-flight calls were cancelled
    cancelled = set(read_in_flight(counts))
    assert cancelled and not cancelled & logged_calls(partial)
    again = resume(world)
    assert not set(again.answered) & logged_calls(partial)
    assert cancelled <= set(again.answered)  # sent again: they were never answered
    assert tree(world) == reference[0]


def test_cli_maps_an_interrupt_to_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    world = copy_demo(tmp_path / "w")

    def interrupted(self: Runner, ticks: int = 1) -> list:
        raise TickInterrupted(world, 1)

    monkeypatch.setattr(Runner, "run", interrupted)
    result = CliRunner().invoke(main, ["tick", "--world", str(world)])
    assert result.exit_code == 130
    assert "again to resume tick 1" in result.output


def test_failed_deletions_are_kept_and_retried(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")

    class FlakyDeletes(CountingAdapter):
        fail = True
        deleted: ClassVar[list[str]] = []

        async def delete_response(self, response_id: str) -> None:
            if self.fail:
                raise OSError("provider down")
            self.deleted.append(response_id)

    adapter = FlakyDeletes(OfflineAdapter(seed=7))
    config = config_for(world, phase1={"response_chain_depth": 1})
    Runner(world, config, adapter=adapter).run(2)  # tick 2 evicts tick 1's intentions
    pending = orjson.loads((world / ".sim" / "pending_deletions.json").read_bytes())["pending"]
    assert len(pending) == 10 and all(p["tries"] == 1 for p in pending)
    adapter.fail = False
    Runner(world, config, adapter=adapter).run(1)
    assert {p["response_id"] for p in pending} <= set(adapter.deleted)
    assert not (world / ".sim" / "pending_deletions.json").exists()


def test_a_stale_partial_log_is_set_aside_not_used(
    base: Path, reference: tuple[dict, TickLog], tmp_path: Path
) -> None:
    world = tmp_path / "w"
    shutil.copytree(base, world)
    with pytest.raises(BaseException):  # noqa: B017 - the crash, in whatever group it comes
        Runner(world, config_for(world), adapter=CrashAt(seed=7, at=5)).run(1)
    path = world / "characters" / "tam.json"  # the world changes before the next run
    data = orjson.loads(path.read_bytes())
    data["state"]["mood"] = "furious"
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
    again = resume(world)
    # nothing is served from a log of another state
    assert len(again.answered) == len(reference[1].calls)
    assert list((world / ".sim" / "log" / "abandoned").iterdir())


def test_interrupt_messages_say_what_happened(tmp_path: Path) -> None:
    assert "resume tick 3" in str(TickInterrupted(tmp_path, 3))
    assert "tick 3 had committed" in str(TickInterrupted(tmp_path, 3, committed=True))
    assert "nothing was lost" in str(TickInterrupted(tmp_path, None))


def test_sim_check_notes_an_interrupted_tick_and_sim_tick_resumes_it(
    base: Path, reference: tuple[dict, TickLog], tmp_path: Path
) -> None:
    world = tmp_path / "w"
    shutil.copytree(base, world)
    with pytest.raises(BaseException):  # noqa: B017
        Runner(world, config_for(world), adapter=CrashAt(seed=7, at=15)).run(1)
    logged = len(read_log(log_path(world, BASE_TICK + 1)).calls)
    check = CliRunner().invoke(main, ["check", "--world", str(world)])
    assert f"tick {BASE_TICK + 1} was interrupted" in check.output
    assert f"({logged} calls already logged)" in check.output
    result = CliRunner().invoke(main, ["tick", "--world", str(world), "--concurrency", "3"])
    assert result.exit_code == 0, result.output
    assert f"resumed: {logged} calls taken from the interrupted tick's log" in result.output
    assert tree(world) == reference[0]


if os.name != "posix":  # pragma: no cover
    pytest.skip("signals need POSIX", allow_module_level=True)
