"""``sim study verify``: whether a study's folder still holds what its runs wrote.

Every arm the study's record names must be there, and nothing else; each arm (and each
shared prefix) is checked against its own tick logs and answer records
(``sim.runs.verify``: a hand-edited world file, an edited or missing answer line), must
have reached the study's last tick, must record the study's inputs, and must hold every
character's answer to every survey due by its tick. ``sim study report``, ``sim study
compare`` and ``sim export --study`` refuse a study that does not verify unless told
``--unverified``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from sim import safefs
from sim.errors import InputError, LogError
from sim.interview import read_interviews
from sim.runs.fork import MAX_STUDY_RECORD_BYTES, RUN_FILE, STUDY_RECORD, current_tick
from sim.runs.inputs import Inputs, changed
from sim.runs.verify import refuse_unverified, verify_run
from sim.study.design import SHARED

#: the verdict on a study with problems (a refusal's, a report's note, ``sim study verify``'s)
UNVERIFIED_STUDY = "the study does not verify"


def _record(out: Path) -> tuple[dict[str, Any], Inputs | None]:
    path = out / STUDY_RECORD
    try:
        data = orjson.loads(safefs.read_file(out, STUDY_RECORD, MAX_STUDY_RECORD_BYTES))
        design = data["design"]
        if not isinstance(design, dict) or not all(isinstance(r, str) for r in design["runs"]):
            raise TypeError("design.runs is not a list of folders")
        inputs = None if data.get("inputs") is None else Inputs.model_validate(data["inputs"])
    except FileNotFoundError:
        raise InputError(path, None, "not found: is this a study's folder?") from None
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(path, None, f"cannot read the study's record: {exc}") from None
    except ValidationError as exc:
        raise InputError(path, "inputs", str(exc.errors()[0]["msg"])) from None
    return design, inputs


def _found_runs(out: Path, groups: list[str]) -> tuple[set[str], list[str]]:
    """``group/run`` for every run folder under ``out``, and a problem for each link (or
    anything but a folder) where the study's ``groups`` or their runs go (never followed)."""
    found: set[str] = set()
    problems: list[str] = []
    for group in sorted(out.iterdir()):
        problem = safefs.folder_problem(group)
        if problem is not None:
            if group.name in groups:
                problems.append(f"{group}: {problem}: a study's folders must be its own")
            continue
        for run_dir in sorted(group.iterdir()):
            problem = safefs.folder_problem(run_dir)
            if problem is not None and group.name in groups:
                problems.append(f"{run_dir}: {problem}: a study's folders must be its own")
            elif problem is None and (run_dir / RUN_FILE).is_file():
                found.add(f"{group.name}/{run_dir.name}")
    return found, problems


def _survey_problems(run_dir: Path, rel: str, start: int, surveys: list[Any]) -> list[str]:
    """Every character's answer to every survey due by the run's tick."""
    try:
        interviews = read_interviews(run_dir)
        tick = current_tick(run_dir)
    except (LogError, InputError) as exc:
        return [f"{rel}: {exc}"]
    characters = {p.stem for p in (run_dir / "characters").glob("*.json")}
    problems: list[str] = []
    for i, survey in enumerate(surveys):
        if not isinstance(survey, dict):
            continue
        question = str(survey.get("question", "")).strip()
        form = survey.get("format") or "text"
        for due in survey.get("ticks", []):
            if not isinstance(due, int) or start + due > tick:
                continue
            answered = {
                a.character
                for a in interviews
                if a.tick == start + due
                and a.question == question
                and (a.format or "text") == form
                and not a.failed
            }
            missing = sorted(characters - answered)
            if missing:
                problems.append(
                    f"{rel}: survey {i + 1} at tick {due}: no answer from {', '.join(missing)}"
                )
    return problems


def verify_study(out: Path) -> list[str]:
    """The problems found in the study's folder ``out`` (none: it verifies).

    Raises:
        InputError: ``out`` is not a study's folder or its record cannot be read.
    """
    design, inputs = _record(out)
    problems: list[str] = []
    if inputs is None:
        problems.append(f"{out / STUDY_RECORD}: records no digests of its inputs")
    expected = list(design["runs"])
    groups = [SHARED, *(rel.partition("/")[0] for rel in expected)]
    found, link_problems = _found_runs(out, groups)
    problems += link_problems
    shared = sorted(r for r in found if r.startswith(SHARED + "/"))
    for rel in expected:
        if rel not in found:
            problems.append(f"{out / rel}: missing (the study's record names this arm)")
    for rel in sorted(found - set(expected) - set(shared)):
        problems.append(f"{out / rel}: an arm the study's record does not name")
    ticks = design.get("ticks")
    surveys = design.get("surveys") or []
    for rel in [*shared, *(r for r in expected if r in found)]:
        run_dir = out / rel
        record, found_problems = verify_run(run_dir)
        problems += found_problems
        if record is None:
            continue
        if inputs is not None:
            differ = changed(record.inputs, inputs)
            if differ:
                problems.append(
                    f"{run_dir / RUN_FILE}: made from other inputs ({'; '.join(differ)})"
                )
        if rel in shared:
            continue
        try:
            tick = current_tick(run_dir)
        except InputError as exc:
            problems.append(str(exc))
            continue
        if isinstance(ticks, int) and tick < record.start_tick + ticks:
            problems.append(
                f"{run_dir}: not finished (tick {tick - record.start_tick} of {ticks}): run "
                "the study again to resume it"
            )
        problems += _survey_problems(run_dir, rel, record.start_tick, surveys)
    return problems


def require_verified(out: Path, unverified: bool, flag: str = "--unverified") -> list[str]:
    """The problems of the study in ``out``; refused unless ``unverified`` (``flag``: how
    the caller sets it, named in the refusal).

    Raises:
        InputError: it does not verify and ``unverified`` is not set (the problems named).
    """
    return refuse_unverified(
        out, verify_study(out), UNVERIFIED_STUDY, "sim study verify", unverified, flag
    )


__all__ = ["UNVERIFIED_STUDY", "require_verified", "verify_study"]
