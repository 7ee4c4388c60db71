"""A ``cli`` provider's model name that would be read as an option (issue 35, item 12):
``sim check`` passed a world's ``model = "--output=/tmp/x"``, and ``sim tick`` refused it
only when the first call was made, after writing ``.sim/log``, without naming the file or
the field. The config refuses it when it loads, naming both, before anything is written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import copy_demo, tree

from sim.cli import main


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def user_config(tmp_path: Path) -> Path:
    """The user's own config: a ``cli`` provider and a named ``cli`` endpoint, both
    passing the model to the command as ``{model}``."""
    command = json.dumps([sys.executable, "-c", "print('{}')", "-m", "{model}"])
    path = tmp_path / "user.toml"
    path.write_text(
        f'[llm]\nprovider = "cli"\ncommand = {command}\n'
        f'[providers.local]\nkind = "cli"\ncommand = {command}\n'
    )
    return path


@pytest.mark.parametrize(
    ("world_config", "field", "model"),
    [
        ('[phase1]\nmodel = "--output=/tmp/x"\n', "phase1.model", "--output=/tmp/x"),
        ('[phase2b]\nfallback_models = ["local/-v"]\n', "phase2b.fallback_models", "-v"),
        ('[phase4]\nmodel = "cli/-rf"\n', "phase4.model", "-rf"),
    ],
)
def test_a_model_name_a_command_would_take_for_an_option_is_refused_by_name(
    tmp_path: Path, user_config: Path, world_config: str, field: str, model: str
) -> None:
    world = copy_demo(tmp_path / "w")
    (world / "config.toml").write_text(world_config)
    before = tree(world, logs=True)
    for command in ("check", "tick"):
        done = invoke(command, "--world", str(world), "--config", str(user_config))
        assert done.exit_code == 2, (command, done.output)
        assert "config.toml" in done.output and f"field '{field}'" in done.output, done.output
        assert repr(model) in done.output and 'start with "-"' in done.output
        assert tree(world, logs=True) == before, command
        assert not (world / ".sim").exists(), command


def test_a_model_flag_is_named_too_and_a_plain_name_passes(
    tmp_path: Path, user_config: Path
) -> None:
    world = copy_demo(tmp_path / "w")
    done = invoke("tick", "--world", str(world), "--config", str(user_config), "--model=-x")
    assert done.exit_code == 2, done.output
    assert "field '--model'" in done.output and "'-x'" in done.output
    assert done.output.count("'-x'") == 1  # once, not once per phase
    assert not (world / ".sim").exists()
    done = invoke("check", "--world", str(world), "--config", str(user_config))
    assert done.exit_code == 0, done.output
