"""A memory strategy offered by an installed package (the ``sim.memory`` entry-point group):
``[memory] mode`` names it, and the phases' inputs show what it recalls."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import install_distribution

from sim.cli import main
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

PLUGIN = '''
class Diary:
    """Recalls one line: how many cells the character holds, and the phase's k."""

    name = "diary"
    keeps_evicted = True
    uses_situation = False

    def recall(self, request):
        cells = request.memory["cells"]
        return {"recall": [f"diary-of-{len(cells)}-cells-k{request.config.k}"]}


class NotAStrategy:
    name = "broken"
'''


def install(folder: Path, monkeypatch: pytest.MonkeyPatch, entries: str) -> None:
    install_distribution(folder, monkeypatch, "simtest_memory", PLUGIN, "sim.memory", entries)


def tick(world: Path, tmp_path: Path, config_text: str) -> Result:
    """``sim tick`` on ``world`` with a user config of ``config_text``."""
    config = tmp_path / "user.toml"
    config.write_text(config_text)
    return CliRunner().invoke(main, ["tick", "--world", str(world), "--config", str(config)])


@pytest.fixture(autouse=True)
def fresh_registry() -> object:
    from sim.mind.strategy import memory_strategy

    memory_strategy.cache_clear()
    yield
    memory_strategy.cache_clear()


def test_an_installed_memory_strategy_is_what_the_inputs_recall(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(tmp_path / "site", monkeypatch, "diary = simtest_memory:Diary")
    result = tick(demo_world, tmp_path, '[memory]\nmode = "diary"\nk = 4\n')
    assert result.exit_code == 0, result.output
    log = read_log(log_path(demo_world, 1))
    intentions = [c for c in log.calls.values() if c.phase == "intentions"]
    assert intentions
    assert all("-cells-k4" in c.input and "diary-of-" in c.input for c in intentions)
    from sim.config import load_config
    from sim.mind.cells import retrieving

    # what to remember: the strategy keeps evicted cells, so the long-term store is on
    assert retrieving(load_config(tmp_path / "user.toml").memory)


def test_a_phase_may_name_its_own_strategy(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(tmp_path / "site", monkeypatch, "diary = simtest_memory:Diary")
    result = tick(demo_world, tmp_path, '[memory.phases.intentions]\nmode = "diary"\n')
    assert result.exit_code == 0, result.output
    calls = read_log(log_path(demo_world, 1)).calls.values()
    assert all("diary-of-" in c.input for c in calls if c.phase == "intentions")
    assert not any("diary-of-" in c.input for c in calls if c.phase != "intentions")


def test_a_strategy_that_is_not_one_is_named_and_nothing_runs(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(tmp_path / "site", monkeypatch, "broken = simtest_memory:NotAStrategy")
    result = tick(demo_world, tmp_path, '[memory]\nmode = "broken"\n')
    assert result.exit_code == 2, result.output
    assert "simtest_memory:NotAStrategy" in result.output
    assert "recall(request)" in result.output
    assert "Traceback" not in result.output
    assert not log_path(demo_world, 1).exists()


def test_an_unknown_strategy_is_a_config_error_and_a_builtin_name_cannot_be_taken(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(tmp_path / "site", monkeypatch, "window = simtest_memory:NotAStrategy")
    from sim.mind.strategy import BUILTIN, memory_strategy

    assert memory_strategy("window") is BUILTIN["window"]
    config = tmp_path / "user.toml"
    config.write_text('[memory]\nmode = "nosuch"\n')
    result = CliRunner().invoke(
        main, ["check", "--world", str(demo_world), "--config", str(config)]
    )
    assert result.exit_code == 2
    assert "memory.mode" in result.output and "unknown memory strategy 'nosuch'" in result.output


def test_the_strategy_in_docs_phases_md_runs(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "phases.md").read_text()
    code = re.search(r"```python\n((?:(?!```).)*?class Diary.*?)```", doc, re.S)
    assert code is not None
    install_distribution(
        tmp_path / "site",
        monkeypatch,
        "simtest_doc_diary",
        code.group(1),
        "sim.memory",
        "diary = simtest_doc_diary:Diary",
    )
    result = tick(demo_world, tmp_path, '[memory]\nmode = "diary"\n')
    assert result.exit_code == 0, result.output
    calls = read_log(log_path(demo_world, 1)).calls.values()
    inputs = [c.input for c in calls if c.phase == "intentions"]
    assert inputs and all(re.search(r"\bday \d+: ", text) for text in inputs)
    assert not any(re.search(r"\btick \d+: ", text) for text in inputs)  # not the window's
