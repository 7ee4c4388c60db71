"""Schema bombs (issue 35, item 4): a declared phase's or a survey's JSON Schema demanding
a huge answer (``minItems: 100000000``, ``minLength: 500000000``, arrays of arrays) hung
``sim check`` (its sample answer), ``sim tick`` (after writing ``.sim/log``) and ``sim study
run``. Such a schema is refused when it is loaded, by file, field and limit, before
anything is written.

Each command runs as a real process with a deadline: before the fix it hung, and the
deadline is the failure.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import copy_demo, tree

from sim.phases.schema import MAX_ITEMS, MAX_LEAST_ANSWER, MAX_LENGTH

#: far longer than a refusal takes, far shorter than building the bomb's answer
DEADLINE = 120

PHASE = """
[tick]
phases = ["intentions", "resolution", "narrative", "apply", "opinion", "memory"]

[phases.opinion]
per = "character"
instructions = "prompts/opinion.md"
schema = "schemas/opinion.json"
writes = { "state.stance" = "stance" }
"""


def _schema(**extra: object) -> dict[str, object]:
    return {
        "type": "object",
        "properties": {"stance": {"type": "string", "maxLength": 40}, **extra},
        "required": ["stance", *extra],
        "additionalProperties": False,
    }


#: name -> (the answer schema, the field named, what the error says)
BOMBS = {
    "minItems": (
        _schema(tags={"type": "array", "items": {"type": "string"}, "minItems": 100_000_000}),
        "properties.tags.minItems",
        f"at most {MAX_ITEMS:,} (got 100,000,000)",
    ),
    "minLength": (
        _schema(essay={"type": "string", "minLength": 500_000_000}),
        "properties.essay.minLength",
        f"at most {MAX_LENGTH:,} (got 500,000,000)",
    ),
    "nested": (
        _schema(
            grid={
                "type": "array",
                "minItems": 1000,
                "items": {"type": "array", "minItems": 1000, "items": {"type": "integer"}},
            }
        ),
        "properties.grid",
        f"at most {MAX_LEAST_ANSWER:,}",
    ),
}


def sim(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sim", *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
        cwd=cwd,
    )


def bomb_world(root: Path, schema: object) -> Path:
    world = copy_demo(root / "w")
    (world / "config.toml").write_text(PHASE)
    (world / "prompts").mkdir(exist_ok=True)
    (world / "prompts" / "opinion.md").write_text("Where do you stand?\n")
    (world / "schemas").mkdir()
    (world / "schemas" / "opinion.json").write_bytes(orjson.dumps(schema))
    return world


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_check_and_tick_refuse_a_phase_schema_bomb_writing_nothing(
    tmp_path: Path, bomb: str
) -> None:
    schema, field, problem = BOMBS[bomb]
    world = bomb_world(tmp_path, schema)
    before = tree(world, logs=True)
    for command in ("check", "tick"):
        done = sim(command, "--world", str(world))
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        said = done.stdout + done.stderr
        assert "opinion.json" in said and field in said and problem in said, (command, said)
        assert "Traceback" not in said
        assert tree(world, logs=True) == before, command
        assert not (world / ".sim").exists(), command


def test_the_same_world_with_a_bounded_schema_ticks(tmp_path: Path) -> None:
    """The limits leave room: the largest counts allowed, in a schema whose least answer
    fits, check and tick."""
    world = bomb_world(
        tmp_path,
        _schema(
            tags={
                "type": "array",
                "items": {"type": "string", "maxLength": 8},
                "minItems": 10,
                "maxItems": MAX_ITEMS,
            },
            note={"type": "string", "minLength": 100, "maxLength": MAX_LENGTH},
        ),
    )
    for command in ("check", "tick"):
        done = sim(command, "--world", str(world))
        assert done.returncode == 0, (command, done.stdout, done.stderr)
    answers = [
        orjson.loads(p.read_bytes())["state"]["stance"]
        for p in sorted((world / "characters").glob("*.json"))
    ]
    assert answers and all(isinstance(a, str) for a in answers)


STUDY = """\
world = "w"
seeds = "1"
ticks = 1
[conditions.control]
[[surveys]]
ticks = [1]
question = "Where do you stand?"
schema = "bomb.json"
"""


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_study_run_refuses_a_survey_schema_bomb_writing_nothing(tmp_path: Path, bomb: str) -> None:
    schema, field, problem = BOMBS[bomb]
    copy_demo(tmp_path / "w")
    (tmp_path / "study.toml").write_text(STUDY)
    (tmp_path / "bomb.json").write_bytes(orjson.dumps(schema))
    before = tree(tmp_path, logs=True)
    done = sim("study", "run", "study.toml", "--out", "out", cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    said = done.stdout + done.stderr
    assert "bomb.json" in said and field in said and problem in said, said
    assert "Traceback" not in said
    assert tree(tmp_path, logs=True) == before
    assert not (tmp_path / "out").exists()
    # and `sim ask --schema`, which a study's surveys run, refuses it the same way
    done = sim("ask", "--world", "w", "ada", "Where?", "--schema", "bomb.json", cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert field in done.stdout + done.stderr
    assert tree(tmp_path, logs=True) == before
