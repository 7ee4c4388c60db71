"""``sim tick --workers N``: one world's tick on N processes, with one process's result.

The same world, config and seed give the same world files, the same story in ``sim log``
and the same books in ``sim usage`` with 1, 2 or 3 workers; a sharded tick replays as
``identical``. A worker that dies ends the tick with an error naming it and commits
nothing; kill -9 of the coordinator leaves the world at N or N+1, and the next run resumes
without paying again. The budget and the concurrency are the run's, across the workers.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import (
    WORLDS,
    copy_demo,
    install_distribution,
    omen_first,
    shard_workers_of,
    tree,
    vote_with_tools,
    with_a_tally,
    with_an_omen,
)

from sim.cli import main
from sim.cli.common import build_config
from sim.config import load_config
from sim.engine.replay import replay
from sim.engine.runner import Runner
from sim.engine.shard_processes import WorkerDied
from sim.engine.split import partition
from sim.llm.errors import LLMBudgetExceededError
from sim.llm.types import AdapterResponse, ModelRequest
from sim.offline.adapter import OfflineAdapter
from sim.runs.process import OUTPUT_FILE
from sim.storage import Storage
from sim.testing import CountingAdapter, read_counts
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

#: the minds world's own phases (planning, conversation, reflection, retrieval), with
#: conversations capped below the openers there are, some of them in each shard, and of
#: three: the cap is the world's, not each shard's
CONVERSATIONS = (
    "--set",
    "conversation.max_conversations_per_tick=2",
    "--set",
    "conversation.max_participants=3",
)


def invoke(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def without_walls(text: str) -> str:
    """``sim log`` / ``sim usage`` output without wall-clock times (timings and ETAs, in
    every form ``sim tick`` prints: ``4.2s``, ``42s``, ``3m05s``, ``1h02m``)."""
    return re.sub(r"\b(?:\d+h\d+m|\d+m\d+s|\d+(?:\.\d+)?s)\b", "<s>", text)


def run_world(source: Path, dest: Path, workers: int, ticks: int, *settings: str) -> Path:
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns(".sim"))
    args = ("--world", str(dest), "--ticks", str(ticks), "--workers", str(workers), *settings)
    shown = invoke("tick", *args)  # what `sim tick` prints: the same, timings aside
    (dest.parent / f"{dest.name}.out").write_text(without_walls(shown).replace(str(dest), "W"))
    return dest


def story(world: Path, ticks: int) -> list[str]:
    out = [without_walls(invoke("log", "--world", str(world), "--tick", "all"))]
    for tick in range(1, ticks + 1):
        out.append(without_walls(invoke("log", "--world", str(world), "--tick", str(tick))))
        # one line per call, in the order they completed: that order is the provider's
        # (as with one process and a real server), the lines are the same
        calls = invoke("log", "--world", str(world), "--tick", str(tick), "--calls")
        out.append("\n".join(sorted(without_walls(calls).splitlines())))
    out.append(without_walls(invoke("usage", "--world", str(world))))
    return out


def test_partition_is_contiguous_balanced_and_never_empty() -> None:
    where = {"a": ["1", "2", "3"], "b": ["4"], "c": ["5", "6"], "d": ["7", "8"]}
    assert partition(where, 1) == [("a", "b", "c", "d")]
    assert partition(where, 2) == [("a", "b"), ("c", "d")]
    assert partition(where, 3) == [("a",), ("b", "c"), ("d",)]
    assert partition(where, 9) == [("a",), ("b",), ("c",), ("d",)]
    # the first run a larger share (the coordinator's, whose calls cost it less)
    assert partition(where, 2, first=0.5) == [("a",), ("b", "c", "d")]
    assert partition(where, 2, first=3.0) == [("a", "b", "c"), ("d",)]
    assert partition(where, 3, first=2.0) == [("a", "b"), ("c",), ("d",)]


#: a phase the minds world declares after its characters moved and reflected: per place,
#: its input each present character's whole memory (today's plan, the last cells), which
#: a character of another shard who moved in brings (``split.mixed``)
GOSSIP = {
    "prompts/gossip.md": "Say the rumour going round {{ location.identity.name }}.\n",
    "prompts/gossip.input.md": (
        "{{ location.identity.name }}:\n"
        "{% for p in present %}{{ p.identity.name }} ({{ p.state.mood }}) remembers: "
        "{% for cell in p.memory.cells[-2:] %}{{ cell.text }} {% endfor %}"
        "{{ p.memory.plan | tojson }}\n{% endfor %}"
    ),
    "schemas/gossip.json": json.dumps(
        {
            "title": "Gossip",
            "type": "object",
            "properties": {"rumour": {"type": "string", "maxLength": 160}},
            "required": ["rumour"],
            "additionalProperties": False,
        }
    ),
    "config.toml": (
        '\n[phases.gossip]\nper = "location"\ninstructions = "prompts/gossip.md"\n'
        'input = "prompts/gossip.input.md"\nschema = "schemas/gossip.json"\n'
        'writes = { "state.rumour" = "rumour" }\n'
    ),
}


def gossip_world(dest: Path) -> Path:
    """The minds world with ``GOSSIP`` after its reflection."""
    shutil.copytree(WORLDS / "minds", dest, ignore=shutil.ignore_patterns(".sim"))
    for rel, text in GOSSIP.items():
        path = dest / rel
        path.parent.mkdir(exist_ok=True)
        path.write_text((path.read_text() if path.exists() else "") + text)
    config = dest / "config.toml"
    config.write_text(
        config.read_text().replace('"reflection", "memory"', '"reflection", "gossip", "memory"')
    )
    return dest


def messages_world(dest: Path) -> Path:
    """A world of ``sim init`` whose characters message their ties (``[messages]``),
    some of them in another shard's places."""
    invoke("init", str(dest), "--characters", "12", "--locations", "6", "--network", "ring")
    with (dest / "config.toml").open("a") as handle:
        handle.write("\n[messages]\nenabled = true\n")
    return dest


@pytest.mark.parametrize(
    ("source", "ticks", "settings"),
    [
        (WORLDS / "demo", 6, ()),
        (WORLDS / "minds", 3, CONVERSATIONS),
        (WORLDS / "harvest-vote", 4, ()),
        (gossip_world, 3, CONVERSATIONS),
        (messages_world, 4, ()),
        (vote_with_tools, 3, ()),
        (with_an_omen, 3, ()),
        (omen_first, 3, ()),
    ],
    ids=[
        "demo",
        "minds",
        "harvest-vote",
        "gossip",
        "messages",
        "vote-with-tools",
        "omen-last",
        "omen-first",
    ],
)
def test_one_two_and_three_workers_give_the_same_files_story_and_books(
    tmp_path: Path, source: Path | Callable[[Path], Path], ticks: int, settings: tuple[str, ...]
) -> None:
    """With 1, 2 and 3 workers: the built-in phases, the minds world's (conversations
    capped over the world), the harvest vote's phase (declared per character, after the
    moves), a phase declared per place that reads the whole memory of whoever is there,
    some of them come from another shard's place that tick, messages to ties wherever
    they are, the vote with a query tool (``look``: at whoever is there, after the
    moves), and a phase declared per world (run by ``sim tick`` on the whole world), last
    or first (its answer in ``world.json`` before the others' phases)."""
    if not isinstance(source, Path):
        source = source(tmp_path / "source")
    worlds = [run_world(source, tmp_path / f"w{n}", n, ticks, *settings) for n in (1, 2, 3)]
    one = tree(worlds[0])
    assert len([rel for rel in one if rel.startswith("characters/")]) >= 6
    told = story(worlds[0], ticks)
    assert "calls" in told[0]
    for world in worlds[1:]:
        shown = (world.parent / f"{world.name}.out").read_text()
        assert "one process" not in shown  # sharded, every tick
        assert tree(world) == one  # byte for byte, every file but the logs' timings
        assert shown == (worlds[0].parent / f"{worlds[0].name}.out").read_text()
        assert story(world, ticks) == told
        # each phase's logged results, in the same order
        for tick in range(1, ticks + 1):
            ours = read_log(log_path(world, tick))
            theirs = read_log(log_path(worlds[0], tick))
            assert [(n, list(p.results.items()), p.report) for n, p in ours.phases.items()] == [
                (n, list(p.results.items()), p.report) for n, p in theirs.phases.items()
            ]
            assert ours.commit is not None and theirs.commit is not None
            assert ours.commit.state_after == theirs.commit.state_after
    # a sharded tick replays from its log as identical
    config = build_config(None, worlds[2], settings=settings[1::2])  # the --set values
    report = replay(worlds[2], 1, ticks, config=config)
    assert report.identical, [(t.tick, t.drifts[:1]) for t in report.ticks]


def test_a_phase_that_spans_the_world_runs_in_one_process_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick that cannot be sharded (here with a package's phase that does not say it is
    about one place at a time, first: no phase before it runs on a part) runs as
    ``--workers 1`` would, the same files written, and says so by name."""
    worlds = [with_a_tally(tmp_path / name, monkeypatch) for name in ("one", "two")]
    alone = CliRunner().invoke(main, ["tick", "--world", str(worlds[0]), "--ticks", "2"])
    assert alone.exit_code == 0, alone.output
    result = CliRunner().invoke(
        main, ["tick", "--world", str(worlds[1]), "--ticks", "2", "--workers", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "--workers 2: ran in one process (phase 'tally' runs over the whole world" in (
        result.output
    )
    assert tree(worlds[1]) == tree(worlds[0])
    world = worlds[1]
    bad = CliRunner().invoke(main, ["tick", "--world", str(world), "--workers", "two"])
    assert bad.exit_code == 2 and "--workers" in bad.output


def _children() -> list[int]:
    """This process's child processes (Linux)."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me:
            found.append(int(entry.name))
    return sorted(found)


class KillsAWorker:
    """The offline model behind the coordinator, counting answers; as call ``at`` arrives
    it kills a worker (kill -9) and answers on."""

    name = "offline"

    def __init__(self, seed: int, at: int) -> None:
        self.inner = CountingAdapter(OfflineAdapter(seed=seed), delay=0.01)
        self.at = at
        self.started = 0
        self.killed: int | None = None

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        self.started += 1
        if self.started == self.at:
            self.killed = _children()[-1]
            os.kill(self.killed, signal.SIGKILL)
        return await self.inner.execute(request)

    async def delete_response(self, response_id: str) -> None:
        await self.inner.delete_response(response_id)


def config_for(world: Path, **overrides: object):  # type: ignore[no-untyped-def]
    return load_config(world_dir=world, cwd=world, overrides=overrides or None)


def ticked_and_reference(base: Path, ticks: int) -> tuple[Path, Path]:
    """``base`` run ``ticks`` ticks in one process, and a copy of it run one more (what
    the tick after, however it is run, must leave): ``(base, reference)``."""
    Runner(base, config_for(base)).run(ticks)
    reference = base.parent / "ref"
    shutil.copytree(base, reference)
    Runner(reference, config_for(reference)).run(1)
    return base, reference


@pytest.mark.parametrize("at", [1, 12, 25])
def test_a_worker_killed_mid_tick_is_named_commits_nothing_and_the_resume_pays_once(
    tmp_path: Path, at: int
) -> None:
    base, reference = ticked_and_reference(copy_demo(tmp_path / "base"), 5)  # tick 6: every phase
    world = tmp_path / "w"
    shutil.copytree(base, world)
    before = tree(world)
    killer = KillsAWorker(seed=7, at=at)
    with pytest.raises(WorkerDied) as caught:
        Runner(world, config_for(world), adapter=killer, workers=2).run(1)
    message = str(caught.value)
    assert f"pid {killer.killed})" in message and "worker " in message, message
    assert "died in the middle of the tick" in message and "exit status -9" in message
    assert tree(world) == before  # nothing committed
    assert Storage(world).load().tick == 5
    assert not _children() and not shard_workers_of(world)  # no worker left behind
    paid = list(killer.inner.answered)
    # the next run (with 3 workers) resumes: no logged call is paid for again
    resumed = CountingAdapter(OfflineAdapter(seed=7))
    Runner(world, config_for(world), adapter=resumed, workers=3).run(1)
    assert tree(world) == tree(reference)
    logged = read_log(log_path(world, 6))
    assert not set(paid) & set(resumed.answered)  # nothing paid twice
    assert len(set(paid) | set(resumed.answered)) == len(logged.calls)


class KillsAtPhase(KillsAWorker):
    """``KillsAWorker``, killing at the first call of phase ``phase``."""

    def __init__(self, seed: int, phase: str) -> None:
        super().__init__(seed, at=0)
        self.phase = phase

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        if self.killed is None and request.call is not None and request.call.phase == self.phase:
            self.killed = _children()[-1]
            os.kill(self.killed, signal.SIGKILL)
        return await self.inner.execute(request)


def test_a_worker_killed_in_a_declared_phase_after_the_moves_resumes_as_one_process(
    tmp_path: Path,
) -> None:
    """The harvest vote, sharded: a worker killed at the vote (after the barrier at which
    the shards exchanged who shares a place) is named, nothing is committed, and the
    resume, with another number of workers, pays no logged call again and ends as one
    process does."""
    base = tmp_path / "base"
    shutil.copytree(WORLDS / "harvest-vote", base, ignore=shutil.ignore_patterns(".sim"))
    base, reference = ticked_and_reference(base, 2)
    world = tmp_path / "w"
    shutil.copytree(base, world)
    before = tree(world)
    killer = KillsAtPhase(seed=11, phase="vote")  # the world's seed
    with pytest.raises(WorkerDied) as caught:
        Runner(world, config_for(world), adapter=killer, workers=2).run(1)
    assert f"pid {killer.killed})" in str(caught.value)
    assert tree(world) == before
    paid = list(killer.inner.answered)
    resumed = CountingAdapter(OfflineAdapter(seed=11))
    Runner(world, config_for(world), adapter=resumed, workers=3).run(1)
    assert tree(world) == tree(reference)
    logged = read_log(log_path(world, 3))
    assert not set(paid) & set(resumed.answered)
    assert len(set(paid) | set(resumed.answered)) == len(logged.calls)
    assert logged.phase_results("vote") == read_log(log_path(reference, 3)).phase_results("vote")


def killed_when_paid(world: Path, counts: Path, target: int) -> list[str]:
    """``sim tick --workers 2`` of ``world`` (``crash_child.py``: the offline model, slowed,
    counting its answers in ``counts``) killed with kill -9 once ``target`` calls are
    answered; its workers see their socket close and exit. Returns the calls it paid."""
    import subprocess
    import sys
    import time

    child = Path(__file__).with_name("crash_child.py")
    process = subprocess.Popen(
        [sys.executable, str(child), str(world), str(counts), "0.02", "0.03", "--workers", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if len(read_counts(counts) if counts.exists() else []) >= target:
            break
        time.sleep(0.002)
    process.kill()
    process.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and shard_workers_of(world):
        time.sleep(0.05)
    assert not shard_workers_of(world)
    return read_counts(counts) if counts.exists() else []


@pytest.mark.parametrize("form", ["folders", "pack"])
def test_the_coordinator_killed_at_any_point_leaves_n_or_n_plus_1_and_pays_once(
    tmp_path: Path, form: str
) -> None:
    """kill -9 of ``sim tick --workers 2`` (the coordinator) at several points of the tick:
    its workers go too, the world is never torn, and the resume pays only what the log
    lacks; in folders, and packed (``sim pack``: its pack replaced whole at the commit)."""
    from sim.storage.forms import pack
    from sim.testing import read_in_flight

    base, reference = ticked_and_reference(copy_demo(tmp_path / "base"), 5)
    if form == "pack":
        pack(base)
        pack(reference)
    expected = tree(reference)
    total = len(read_log(log_path(reference, 6)).calls)

    outcomes = []
    for i, fraction in enumerate((0.1, 0.5, 0.9, 1.0)):
        world = tmp_path / f"k{i}"
        shutil.copytree(base, world)
        counts = tmp_path / f"counts{i}"
        paid = killed_when_paid(world, counts, max(1, round(fraction * total)))
        tick = Storage(world).load().tick
        assert tick in (5, 6)
        if tick == 5:
            assert {r for r in tree(world) if not r.startswith(".sim/")} == {
                r for r in tree(base) if not r.startswith(".sim/")
            }
        resumed = CountingAdapter(OfflineAdapter(seed=7))
        Runner(world, config_for(world), adapter=resumed, workers=2).run(1 if tick == 5 else 0)
        assert tree(world) == expected, f"trial {i}: killed at {fraction}"
        # every call paid at most once, but one answered in the instant of the kill
        in_flight = read_in_flight(counts) if counts.exists() else []
        twice = [n for n in resumed.answered if n in paid]
        assert len(twice) <= len(in_flight) + 1, (i, twice)
        outcomes.append((fraction, tick, len(paid), len(resumed.answered)))
    assert any(t == 5 and p > 0 for _, t, p, _ in outcomes), outcomes


@pytest.mark.parametrize("at", ["before the handover", "in the phase run alone"])
def test_kill_9_around_a_handover_leaves_n_or_n_plus_1_and_resumes_as_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    """kill -9 of ``sim tick --workers 2`` while its shards run their parts, or after they
    handed them over and it runs a package's phase alone (``split.alone``): the world is
    at N or N+1, its worker goes too, and the resume pays only what the log lacks and
    leaves one process's world."""
    from sim.testing import read_in_flight
    from sim.testing.plugins import CENSUS

    site = tmp_path / "site"
    entry = "census = simtest_census:CensusPhase"
    install_distribution(site, monkeypatch, "simtest_census", CENSUS, "sim.phases", entry)
    monkeypatch.setenv("PYTHONPATH", str(site))  # the child and its worker import it too
    base = copy_demo(tmp_path / "base")
    (base / "config.toml").write_text(
        '[tick]\nphases = ["intentions", "resolution", "narrative", "apply", "census", "memory"]\n'
    )
    base, reference = ticked_and_reference(base, 2)
    calls = read_log(log_path(reference, 3)).calls.values()
    census = len([c for c in calls if c.phase == "census"])
    assert census >= 4
    target = len(calls) - census - 3 if at == "before the handover" else len(calls) - 2
    world, counts = tmp_path / "w", tmp_path / "counts"
    shutil.copytree(base, world)
    paid = killed_when_paid(world, counts, target)
    assert len(paid) >= target - 1
    tick = Storage(world).load().tick
    assert tick in (2, 3)
    resumed = CountingAdapter(OfflineAdapter(seed=7))
    Runner(world, config_for(world), adapter=resumed, workers=2).run(1 if tick == 2 else 0)
    assert tree(world) == tree(reference)
    # the answers the log held were not asked for again: at most those in flight at the
    # kill, and one answered in its instant
    in_flight = len(read_in_flight(counts))
    if tick == 2:
        assert len(resumed.answered) <= len(calls) - len(paid) + in_flight + 1
    twice = [n for n in resumed.answered if n in paid]
    assert len(twice) <= in_flight + 1, twice


@pytest.mark.parametrize("calls", ["on the workers", "on the coordinator"])
def test_the_workers_serve_every_tick_of_a_run_and_go_with_it(tmp_path: Path, calls: str) -> None:
    """``--workers 3 --ticks 3``: two worker processes (the coordinator runs the first
    shard), started with the first tick and serving the others (no start-up per tick),
    gone when the run ends; the files are one process's, whether the workers run their
    calls or the coordinator answers them (an adapter handed to the ``Runner``)."""
    reference = copy_demo(tmp_path / "ref")
    Runner(reference, config_for(reference)).run(3)
    world = copy_demo(tmp_path / "w")
    seen: list[list[int]] = []
    adapter = OfflineAdapter(seed=7) if calls == "on the coordinator" else None
    Runner(
        world,
        config_for(world),
        adapter=adapter,
        workers=3,
        on_tick=lambda _: seen.append(shard_workers_of(world)),
    ).run(3)
    assert len(seen) == 3 and len(seen[0]) == 2 and seen[0] == seen[1] == seen[2]
    assert not shard_workers_of(world) and not _children()
    assert tree(world) == tree(reference)


def test_a_sweep_and_a_study_shard_each_steps_ticks_with_one_processs_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sim sweep --workers 2`` and ``sim study run --workers 2`` give each step's ``sim
    tick`` the flag: the runs' world files are those of ``--workers 1``, and a world whose
    phase cannot be sharded says so in its run's output."""
    demo = copy_demo(tmp_path / "world")
    (tmp_path / "study.toml").write_text(
        'world = "world"\nseeds = "1-2"\nticks = 2\n[conditions.control]\n', encoding="utf-8"
    )
    made: dict[int, tuple[Path, Path]] = {}
    for n in (1, 2):
        sweep, study = tmp_path / f"sweep{n}", tmp_path / f"study{n}"
        args = ["--seeds", "1-2", "--ticks", "2", "--out", str(sweep), "--workers", str(n)]
        done = CliRunner().invoke(main, ["sweep", "--world", str(demo), *args])
        assert done.exit_code == 0, done.output
        study_file = str(tmp_path / "study.toml")
        done = CliRunner().invoke(
            main, ["study", "run", study_file, "--out", str(study), "--workers", str(n)]
        )
        assert done.exit_code == 0, done.output
        made[n] = (sweep, study)
    for one, two in zip(made[1], made[2], strict=True):
        runs = sorted(p.relative_to(one) for p in one.glob("**/world.json"))
        assert len(runs) == 2
        for run in runs:  # what sim tick printed, with its timings, aside
            ours, theirs = tree(two / run.parent), tree(one / run.parent)
            assert ours.pop(OUTPUT_FILE) and theirs.pop(OUTPUT_FILE)
            assert ours == theirs
    tally = with_a_tally(tmp_path / "tally", monkeypatch)
    (tmp_path / "tallies.toml").write_text(
        'world = "tally"\nseeds = "1"\nticks = 1\n[conditions.control]\n', encoding="utf-8"
    )
    sweep, study = tmp_path / "tally-sweep", tmp_path / "tally-study"
    args = ["--world", str(tally), "--seeds", "1", "--ticks", "1", "--out", str(sweep)]
    done = CliRunner().invoke(main, ["sweep", *args, "--workers", "2"])
    assert done.exit_code == 0, done.output
    study_file = str(tmp_path / "tallies.toml")
    done = CliRunner().invoke(
        main, ["study", "run", study_file, "--out", str(study), "--workers", "2"]
    )
    assert done.exit_code == 0, done.output
    for out in (sweep, study):
        said = [p.read_text() for p in out.glob(f"**/{OUTPUT_FILE}")]
        assert len(said) == 1 and "--workers 2: ran in one process (phase 'tally'" in said[0]


def test_the_budget_is_the_runs_not_each_workers(tmp_path: Path) -> None:
    """A token budget below the tick's use stops the sharded tick as it stops one process:
    two workers do not get one budget each."""
    base = copy_demo(tmp_path / "base")
    probe = tmp_path / "probe"
    shutil.copytree(base, probe)
    used = Runner(probe, config_for(probe)).run(1)[0].usage.total_tokens
    cap = int(used * 0.6)  # each of 2 workers uses about half: under it, if each had its own
    for workers in (1, 2):
        world = tmp_path / f"b{workers}"
        shutil.copytree(base, world)
        with pytest.raises(LLMBudgetExceededError):
            Runner(world, config_for(world, budget={"max_total_tokens": cap}), workers=workers).run(
                1
            )
        assert Storage(world).load().tick == 0


def test_the_workers_of_a_local_model_get_their_plans_before_the_logs_head_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log's head (the state as the tick began: 1.3 s at 100,000 characters) is
    written while the workers running a free local model's calls start their part; when
    the workers' calls come to the coordinator to be answered (a budget, say), it is
    written first, as with one process. Either way, the log is whole and resumable."""
    from sim.engine.recorder import TickRecorder
    from sim.engine.shards import Shards

    order: list[str] = []
    begin, open_log = Shards.begin, TickRecorder.open

    def planned(self: Shards, *args: Any) -> None:
        order.append("plans")
        begin(self, *args)

    def opened(self: TickRecorder) -> Any:
        if self._writer is None:
            order.append("head")
        return open_log(self)

    monkeypatch.setattr(Shards, "begin", planned)
    monkeypatch.setattr(TickRecorder, "open", opened)
    base = copy_demo(tmp_path / "base")
    one = tmp_path / "one"
    shutil.copytree(base, one)
    Runner(one, config_for(one)).run(1)
    calls = sorted(read_log(log_path(one, 1)).calls)
    budget = {"budget": {"max_total_tokens": 10**9}}  # not a local model's free calls
    cases = [({}, ["plans", "head"]), (budget, ["head", "plans"])]
    for n, (settings, expected) in enumerate(cases):
        world = tmp_path / f"w{n}"
        shutil.copytree(base, world)
        order.clear()
        Runner(world, config_for(world, **settings), workers=2).run(1)
        assert order == expected
        log = read_log(log_path(world, 1))
        assert log.committed and log.state_before is not None
        assert sorted(log.calls) == calls


class InFlight:
    """The offline model, slow, noting the most calls it ever had in flight."""

    name = "offline"

    def __init__(self) -> None:
        self.inner = OfflineAdapter(seed=7)
        self.now = 0
        self.most = 0

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(0.02)
            return await self.inner.execute(request)
        finally:
            self.now -= 1

    async def delete_response(self, response_id: str) -> None:
        return None


def test_the_concurrency_is_the_runs_not_each_workers(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "demo")
    adapter = InFlight()
    Runner(world, config_for(world, llm={"max_concurrency": 3}), adapter=adapter, workers=3).run(1)
    assert adapter.most == 3  # reached, never passed: 3 workers do not get 3 each


def test_a_streamed_run_with_workers_shows_every_places_text_as_it_comes(
    tmp_path: Path,
) -> None:
    """``sim tick --stream --workers 2`` against a streaming server: the workers' calls
    are answered by ``sim tick``, which streams their text as it streams its own, so
    every place's narrative is shown live, the same narratives one process writes."""
    from sim.testing.stub_server import ServerThread, StubOptions, StubServer

    shown: dict[int, str] = {}
    with ServerThread(StubServer(StubOptions(stream_chunk_delay=0.001))) as server:
        for workers in (1, 2):
            world = copy_demo(tmp_path / f"w{workers}")
            (world / "config.toml").write_text(
                f'[llm]\nprovider = "chat"\nbase_url = "{server.base_url}"\n'
            )
            args = ["tick", "--world", str(world), "--stream", "--trust-world-config"]
            result = CliRunner().invoke(main, [*args, "--workers", str(workers)])
            assert result.exit_code == 0, result.output
            assert "one process" not in result.output
            shown[workers] = result.output.partition("== tick 1 ==")[0]
        streamed = sum(1 for body in server.log if body.get("stream") is True)
        assert streamed == len(server.log) > 0
    narratives = read_log(log_path(tmp_path / "w2", 1)).phase_results("narrative")
    assert narratives == read_log(log_path(tmp_path / "w1", 1)).phase_results("narrative")
    names = Storage(tmp_path / "w2").load().locations
    assert len(narratives) > 1
    for lid, text in narratives.items():  # each place's, the worker's too, shown live
        assert f"[{names[lid]['identity']['name']}]\n{text}\n" in shown[2]


def test_interventions_and_auto_workers_give_one_process_result(tmp_path: Path) -> None:
    """``sim inject`` happenings reach the shard whose place they are at, and everywhere;
    ``--workers auto`` runs as many workers as there are cores, with the same result."""
    worlds = []
    for workers in ("1", "auto"):
        world = copy_demo(tmp_path / f"w{workers}")
        invoke("inject", "--world", str(world), "--at", "quay", "A ship burns in the harbour.")
        invoke("inject", "--world", str(world), "--everywhere", "Thunder rolls over the town.")
        invoke("set", "--world", str(world), 'ada.state.mood="furious"')
        invoke("tick", "--world", str(world), "--ticks", "2", "--workers", workers)
        worlds.append(world)
    assert tree(worlds[1]) == tree(worlds[0])
    assert story(worlds[1], 2) == story(worlds[0], 2)
    inputs = [c.input for c in read_log(log_path(worlds[1], 1)).calls.values()]
    assert any("A ship burns" in text for text in inputs)
    assert sum("Thunder rolls" in text for text in inputs) > sum(
        "A ship burns" in text for text in inputs
    )


def test_bad_input_a_worker_finds_is_the_same_user_error_and_writes_nothing(
    tmp_path: Path,
) -> None:
    """A template that fails to render in a worker: exit 2 and the message of one process,
    no log left behind."""
    outputs = []
    for workers in ("1", "2"):
        world = copy_demo(tmp_path / f"w{workers}")
        (world / "prompts").mkdir()
        (world / "prompts" / "intentions.md").write_text(
            "You are {{ character.name }}. {{ character.identity.nope.deeper }}\n"
        )
        before = tree(world, logs=True)
        result = CliRunner().invoke(main, ["tick", "--world", str(world), "--workers", workers])
        assert result.exit_code == 2, result.output
        assert tree(world, logs=True) == before
        outputs.append(result.output.replace(str(world), "WORLD"))
    assert outputs[1] == outputs[0]
    assert "intentions.md:1: undefined name" in outputs[0]


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_of_a_sharded_tick_ends_its_workers_and_resumes(
    tmp_path: Path, signal_number: int
) -> None:
    import subprocess
    import sys
    import time

    from sim.testing import read_in_flight

    base, reference = ticked_and_reference(copy_demo(tmp_path / "base"), 5)
    world = tmp_path / "w"
    shutil.copytree(base, world)
    counts = tmp_path / "calls"
    child = subprocess.Popen(  # slow calls: some are in flight when the signal comes
        [
            sys.executable,
            str(Path(__file__).with_name("crash_child.py")),
            str(world),
            str(counts),
            "0.2",
            "0.0",
            "--workers",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if counts.exists() and len(read_counts(counts)) >= 4 and read_in_flight(counts):
            break
        time.sleep(0.005)
    child.send_signal(signal_number)
    _, err = child.communicate(timeout=30)
    assert child.returncode == (130 if signal_number == signal.SIGINT else 143), err
    assert "nothing was committed for tick 6" in err.decode()
    assert not shard_workers_of(world)
    assert Storage(world).load().tick == 5
    paid = set(read_counts(counts))
    logged = read_log(log_path(world, 6))
    assert len(logged.calls) == len(paid)  # every answered call is in the log
    again = CountingAdapter(OfflineAdapter(seed=7))
    Runner(world, config_for(world), adapter=again, workers=2).run(1)
    assert not set(again.answered) & paid  # never paid twice
    assert tree(world) == tree(reference)


def test_ray_address_without_the_ray_executor_is_refused(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "demo")
    result = CliRunner().invoke(
        main, ["tick", "--world", str(world), "--workers", "2", "--ray-address", "127.0.0.1:1"]
    )
    assert result.exit_code == 2 and "--ray-address is for --executor ray" in result.output
    assert Storage(world).load().tick == 0


@pytest.mark.parametrize(
    ("slots", "concurrency", "most"),
    [(2, None, 2), (0, "3", 3)],
    ids=["a 2-slot server", "--concurrency 3"],
)
def test_a_servers_slots_and_the_concurrency_hold_across_workers(
    tmp_path: Path, slots: int, concurrency: str | None, most: int
) -> None:
    """Three workers against a real HTTP server on 127.0.0.1 (the SDK's client, in the
    coordinator): the server never holds more requests at once than its reported slots,
    or than ``--concurrency``; each worker's clients alone would allow 16 (or 3) each."""
    from sim.testing.stub_server import ServerThread, StubOptions, StubServer

    world = copy_demo(tmp_path / "demo")
    options = StubOptions(slots=slots, latency=0.05, capacity_report="props" if slots else "")
    with ServerThread(StubServer(options)) as server:
        result = CliRunner().invoke(
            main,
            [
                *("tick", "--world", str(world), "--provider", "chat", "--workers", "3"),
                *("--base-url", server.base_url, "--model", "gemma"),
                *(("--concurrency", concurrency) if concurrency else ()),
            ],
            catch_exceptions=False,
        )
        assert result.exit_code == 0, result.output
        assert server.peak_active == most  # reached, never passed
    assert Storage(world).load().tick == 1


class OnlyItsOwn:
    """The coordinator's adapter (the offline model), noting whose calls it answers: with
    local models, those of the coordinator's own shard only; the workers run the rest on
    stacks of their own."""

    name = "offline"

    def __init__(self) -> None:
        self.inner = OfflineAdapter(seed=7)
        self.entities: set[str] = set()

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        assert request.call is not None
        self.entities.add(str(request.call.entity_key))
        return await self.inner.execute(request)

    async def delete_response(self, response_id: str) -> None:
        return None


def test_a_local_models_calls_run_on_the_workers_with_one_process_result(
    tmp_path: Path,
) -> None:
    """With a stack of local, free models only (``Stack.local``: the offline provider) and
    no budget, policy or resume, the coordinator answers only its own shard's calls (the
    first of the places, as ``partition`` splits them) and each worker runs its part's
    itself; the files are one process's."""
    from sim.engine.split import LOCAL_FIRST_SHARE
    from sim.engine.stack import Stack

    reference = copy_demo(tmp_path / "ref")
    where = Storage(reference).load().characters_at()
    everyone = {cid for present in where.values() for cid in present}
    ours = {cid for lid in partition(where, 2, LOCAL_FIRST_SHARE)[0] for cid in where[lid]}
    Runner(reference, config_for(reference)).run(1)
    world = copy_demo(tmp_path / "w")
    coordinator = OnlyItsOwn()
    Runner(world, config_for(world), stack=Stack(coordinator, local=True), workers=2).run(1)
    assert tree(world) == tree(reference)
    answered = {key.split(":", 1)[-1] for key in coordinator.entities}
    assert answered & everyone and answered & everyone <= ours < everyone
    assert len(read_log(log_path(world, 1)).calls) == len(read_log(log_path(reference, 1)).calls)


def _calls_logged(world: Path) -> int:
    path = log_path(world, 1)
    return path.read_bytes().count(b'{"type":"call"') if path.exists() else 0


@pytest.mark.parametrize("victim", ["coordinator", "worker"])
def test_kill_9_while_workers_run_their_own_calls_resumes_from_the_log(
    tmp_path: Path, victim: str
) -> None:
    """kill -9 of ``sim tick --workers 2`` or of one of its workers while the workers run
    the offline model themselves: the world stays at tick 0 (a worker's death is named),
    every call logged before is answered from the log on the next run (none asked
    again), and the result is one process's."""
    import subprocess
    import sys
    import time

    from bench.make_world import make_world

    base = tmp_path / "base"
    make_world(base, 1500, 150)
    reference = tmp_path / "ref"
    shutil.copytree(base, reference)
    Runner(reference, config_for(reference)).run(1)
    world = tmp_path / "w"
    shutil.copytree(base, world)
    process = subprocess.Popen(
        [sys.executable, "-m", "sim", "tick", "--world", str(world), "--workers", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if _calls_logged(world) >= 200:
            break
        time.sleep(0.002)
    assert process.poll() is None, "the tick ended before the kill: make the world bigger"
    if victim == "coordinator":
        process.kill()
    else:
        os.kill(shard_workers_of(world)[0], signal.SIGKILL)
    _, err = process.communicate(timeout=60)
    if victim == "worker":
        assert process.returncode != 0 and b"died in the middle of the tick" in err, err
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and shard_workers_of(world):
        time.sleep(0.05)
    assert not shard_workers_of(world)
    assert Storage(world).load().tick == 0
    logged = len(read_log(log_path(world, 1)).calls)
    assert logged >= 200
    result = Runner(world, config_for(world), workers=2).run(1)[0]
    assert result.resumed_calls == logged  # each answered from the log, not asked again
    assert tree(world) == tree(reference)


def test_a_workers_part_bigger_than_a_message_comes_in_pieces_as_one_processs_world(
    tmp_path: Path,
) -> None:
    """A worker's part of more than ``FINAL_PIECE`` bytes of files goes to the coordinator
    in several messages (``ShardFinal.pieces``); put together, the world, its chains and
    its log are one process's."""
    from bench.make_world import make_world
    from sim.engine.split import FINAL_PIECE, LOCAL_FIRST_SHARE

    base = tmp_path / "base"
    make_world(base, 3000, 300)
    reference = tmp_path / "ref"
    shutil.copytree(base, reference)
    Runner(reference, config_for(reference)).run(1)
    where = Storage(base).load().characters_at()
    theirs = partition(where, 2, LOCAL_FIRST_SHARE)[1]
    sent = sum(
        (reference / "characters" / f"{cid}.json").stat().st_size
        for lid in theirs
        for cid in where[lid]
    )
    assert sent > 1.5 * FINAL_PIECE, "the worker's part fits one message: make the world bigger"
    world = tmp_path / "w"
    shutil.copytree(base, world)
    Runner(world, config_for(world), workers=2).run(1)
    assert tree(world) == tree(reference)
    assert len(read_log(log_path(world, 1)).calls) == len(read_log(log_path(reference, 1)).calls)


def test_only_a_local_free_stack_without_budget_policy_or_resume_runs_on_the_workers(
    tmp_path: Path,
) -> None:
    """``Stack.local``: the config's offline stack is; a network provider's, or a stack
    sharing a budget, is not. ``local_calls``: a budget, a policy gate or a resume keep
    the calls on the coordinator."""
    from sim.engine.split import local_calls
    from sim.engine.stack import build_stack, make_budget

    world = copy_demo(tmp_path / "demo")
    offline = config_for(world)
    assert build_stack(offline, 7).local
    assert not build_stack(offline, 7, budget=make_budget(offline)).local
    chat = config_for(world, llm={"provider": "chat", "base_url": "http://127.0.0.1:9/v1"})
    assert not build_stack(chat, 7).local
    assert local_calls(local_stack=True, budget=False, gated=False, resume=False)
    for flag in ("budget", "gated", "resume"):
        flags = {"budget": False, "gated": False, "resume": False, flag: True}
        assert not local_calls(local_stack=True, **flags)
    assert not local_calls(local_stack=False, budget=False, gated=False, resume=False)


async def _serve_unanswered(
    world: Path,
    acks_after: int | None,
    timeout: float = 60,
    phases: int = 1,
    order: list[str] | None = None,
) -> list[tuple[str, int]]:
    """Run ``shard_worker.serve`` on one end of a socket pair, as a worker of a local
    model's tick (``ShardPlan.local``) whose part is the whole world, and play its
    coordinator on the other end, saying calls are logged only once ``acks_after`` of them
    came (``None``: never), and never sending a barrier. Returns the messages up to the
    end of the ``phases``-th phase: ``("logged", calls in it)`` and ``("phase", i)``, with
    ``i`` counting the phases from 0. ``order``: the tick's phases (else the world's)."""
    import socket

    from sim.engine import shard_worker
    from sim.engine.recorder import CallNames
    from sim.engine.split import ShardPlan
    from sim.engine.wire import frame, receive
    from sim.phases.happenings import Happenings

    ours, theirs = socket.socketpair()
    serving = asyncio.create_task(shard_worker.serve(theirs, world))
    reader, writer = await asyncio.open_connection(sock=ours, limit=2**26)
    places = tuple(Storage(world).load().characters_at())
    names = CallNames(1, "test", {})
    config = config_for(world, **({"tick": {"phases": order}} if order else {}))
    plan = ShardPlan(1, world, config, 1, places, names, "offline", Happenings(), local=True)
    writer.write(frame(("open", None)) + frame(("plan", plan)))
    seen: list[tuple[str, int]] = []
    unacked: list[int] = []
    try:
        while True:
            message = await asyncio.wait_for(receive(reader), timeout)
            if message[0] == "phase":
                ended = sum(1 for kind, _ in seen if kind == "phase")
                seen.append(("phase", ended))
                if ended + 1 == phases:
                    return seen
                continue
            assert message[0] == "logged", message[0]
            seen.append(("logged", len(message[1])))
            unacked.extend(n for n, _ in message[1])
            if acks_after is not None and len(unacked) >= acks_after:
                writer.write(frame(("logged", unacked)))
                unacked = []
    finally:
        # the worker's tasks are stopped before its socket closes: a worker whose
        # coordinator goes mid-tick ends its process
        others = {serving, *asyncio.all_tasks()} - {asyncio.current_task()}  # its reader too
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        writer.close()
        theirs.close()


def test_a_worker_uses_its_own_calls_before_they_are_logged_and_ends_its_phase_after_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker running a local model's calls does not wait for each to be logged (the
    coordinator, busy with its own shard, would leave it idle): with no call ever said to
    be logged it runs its first phase to the end, every call's record on the socket before
    the phase's end. Only ``LOCAL_UNLOGGED`` calls ahead of the log does it wait."""
    from sim.engine import shard_worker

    world = copy_demo(tmp_path / "demo")
    seen = asyncio.run(_serve_unanswered(world, None))
    assert seen[-1] == ("phase", 0)
    calls = sum(n for kind, n in seen if kind == "logged")
    assert calls == len(Storage(world).load().characters)  # one intention each
    monkeypatch.setattr(shard_worker, "LOCAL_UNLOGGED", 2)
    with pytest.raises(TimeoutError):  # 3 calls ahead of the log, never told: it waits
        asyncio.run(_serve_unanswered(world, None, timeout=2))
    assert asyncio.run(_serve_unanswered(world, 3))[-1] == ("phase", 0)


def test_a_worker_of_a_local_model_waits_only_where_a_later_phase_reads_the_others_states(
    tmp_path: Path,
) -> None:
    """A worker running a local model's calls goes from one phase to the next without a
    barrier, but for a phase that changes states (``apply``) followed by one that reads
    the others' (``reflection``: who is where): told nothing by its coordinator, it runs
    the demo's five phases to the end, and with reflection after apply it ends intentions,
    resolution, narrative and apply, then waits for the others' states."""
    from sim.engine.split import PhaseRoles, waits_after

    world = copy_demo(tmp_path / "demo")
    seen = asyncio.run(_serve_unanswered(world, None, phases=5))
    assert [n for kind, n in seen if kind == "phase"] == [0, 1, 2, 3, 4]
    reflecting = ["intentions", "resolution", "narrative", "apply", "reflection", "memory"]
    seen = asyncio.run(_serve_unanswered(world, None, phases=4, order=reflecting))
    assert [n for kind, n in seen if kind == "phase"] == [0, 1, 2, 3]
    with pytest.raises(TimeoutError):  # reflection's first step waits for apply's barrier
        asyncio.run(_serve_unanswered(world, None, timeout=3, phases=5, order=reflecting))
    assert not waits_after("apply", local=True, later=["memory"])
    assert waits_after("apply", local=True, later=["reflection", "memory"])
    assert not any(waits_after(p, local=True, later=["memory"]) for p in ("intentions", "memory"))
    assert all(waits_after(p, local=False) for p in ("intentions", "narrative", "memory"))
    # the tick's conversations are chosen over the world, after every shard's intentions
    assert waits_after("intentions", local=True, later=["conversation", "resolution"])
    assert not waits_after("conversation", local=True, later=["resolution", "memory"])
    # before a declared phase reading whoever is present, once some may have moved in
    # from another shard's place (their whole entities then come, ``split.mixed``)
    roles = PhaseRoles(writers=frozenset({"apply", "vote"}), readers=frozenset({"vote"}))
    assert waits_after("apply", local=True, later=["vote", "memory"], roles=roles, moved=True)
    assert waits_after("reflection", local=True, later=["vote"], roles=roles, moved=True)
    before = ["vote", "resolution"]
    assert not waits_after("intentions", local=True, later=before, roles=roles, moved=False)
    assert not waits_after("vote", local=True, later=["memory"], roles=roles, moved=True)


def test_a_sharded_ticks_log_holds_each_phases_calls_before_its_end(tmp_path: Path) -> None:
    """With the workers running their own calls (the offline model), the log is written in
    an order a resume can read: every call of a phase after the record of the phase before
    and before its own, as with one process, though the workers run ahead of the
    coordinator until ``apply`` (the log kept plain, as written)."""
    import orjson

    from bench.make_world import make_world

    world = tmp_path / "w"
    make_world(world, 600, 60)
    config = config_for(world, history={"compress_level": 0})
    Runner(world, config, workers=2).run(1)
    ended: list[str] = []
    calls = 0
    for line in log_path(world, 1).read_bytes().splitlines():
        record = orjson.loads(line)
        if record["type"] == "phase":
            ended.append(record["name"])
        elif record["type"] == "call":
            calls += 1
            assert record["phase"] not in ended, (record["phase"], ended)
            order = ["intentions", "resolution", "narrative", "apply", "memory"]
            assert ended == order[: order.index(record["phase"])], (record["phase"], ended)
    assert calls == len(read_log(log_path(world, 1)).calls) > 600
    assert ended == ["intentions", "resolution", "narrative", "apply", "memory"]
