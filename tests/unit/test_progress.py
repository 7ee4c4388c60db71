"""``sim tick``'s progress on stderr: tick k of N, every call as it completes, an ETA and the
run's total; a live bar on a terminal, plain lines naming the tick elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.cli.progress import Progress
from sim.engine.runner import TickResult
from sim.llm.events import LLMEvent
from sim.llm.types import Usage
from sim.phases.base import PhaseReport


class _Runner:
    """What Progress reads of a runner: the tick running and the phase list."""

    def __init__(self) -> None:
        self.current_tick: int | None = 7
        self.phases: list[Any] | None = [object(), object()]


def _event(kind: str = "llm_completed", final: bool = True) -> LLMEvent:
    return LLMEvent(kind, "intentions", "intention:ada", "m", request=None, final=final)  # type: ignore[arg-type]


def _result(tick: int) -> TickResult:
    report = PhaseReport("intentions", calls=3, usage=Usage(100, 20))
    return TickResult(tick, {}, {}, [report], elapsed=2.0)


def test_on_a_terminal_every_call_redraws_the_bar_with_tick_k_of_n_and_an_eta(
    capsys: pytest.CaptureFixture[str],
):
    now = [0.0]
    progress = Progress(ticks=4, tty=True, clock=lambda: now[0])
    runner = _Runner()
    progress.attach(runner)  # type: ignore[arg-type]
    progress.on_phase("intentions", "start", None)
    for _ in range(3):
        progress.on_event(_event())
    progress.on_event(_event("llm_called"))  # a call sent is not a call done
    progress.on_event(_event("llm_failed", final=False))  # an attempt retried: not yet
    err = capsys.readouterr().err
    redraws = [line for line in err.split("\r") if line]
    assert len(redraws) == 4  # the phase's start, then each of the three calls
    assert "tick 7 (1 of 4) intentions: 3 calls" in redraws[-1]
    assert redraws[-1].startswith("[---") and "ETA" not in redraws[-1]  # no tick done yet
    progress.on_phase("intentions", "end", PhaseReport("intentions", calls=3))
    now[0] = 10.0
    progress.on_tick(_result(7))
    err = capsys.readouterr().err
    assert "\r  tick 7 (1 of 4) intentions  3/3 calls, 0 failed\n" in err  # a line that stays
    assert "tick 7 committed (1 of 4): 3 calls, 0 failed, 120 tokens, 2.00s; ETA 30s" in err
    runner.current_tick = 8
    progress.on_phase("intentions", "start", None)
    progress.on_event(_event("llm_failed"))
    live = capsys.readouterr().err.split("\r")[-1]
    assert live.startswith("[#####-----") and "tick 8 (2 of 4)" in live
    assert "1 call, 1 failed · ETA 30s" in live
    now[0] = 14.0  # four seconds into the second tick: four fewer left
    progress.on_event(_event())
    assert "2 calls, 1 failed · ETA 26s" in capsys.readouterr().err
    assert progress.eta() == "26s"


def test_the_total_after_a_run_of_several_ticks(capsys: pytest.CaptureFixture[str]):
    now = [0.0]
    progress = Progress(ticks=2, tty=False, clock=lambda: now[0])
    progress.on_tick(_result(4))
    now[0] = 75.0
    progress.on_tick(_result(5))
    progress.total()
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    assert (
        err.splitlines()[-1]
        == "ran 2 of 2 ticks (ticks 4–5) in 1m15s: 6 calls, 0 failed, 240 tokens"
    )
    single = Progress(ticks=1, tty=False)
    single.on_tick(_result(1))
    single.total()
    assert "ran " not in capsys.readouterr().err  # one tick: its own line says it all


def test_sim_tick_without_a_terminal_prints_plain_lines_naming_the_tick(demo_world: Path):
    done = CliRunner().invoke(main, ["tick", "--world", str(demo_world), "--ticks", "3"])
    assert done.exit_code == 0, done.output
    err = done.stderr
    assert "\r" not in err and "\x1b" not in err
    lines = err.splitlines()
    assert "  tick 2 (2 of 3) narrative   7/7 calls, 0 failed" in lines
    assert any(
        line.startswith("tick 1 committed (1 of 3): 22 calls") and "ETA" in line for line in lines
    )
    assert lines[-1].startswith("ran 3 of 3 ticks (ticks 1–3) in ")
    assert "== tick 3 ==" in done.stdout and "tick 3 committed" not in done.stdout


def test_stream_says_when_the_provider_streamed_nothing(demo_world: Path):
    done = CliRunner().invoke(
        main, ["tick", "--world", str(demo_world), "--ticks", "2", "--stream"]
    )
    assert done.exit_code == 0, done.output
    note = "note: --stream: the offline provider streamed nothing"
    assert done.stderr.count(note) == 1  # once per run
    assert "[Herring Quay]" in done.stdout  # the narratives, after each tick, by name


@pytest.mark.parametrize("tty", [True, False])
def test_a_batch_status_from_the_server_stays_on_its_line(
    tty: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A batch's id and status are what the server answered: their line breaks are shown
    (``\\x0a``), on a terminal's status line and in plain lines alike."""
    from sim.llm.batching import BatchProgress

    progress = Progress(ticks=1, tty=tty)
    progress.attach(_Runner())  # type: ignore[arg-type]
    forged = "tick 7 committed: 0 calls"
    progress.on_batch(
        BatchProgress("intentions", f"b1\n{forged}", f"done\r\n{forged}", 2, 2, 0, False, 1.0)
    )
    err = capsys.readouterr().err
    assert f"batch b1\\x0a{forged}: done\\x0d\\x0a{forged}, 2/2 done" in err
    assert forged not in [line.strip("\r\x1b[K") for line in err.split("\n")]
    assert err.count("\n") == (0 if tty else 1)
