"""Policy gates and the failure policy through the real CLI: every outcome (allow, deny,
defer, ask approved, ask refused, no terminal without --yes), the log, resume and replay.

Custom policies are installed the way a package installs them: a distribution on
``sys.path`` declaring entry points in the ``sim.policies`` group.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO, copy_demo, interruptible_children, tree

from sim.cli import main
from sim.testing.stub_server import StubServer
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

PLUGIN = '''
import os
from datetime import datetime, timezone

from sim.policy import PolicyCall, PolicyDecision


class NightShift:
    """Defers narrative calls while SIMTEST_DEFER is set."""

    name = "night_shift"

    def decide(self, call: PolicyCall) -> PolicyDecision:
        if call.phase == "narrative" and os.environ.get("SIMTEST_DEFER"):
            return PolicyDecision.defer(
                "narratives wait for the night rate",
                until=datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
            )
        return PolicyDecision.allow()


class NoBram:
    name = "no_bram"

    def decide(self, call: PolicyCall) -> PolicyDecision:
        if call.entity_id == "bram":
            return PolicyDecision.deny("Bram is off the books")
        return PolicyDecision.allow()


class AskOnce:
    name = "ask_once"

    def decide(self, call: PolicyCall) -> PolicyDecision:
        return PolicyDecision.ask("Spend on this tick?", key="spend")


class Broken:
    name = "broken"

    def decide(self, call: PolicyCall) -> PolicyDecision:
        raise RuntimeError("no decision today")
'''

MODULE = "simtest_policies"


def install_policies(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiny installed distribution offering policies in the ``sim.policies`` group."""
    folder.mkdir(exist_ok=True)
    (folder / f"{MODULE}.py").write_text(PLUGIN)
    info = folder / f"{MODULE}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {MODULE}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[sim.policies]\n"
        f"night_shift = {MODULE}:NightShift\n"
        f"no_bram = {MODULE}:NoBram\n"
        f"ask_once = {MODULE}:AskOnce\n"
        f"broken = {MODULE}:Broken\n"
    )
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    return folder


#: the offline provider's calls priced (it is free by default) so that a tick's estimate
#: has something to ask about
PRICED = '[prices."offline"]\ninput = 0.4\ncached_input = 0.1\noutput = 1.6\n'


def user_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "user-config.toml"
    path.write_text(text)
    return path


def tick(world: Path, config: Path | None = None, *args: str, env: dict[str, str] | None = None):
    flags = ["--config", str(config)] if config is not None else []
    return CliRunner().invoke(main, ["tick", "--world", str(world), *flags, *args], env=env)


def sim_log(world: Path, *args: str) -> str:
    result = CliRunner().invoke(main, ["log", "--world", str(world), *args])
    assert result.exit_code == 0, result.output
    return result.output


# -- allow and deny ---------------------------------------------------------------------------


def test_allow_lets_every_call_through_and_records_nothing(
    demo_world: Path, tmp_path: Path
) -> None:
    config = user_config(
        tmp_path,
        '[policy]\nallowed_models = ["gpt-4.1-mini"]\nmax_calls_per_entity_per_tick = 5\n'
        "approve_above_usd = 100.0\n",
    )
    result = tick(demo_world, config)
    assert result.exit_code == 0, result.output
    log = read_log(log_path(demo_world, 1))
    assert log.committed and log.decisions == []
    assert not any(call.failed for call in log.calls.values())
    assert "policy:" not in sim_log(demo_world)


def test_deny_falls_back_for_the_entity_and_is_shown_by_sim_log(
    demo_world: Path, tmp_path: Path
) -> None:
    config = user_config(tmp_path, '[policy]\nallowed_models = ["gpt-4.1-nano"]\n')
    result = tick(demo_world, config)
    assert result.exit_code == 0, result.output  # degrade: the tick commits on fallbacks
    assert "policy_denied: denied by allowed_models" in result.output
    log = read_log(log_path(demo_world, 1))
    assert log.committed
    denied = [d for d in log.decisions if d.decision == "deny"]
    assert len(denied) == len(log.calls) > 0
    assert {d.policy for d in denied} == {"allowed_models"}
    assert all(call.error_code == "policy_denied" for call in log.calls.values())
    assert all(call.usage.input_tokens == 0 for call in log.calls.values())  # nothing sent
    shown = sim_log(demo_world)
    assert (
        "policy: denied intentions intention:ada (1:intentions:intention:ada:0) by "
        "allowed_models: model 'offline/gpt-4.1-mini' not in [policy] allowed_models" in shown
    )


def test_deny_with_fail_leaves_the_tick_uncommitted(demo_world: Path, tmp_path: Path) -> None:
    before = tree(demo_world)
    config = user_config(
        tmp_path,
        '[llm]\nllm_failure_policy = "fail"\n[policy]\nallowed_models = ["gpt-4.1-nano"]\n',
    )
    result = tick(demo_world, config)
    assert result.exit_code == 1
    assert 'llm_failure_policy = "fail"' in result.output
    assert "policy_denied" in result.output and "not committed" in result.output
    assert tree(demo_world) == before  # nothing written to the world
    log = read_log(log_path(demo_world, 1))
    assert not log.committed
    codes = sorted({call.error_code for call in log.calls.values()})
    assert codes == ["policy_denied", "tick_halted"]  # after the first, nothing was sent
    assert len(log.decisions) == 1


def test_per_phase_failure_policy_and_the_per_entity_call_limit(
    demo_world: Path, tmp_path: Path
) -> None:
    """A location has a resolution and a narrative call: with a limit of one call per
    entity the narratives are denied; degrade commits, a ``fail`` narrative phase does not."""
    limit = "[policy]\nmax_calls_per_entity_per_tick = 1\n"
    before = tree(demo_world)
    failing = user_config(tmp_path, limit + '[phase2b]\nllm_failure_policy = "fail"\n')
    result = tick(demo_world, failing)
    assert result.exit_code == 1, result.output
    assert "phase narrative: the call for narrative:" in result.output
    assert tree(demo_world) == before

    degrading = user_config(tmp_path, limit)
    result = tick(demo_world, degrading)
    assert result.exit_code == 0, result.output
    log = read_log(log_path(demo_world, 1))
    assert log.committed
    final = log.run_decisions()
    assert final and {d.phase for d in final} == {"narrative"}
    assert all("max_calls_per_entity_per_tick = 1" in d.reason for d in final)
    assert all(not c.failed for c in log.calls.values() if c.phase != "narrative")


def test_a_custom_policy_from_an_entry_point_denies(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_policies(tmp_path / "site", monkeypatch)
    config = user_config(tmp_path, '[policy]\ncustom = ["no_bram"]\n')
    result = tick(demo_world, config)
    assert result.exit_code == 0, result.output
    log = read_log(log_path(demo_world, 1))
    assert [(d.policy, d.entity_key) for d in log.decisions] == [("no_bram", "intention:bram")]
    assert "Bram is off the books" in sim_log(demo_world)


def test_a_missing_or_broken_custom_policy_is_named(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = tree(demo_world)
    result = tick(demo_world, user_config(tmp_path, '[policy]\ncustom = ["nope"]\n'))
    assert result.exit_code == 2
    assert "no policy 'nope' in entry-point group 'sim.policies'" in result.output
    install_policies(tmp_path / "site", monkeypatch)
    result = tick(demo_world, user_config(tmp_path, '[policy]\ncustom = ["broken"]\n'))
    assert result.exit_code == 2  # a gate that cannot decide fails closed
    assert "policy 'broken' failed deciding" in result.output
    assert "Traceback" not in result.output
    assert tree(demo_world) == before


def test_a_world_config_may_not_change_the_policy(demo_world: Path, tmp_path: Path) -> None:
    config = user_config(tmp_path, '[policy]\nallowed_models = ["gpt-4.1-nano"]\n')
    (demo_world / "config.toml").write_text("[policy]\nallowed_models = []\n")
    result = tick(demo_world, config)
    assert result.exit_code == 2
    assert "field 'policy.allowed_models'" in result.output
    assert tick(demo_world, config, "--trust-world-config").exit_code == 0


# -- defer ------------------------------------------------------------------------------------


def test_defer_stops_the_tick_and_the_next_run_resumes_it_without_paying_twice(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = copy_demo(tmp_path / "reference")
    assert tick(reference).exit_code == 0
    install_policies(tmp_path / "site", monkeypatch)
    config = user_config(tmp_path, '[policy]\ncustom = ["night_shift"]\n')
    before = tree(demo_world)

    result = tick(demo_world, config, env={"SIMTEST_DEFER": "1"})
    assert result.exit_code == 75, result.output
    assert "deferred: deferred by night_shift until 2030-01-02T03:04:05Z" in result.output
    assert "run `sim tick` again after 2030-01-02T03:04:05Z to resume" in result.output
    assert tree(demo_world) == before
    first = read_log(log_path(demo_world, 1))
    assert not first.committed
    [decision] = first.decisions
    assert decision.decision == "defer" and decision.until == "2030-01-02T03:04:05Z"
    paid = {rid for rid, c in first.calls.items() if not c.failed}
    assert paid and {first.calls[rid].phase for rid in paid} == {"intentions", "resolution"}
    assert "deferred narrative" in sim_log(demo_world)

    result = tick(demo_world, config, env={"SIMTEST_DEFER": ""})
    assert result.exit_code == 0, result.output
    assert f"resumed: {len(paid)} calls taken from the interrupted tick's log" in result.output
    log = read_log(log_path(demo_world, 1))
    assert log.committed and log.resumes == 1
    for rid in paid:  # a finished call was not sent again: one record, the first run's
        assert [c.request_id for c in log.call_records].count(rid) == 1
    # the same world as a tick that was never deferred
    assert tree(demo_world) == tree(reference)


# -- ask --------------------------------------------------------------------------------------


def test_ask_without_a_terminal_is_refused_unless_yes(demo_world: Path, tmp_path: Path) -> None:
    config = user_config(tmp_path, PRICED + "[policy]\napprove_above_usd = 0.0001\n")
    before = tree(demo_world)
    result = tick(demo_world, config)  # CliRunner's stdin is not a terminal
    assert result.exit_code == 1
    assert "approve_above_usd asked and was refused (no terminal)" in result.output
    assert "pass --yes" in result.output
    assert tree(demo_world) == before
    log = read_log(log_path(demo_world, 1))
    [refused] = log.decisions
    assert (refused.decision, refused.answer, refused.by) == ("ask", "refused", "no terminal")
    assert not any(not c.failed for c in log.calls.values())  # nothing was sent

    result = tick(demo_world, config, "--yes")
    assert result.exit_code == 0, result.output
    assert "approved (--yes): Tick 1 may cost up to $" in result.output
    log = read_log(log_path(demo_world, 1))
    assert log.committed
    asked = [d for d in log.run_decisions() if d.decision == "ask"]
    assert [(d.answer, d.by) for d in asked] == [("approved", "--yes")]  # asked once


def test_approval_is_asked_once_per_tick_and_kept_by_a_resume(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An approved tick that a defer then stopped is not asked about again on resume."""
    install_policies(tmp_path / "site", monkeypatch)
    config = user_config(tmp_path, '[policy]\ncustom = ["ask_once", "night_shift"]\n')
    result = tick(demo_world, config, "--yes", env={"SIMTEST_DEFER": "1"})
    assert result.exit_code == 75, result.output
    assert result.output.count("approved (--yes)") == 1
    result = tick(demo_world, config, env={"SIMTEST_DEFER": ""})  # no --yes, no terminal
    assert result.exit_code == 0, result.output
    log = read_log(log_path(demo_world, 1))
    assert [d.decision for d in log.decisions] == ["ask", "defer"]


def _tick_on_a_terminal(world: Path, config: Path, answer: bytes) -> tuple[int, str]:
    """Run ``sim tick`` in a child whose stdin and stderr are a pseudo-terminal (its
    controlling terminal, so Ctrl-C there is a SIGINT), answer its prompt, and return its
    exit code and what it showed there."""
    master, slave = pty.openpty()

    def controlling_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    # faulthandler: a child that does not end is made to show where it is (below)
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "PYTHONFAULTHANDLER": "1"}
    with interruptible_children():  # Ctrl-C at the prompt must reach it
        child = subprocess.Popen(
            [sys.executable, "-m", "sim", "tick", "--world", str(world), "--config", str(config)],
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=slave,
            env=env,
            preexec_fn=controlling_terminal,
        )
    os.close(slave)
    shown = b""
    deadline = time.monotonic() + 60
    answered = False
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the child closed the terminal
                    break
                shown += chunk
            if not answered and b"[y/N]" in shown:
                os.write(master, answer)
                answered = True
            if child.poll() is not None and not ready:
                break
        if child.poll() is None:  # stuck: every thread's stack to the terminal, then end it
            child.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=10)
            with contextlib.suppress(OSError):
                while select.select([master], [], [], 0.5)[0]:
                    shown += os.read(master, 65536)
            raise AssertionError(f"sim tick did not end: {shown.decode(errors='replace')}")
        code = child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
        os.close(master)
        assert child.stdout is not None
        child.stdout.close()
    assert answered, shown.decode(errors="replace")
    return code, shown.decode(errors="replace")


def test_ask_on_a_terminal_approved(demo_world: Path, tmp_path: Path) -> None:
    config = user_config(tmp_path, PRICED + "[policy]\napprove_above_usd = 0.0001\n")
    code, shown = _tick_on_a_terminal(demo_world, config, b"y\n")
    assert code == 0, shown
    assert "above [policy] approve_above_usd = $0.0001. Run it? [y/N]" in shown
    log = read_log(log_path(demo_world, 1))
    assert log.committed
    [asked] = log.decisions
    assert (asked.answer, asked.by) == ("approved", "terminal")
    assert "-> approved (terminal)" in sim_log(demo_world)


def test_ask_on_a_terminal_refused(demo_world: Path, tmp_path: Path) -> None:
    config = user_config(tmp_path, PRICED + "[policy]\napprove_above_usd = 0.0001\n")
    before = tree(demo_world)
    code, shown = _tick_on_a_terminal(demo_world, config, b"n\n")
    assert code == 1, shown
    assert "refused (terminal)" in shown and "answered no at the prompt" in shown
    assert tree(demo_world) == before
    [asked] = read_log(log_path(demo_world, 1)).decisions
    assert (asked.answer, asked.by) == ("refused", "terminal")


def test_ctrl_c_at_the_prompt_interrupts_the_run(demo_world: Path, tmp_path: Path) -> None:
    config = user_config(tmp_path, PRICED + "[policy]\napprove_above_usd = 0.0001\n")
    before = tree(demo_world)
    code, shown = _tick_on_a_terminal(demo_world, config, b"\x03")
    assert code == 130, shown
    assert "interrupted: nothing was committed for tick 1" in shown
    assert "Traceback" not in shown and "never retrieved" not in shown
    assert tree(demo_world) == before


# -- replay -----------------------------------------------------------------------------------


def test_replay_reproduces_decisions_from_the_log(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick with a custom denial and an approval replays identically where the policy
    is not installed and no one can be asked."""
    config = user_config(
        tmp_path, PRICED + '[policy]\ncustom = ["no_bram"]\napprove_above_usd = 0.0001\n'
    )
    with monkeypatch.context() as patch:
        install_policies(tmp_path / "site", patch)
        result = tick(demo_world, config, "--yes")
        assert result.exit_code == 0, result.output
    sys.modules.pop(MODULE, None)
    log = read_log(log_path(demo_world, 1))
    assert {d.decision for d in log.decisions} == {"deny", "ask"}
    result = CliRunner().invoke(main, ["replay", "--world", str(demo_world), "--tick", "1"])
    assert result.exit_code == 0, result.output
    assert "tick 1: identical" in result.output
    assert "ask" not in result.output.lower().split("identical")[0]


def test_check_names_the_policies_and_refuses_one_that_is_not_installed(
    demo_world: Path, tmp_path: Path
) -> None:
    config = user_config(
        tmp_path, '[policy]\nallowed_models = ["gpt-4.1-mini"]\napprove_above_usd = 1.0\n'
    )
    result = CliRunner().invoke(
        main, ["check", "--world", str(demo_world), "--config", str(config)]
    )
    assert result.exit_code == 0, result.output
    assert "policies: allowed_models, approve_above_usd" in result.output
    missing = user_config(tmp_path, '[policy]\ncustom = ["nope"]\n')
    result = CliRunner().invoke(
        main, ["check", "--world", str(demo_world), "--config", str(missing)]
    )
    assert result.exit_code == 2
    assert "policy.custom" in result.output and "'nope'" in result.output


# -- the failure policy over real HTTP --------------------------------------------------------


def test_fail_stops_at_the_first_failed_call_and_the_rerun_pays_only_for_the_rest(
    demo_world: Path, tmp_path: Path, stub_server: StubServer
) -> None:
    """A schema failure (``json_max_retries = 0``) in a ``fail`` resolution phase: nothing
    is committed and nothing more is sent; the next run resumes without re-sending the
    intentions, and commits."""
    config = user_config(
        tmp_path,
        "[llm]\njson_max_retries = 0\nmax_concurrency = 1\n"
        '[phase2a]\nllm_failure_policy = "fail"\n',
    )
    flags = ("--provider", "chat", "--base-url", stub_server.base_url)
    env = {"OPENAI_API_KEY": "sk-test"}
    before = tree(demo_world)
    characters = len(list((demo_world / "characters").glob("*.json")))
    stub_server.enqueue(*[None] * characters, "malformed")  # the first resolution call
    result = tick(demo_world, config, *flags, env=env)
    assert result.exit_code == 1, result.output
    assert "phase resolution: the call for resolution:" in result.output
    assert "schema_error" in result.output and 'llm_failure_policy = "fail"' in result.output
    assert tree(demo_world) == before
    assert stub_server.stats.generations == characters + 1  # nothing sent after the failure
    log = read_log(log_path(demo_world, 1))
    halted = [c for c in log.calls.values() if c.error_code == "tick_halted"]
    assert halted and all(c.phase == "resolution" for c in halted)

    sent = stub_server.stats.generations
    result = tick(demo_world, config, *flags, env=env)
    assert result.exit_code == 0, result.output
    assert f"resumed: {characters} calls taken from the interrupted tick's log" in result.output
    log = read_log(log_path(demo_world, 1))
    assert log.committed
    assert stub_server.stats.generations - sent == len(log.calls) - characters


def test_bad_policy_and_failure_settings_are_named(demo_world: Path, tmp_path: Path) -> None:
    config = user_config(
        tmp_path,
        '[llm]\nllm_failure_policy = "explode"\njson_max_retries = -1\n'
        "[policy]\napprove_above_usd = -2.0\n[phase2b]\nllm_failure_policy = 3\n",
    )
    result = tick(demo_world, config)
    assert result.exit_code == 2
    for field in (
        "llm.llm_failure_policy",
        "llm.json_max_retries",
        "policy.approve_above_usd",
        "phase2b.llm_failure_policy",
    ):
        assert f"field '{field}'" in result.output
    # a world restating the default [policy] is no change, so it needs no trust
    (demo_world / "config.toml").write_text("[policy]\nallowed_models = []\n")
    assert tick(demo_world).exit_code == 0


def test_a_batched_tick_passes_the_gate_and_a_denied_call_never_joins_a_batch(
    demo_world: Path, tmp_path: Path, stub_server: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_policies(tmp_path / "site", monkeypatch)
    config = user_config(
        tmp_path, '[llm]\nbatch_poll_seconds = 0.05\n[policy]\ncustom = ["no_bram"]\n'
    )
    result = tick(
        demo_world,
        config,
        "--batch",
        "--provider",
        "openai",
        "--base-url",
        stub_server.base_url,
        env={"OPENAI_API_KEY": "sk-test"},
    )
    assert result.exit_code == 0, result.output
    log = read_log(log_path(demo_world, 1))
    assert log.committed and log.batches
    bram = log.calls["1:intentions:intention:bram:0"]
    assert bram.error_code == "policy_denied"
    others = [c for c in log.calls.values() if c.phase == "intentions" and c is not bram]
    assert others and all(not c.failed for c in others)
    assert stub_server.stats.generations == sum(1 for c in log.calls.values() if not c.failed)


def test_an_offline_tick_is_estimated_at_its_own_price(demo_world: Path, tmp_path: Path) -> None:
    """The offline provider costs $0 (its own [prices."offline"]), whatever model the
    phases name: its tick is neither asked about nor refused, nor stopped by a cost cap."""
    config = user_config(tmp_path, "[policy]\napprove_above_usd = 0.0001\n")
    result = tick(demo_world, config)  # no terminal: an ask would be refused
    assert result.exit_code == 0, result.output
    assert "approve_above_usd" not in result.output
    stopped = tick(demo_world, None, "--budget-usd", "0.00001")
    assert stopped.exit_code == 0, stopped.output
    # priced by its own table: an offline price makes the estimate ask again
    priced = user_config(tmp_path, PRICED + "[policy]\napprove_above_usd = 0.0001\n")
    asked = tick(demo_world, priced)
    assert asked.exit_code == 1
    assert "approve_above_usd asked and was refused (no terminal)" in asked.output
