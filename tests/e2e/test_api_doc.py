"""docs/api.md is true to the code: its example runs, and it lists exactly sim.__all__."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from conftest import HARVEST

import sim

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "api.md").read_text()


def test_the_api_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(
        HARVEST,
        tmp_path / "worlds" / "harvest-vote",
        ignore=shutil.ignore_patterns(".sim"),
    )
    monkeypatch.chdir(tmp_path)
    code = re.search(r"```python\n(.*?)```", DOC, re.S)
    assert code is not None
    exec(compile(code.group(1), "docs/api.md", "exec"), {})
    # it ran on a copy: the released world (the repository's, run from a checkout) is
    # left as it was (issue 35)
    assert (tmp_path / "hv" / ".sim" / "log").is_dir()
    assert not (tmp_path / "worlds" / "harvest-vote" / ".sim").exists()


def test_the_doc_lists_exactly_the_public_names() -> None:
    table = DOC.split("## Public names", 1)[1]
    listed = set(re.findall(r"`(\w+)`", table.split("Test doubles")[0]))
    assert listed == set(sim.__all__)
    for name in sim.__all__:
        assert getattr(sim, name) is not None
