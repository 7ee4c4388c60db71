"""A schema property is data, whatever its name (issue 35, item 11): ``model_validate`` or
``model_dump`` made ``sim tick`` end in ``internal error: ValueError``, and ``model_config``
was silently dropped (pydantic took it for the model's settings). Such names are kept as
written: in the schema the model is sent, in its answers, in the log and in the writes."""

from __future__ import annotations

from pathlib import Path

import orjson
from click.testing import CliRunner, Result
from conftest import copy_demo

from sim.cli import main
from sim.interview import read_interviews
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

#: property names pydantic keeps for itself, or that every model has as an attribute
NAMES = ("model_validate", "model_dump", "model_config", "copy", "_private")

CONFIG = """
[tick]
phases = ["intentions", "resolution", "narrative", "apply", "opinion", "memory"]

[phases.opinion]
per = "character"
instructions = "prompts/opinion.md"
schema = "schemas/opinion.json"

[phases.opinion.writes]
"state.stance" = "model_config"
"state.verdict" = "model_validate"
"state.nested" = "detail.model_dump"
"""

SCHEMA = {
    "type": "object",
    "properties": {
        **{name: {"type": "string", "enum": [f"{name}-a", f"{name}-b"]} for name in NAMES},
        "detail": {
            "type": "object",
            "properties": {"model_dump": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["model_dump"],
            "additionalProperties": False,
        },
    },
    "required": [*NAMES, "detail"],
    "additionalProperties": False,
}


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def test_a_declared_phase_answers_and_writes_properties_named_like_pydantics(
    tmp_path: Path,
) -> None:
    world = copy_demo(tmp_path / "w")
    (world / "config.toml").write_text(CONFIG)
    (world / "prompts").mkdir(exist_ok=True)
    (world / "prompts" / "opinion.md").write_text("Where do you stand?\n")
    (world / "schemas").mkdir()
    (world / "schemas" / "opinion.json").write_bytes(orjson.dumps(SCHEMA))
    done = invoke("check", "--world", str(world))
    assert done.exit_code == 0, done.output
    done = invoke("tick", "--world", str(world))
    assert done.exit_code == 0, done.output
    ada = orjson.loads((world / "characters" / "ada.json").read_bytes())
    assert ada["state"]["stance"] in ("model_config-a", "model_config-b")
    assert ada["state"]["verdict"] in ("model_validate-a", "model_validate-b")
    assert ada["state"]["nested"] in range(1, 10)
    calls = [c for c in read_log(log_path(world, 1)).calls.values() if c.phase == "opinion"]
    assert calls
    for call in calls:  # the offline model answers the schema it was sent: these names
        answer = call.result
        assert answer is not None, call.error
        assert set(answer) == {*NAMES, "detail"} and set(answer["detail"]) == {"model_dump"}


def test_a_survey_schema_keeps_such_names_in_its_answers(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    schema = tmp_path / "survey.json"
    schema.write_bytes(orjson.dumps(SCHEMA))
    done = invoke("ask", "--world", str(world), "ada", "Where?", "--schema", str(schema))
    assert done.exit_code == 0, done.output
    (interview,) = read_interviews(world)
    assert isinstance(interview.value, dict)
    assert set(interview.value) == {*NAMES, "detail"}
    assert interview.value["model_config"] in ("model_config-a", "model_config-b")
