"""``sim --help`` loads only the command line: each command imports its implementation
when it runs, so the runner, replay and the stub server stay unloaded."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from conftest import DEMO

import sim.cli
from sim.analysis.usage import BY_CHOICES
from sim.cli import stub, tune
from sim.testing.stub_server import RANDOM_FAULTS

HEAVY = ("sim.engine.runner", "sim.engine.replay", "sim.testing.stub_server", "sim.llm.client")


def loaded_after(code: str) -> set[str]:
    script = f"import sys\n{code}\nprint(' '.join(m for m in sys.modules if m.startswith('sim')))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    return set(done.stdout.split())


def test_importing_the_cli_loads_no_engine() -> None:
    loaded = loaded_after("import sim.cli")
    assert "sim.cli" in loaded
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_sim_help_loads_no_engine() -> None:
    code = (
        "from sim.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "for name in ('tick', 'log', 'replay', 'usage', 'tune', 'report', 'stub-server'):\n"
        "    try:\n        main([name, '--help'])\n    except SystemExit:\n        pass"
    )
    loaded = loaded_after(code)
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_running_a_command_loads_what_it_needs() -> None:
    """The control: the test above would notice the modules if they were loaded."""
    loaded = loaded_after(
        "from sim.cli import main\n"
        "try:\n    main(['replay', '--world', '/nonexistent', '--tick', '1'])\n"
        "except SystemExit:\n    pass"
    )
    assert {"sim.engine.runner", "sim.engine.replay"} <= loaded


def test_the_options_restated_for_speed_match_their_sources() -> None:
    assert stub.DEFAULT_FAULTS == RANDOM_FAULTS
    assert tune.BY_CHOICES == BY_CHOICES


REPO = Path(__file__).resolve().parents[2]
COMMAND_MODULES = {f"sim.cli.{module}" for module, _ in sim.cli.COMMANDS.values()}


def loaded_everything_after(code: str, cwd: Path | None = None) -> set[str]:
    """Every module (not only sim's) a fresh Python has loaded after running ``code``."""
    script = f"import sys\n{code}\nprint(' '.join(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=cwd,
    )
    return set(done.stdout.splitlines()[-1].split())


def test_importing_the_cli_loads_no_command_and_no_config_models() -> None:
    """Each command's module (and pydantic, which the config's models need) loads only
    when a command runs: ``sim tick`` pays for no other command's imports."""
    loaded = loaded_everything_after("import sim.cli")
    assert not loaded & COMMAND_MODULES, sorted(loaded & COMMAND_MODULES)
    assert "pydantic" not in loaded and "sim.config" not in loaded


def test_sim_help_loads_every_command_but_no_pydantic_llm_layer_or_asyncio() -> None:
    """``sim --help`` loads each command's module for its one-line help; none of them may
    bring the LLM layer's types (pydantic) or asyncio at import (bench/RESULTS.md,
    section 6: its CPU beyond ``import click``)."""
    loaded = loaded_everything_after(
        "from sim.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    )
    assert loaded >= COMMAND_MODULES  # the control: every command's module was loaded
    unused = {"pydantic", "sim.llm.errors", "sim.llm.types", "asyncio"}
    assert not loaded & unused, sorted(loaded & unused)


def test_an_llm_error_is_still_mapped_to_its_line_and_exit_code() -> None:
    from sim.cli.common import errors
    from sim.llm.errors import LLMBudgetExceededError, LLMConfigurationError, LLMError

    for exc, code in ((LLMConfigurationError("x"), 2), (LLMBudgetExceededError("y"), 1)):
        with pytest.raises(SystemExit) as done, errors():
            raise exc
        assert done.value.code == code
    with pytest.raises(SystemExit) as done, errors():
        raise LLMError("z")
    assert done.value.code == 1
    with pytest.raises(ValueError, match="not mapped"), errors():
        raise ValueError("not mapped")


def test_an_offline_tick_loads_only_its_own_command_and_no_http_sdk(tmp_path: Path) -> None:
    world = tmp_path / "demo"
    shutil.copytree(DEMO, world, ignore=shutil.ignore_patterns(".sim"))
    loaded = loaded_everything_after(
        "from sim.cli import main\n"
        f"try:\n    main(['tick', '--world', {str(world)!r}])\n"
        "except SystemExit as exc:\n    assert not exc.code, exc.code",
        cwd=tmp_path,
    )
    assert "sim.engine.runner" in loaded  # the control: the tick ran here
    assert (tmp_path / "demo" / ".sim").is_dir()
    assert loaded & COMMAND_MODULES == {"sim.cli.run"}
    sdk = {"openai", "httpx2", "httpcore2", "anyio", "aiohttp", "anthropic", "google"}
    assert not loaded & sdk, sorted(loaded & sdk)


def test_every_lazy_command_is_reachable() -> None:
    from sim.cli import COMMANDS, main

    for name in COMMANDS:
        command = main.get_command(click.Context(main), name)
        assert command is not None and command.name == name


def test_a_command_s_help_loads_no_config_and_no_policy() -> None:
    """The shared options and error mapping do not import the config's models (nor the
    policy package, which imports them): ``build_config`` does, when a command runs."""
    loaded = loaded_everything_after(
        "from sim.cli import main\ntry:\n    main(['log', '--help'])\nexcept SystemExit:\n    pass"
    )
    assert "sim.cli.history" in loaded  # the control: the command's module was loaded
    unused = {"sim.config", "sim.policy", "sim.ticklog.summary"}
    assert not loaded & unused, sorted(loaded & unused)


@pytest.fixture(scope="module")
def ticked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo world after one offline tick (a log and its summary to read)."""
    tmp = tmp_path_factory.mktemp("ticked")
    world = tmp / "demo"
    shutil.copytree(DEMO, world, ignore=shutil.ignore_patterns(".sim"))
    done = subprocess.run(
        [sys.executable, "-m", "sim", "tick", "--world", str(world)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp,
    )
    assert done.returncode == 0, done.stderr
    return world


def run_loading(args: list[str], cwd: Path) -> set[str]:
    """The modules loaded by ``sim ARGS`` run in a fresh Python, which must exit 0."""
    return loaded_everything_after(
        "from sim.cli import main\n"
        f"try:\n    main({args!r})\n"
        "except SystemExit as exc:\n    assert not exc.code, exc.code",
        cwd=cwd,
    )


def test_sim_log_of_every_tick_loads_neither_the_config_nor_the_world(ticked: Path) -> None:
    """``sim log --tick all`` reads the ticks' summaries: no config models, no entity
    models or storage, no templates, no LLM client."""
    loaded = run_loading(["log", "--world", str(ticked), "--tick", "all"], ticked.parent)
    assert "sim.ticklog.summary" in loaded  # the control: it read the summaries
    unused = {
        "sim.config",
        "sim.policy",
        "sim.storage",
        "sim.world",
        "sim.engine.compact",
        "sim.llm.client",
        "jinja2",
        "asyncio",
    }
    assert not loaded & unused, sorted(loaded & unused)


def test_sim_usage_loads_no_llm_stack_and_by_phase_no_world(ticked: Path) -> None:
    """``sim usage`` counts interviews without importing what asks them (the LLM client,
    asyncio), and grouped by phase it reads no entity."""
    stack = {"sim.llm.client", "sim.engine.stack", "asyncio", "jinja2", "sim.phases"}
    by_phase = run_loading(["usage", "--world", str(ticked), "--by", "phase"], ticked.parent)
    assert {"sim.analysis.usage", "sim.interview"} <= by_phase  # the control
    assert not by_phase & (stack | {"sim.storage", "sim.world"}), sorted(by_phase & stack)
    by_entity = run_loading(["usage", "--world", str(ticked)], ticked.parent)
    assert "sim.storage" in by_entity  # the control: the entities were read
    assert not by_entity & stack, sorted(by_entity & stack)
