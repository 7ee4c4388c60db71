"""``sim --help`` loads only the command line: each command imports its implementation
when it runs, so the runner, replay and the stub server stay unloaded."""

from __future__ import annotations

import subprocess
import sys

from sim.analysis.usage import BY_CHOICES
from sim.cli import stub, tune
from sim.testing.stub_server import RANDOM_FAULTS

HEAVY = ("sim.engine.runner", "sim.ticklog.replay", "sim.testing.stub_server", "sim.llm.client")


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
    assert {"sim.engine.runner", "sim.ticklog.replay"} <= loaded


def test_the_options_restated_for_speed_match_their_sources() -> None:
    assert stub.DEFAULT_FAULTS == RANDOM_FAULTS
    assert tune.BY_CHOICES == BY_CHOICES
