"""What the CLI says when a newcomer stumbles (issue 24, items 14 and 24): an undeclared
endpoint named in ``--model``, a bad ``--phase``, a tick with no log. Real ``sim``
processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import copy_demo, tree


def sim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sim", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "OPENAI_API_KEY": "sk-test"},
        timeout=120,
    )


def test_a_model_on_an_undeclared_endpoint_is_an_error_naming_the_section(
    tmp_path: Path,
) -> None:
    world = copy_demo(tmp_path / "w")
    before = tree(world, logs=True)
    result = sim("tick", "--world", str(world), "--model", "local/qwen2.5-7b", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "[providers.local]" in result.stderr
    assert "Traceback" not in result.stderr
    assert tree(world, logs=True) == before  # nothing ran, nothing written
