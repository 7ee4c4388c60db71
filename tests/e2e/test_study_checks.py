"""Issue 39: every mistake of a study found before anything runs (exit 2, the study file and
the field named, no fork, no call): interventions against the world, a question asked
twice, ``format`` with ``schema``, ``--out`` inside the world (for a sweep too)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import tree

from sim.cli import main

STUDY = """\
world = "w"
seeds = "1"
ticks = 3
[conditions.control]
[conditions.treated]
{treated}
[[surveys]]
ticks = [3]
question = "Will you vote to rebuild the mill?"
format = "yesno"
{more}
"""


def sim(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    assert sim("init", "w")[0] == 0
    (tmp_path / "answer.json").write_text(
        '{"type": "object", "properties": {"answer": {"type": "integer"}}, '
        '"required": ["answer"], "additionalProperties": false}'
    )
    return tmp_path


CASES = {
    # an injection at a place the world does not have
    ("inject = [{ tick = 2, at = 'mill', text = 'A fire.' }]", ""): (
        "conditions.treated.inject.0.at",
        "no location 'mill'",
    ),
    # a set naming nobody, a path that is not an object, a value the file would not take
    ("set = [{ tick = 2, path = 'nobody.state.mood', value = 'x' }]", ""): (
        "conditions.treated.set.0.path",
        "no character or location 'nobody'",
    ),
    ("set = [{ tick = 2, path = 'ada.state.location', value = 'mill' }]", ""): (
        "conditions.treated.set.0.path",
        "unknown location 'mill'",
    ),
    ("set = [{ tick = 2, path = 'ada.identity.name.first', value = 'A' }]", ""): (
        "conditions.treated.set.0.path",
        "not an object",
    ),
    # the same question twice
    (
        "",
        '[[surveys]]\nticks = [2]\nquestion = " Will you vote to rebuild the mill? "\n'
        'format = "likert5"',
    ): ("surveys.1.question", "the same question as surveys.0"),
    # a format and a schema
    ("", '[[surveys]]\nticks = [2]\nquestion = "How many?"\nformat = "number"\n'
     'schema = "answer.json"'): ("surveys.1.format", "given with schema"),
}  # fmt: skip


@pytest.mark.parametrize(("change", "expected"), list(CASES.items()))
def test_a_mistake_is_refused_before_anything_runs(
    here: Path, change: tuple[str, str], expected: tuple[str, str]
) -> None:
    treated, more = change
    (here / "study.toml").write_text(STUDY.format(treated=treated, more=more))
    world = tree(here / "w", logs=True)
    code, output = sim("study", "run", "study.toml", "--out", "out")
    field, problem = expected
    assert code == 2, output
    assert "study.toml" in output and field in output and problem in output, output
    assert not (here / "out").exists()
    assert tree(here / "w", logs=True) == world


def test_a_valid_set_still_runs(here: Path) -> None:
    treated = "set = [{ tick = 2, path = 'ada.state.mood', value = 'wary' }]"
    (here / "study.toml").write_text(STUDY.format(treated=treated, more=""))
    code, output = sim("study", "run", "study.toml", "--out", "out")
    assert code == 0, output


@pytest.mark.parametrize("out", ["w/runs", "w", "w/characters/../deep/er"])
def test_out_inside_the_world_is_refused(here: Path, out: str) -> None:
    (here / "study.toml").write_text(STUDY.format(treated="", more=""))
    world = tree(here / "w", logs=True)
    code, output = sim("study", "run", "study.toml", "--out", out)
    assert code == 2 and "--out" in output and "inside the world" in output, output
    code, output = sim("sweep", "--world", "w", "--out", out)  # refused before already
    assert code == 2 and "outside the world" in output, output
    assert tree(here / "w", logs=True) == world
