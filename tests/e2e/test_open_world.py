"""A world the user defines: everything in it reaches the model, templated prompts,
phases and verbs it declares (issue 12)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import DEMO, HARVEST, configured, install_distribution, tree

from sim import sections
from sim.cli import main
from sim.config import load_config
from sim.engine.replay import replay
from sim.engine.runner import Runner
from sim.errors import InputError
from sim.testing.logs import plain_log
from sim.testing.plugins import CENSUS
from sim.testing.stub_server import StubServer
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log


def _edit(path: Path, change: object) -> None:
    data = orjson.loads(path.read_bytes())
    change(data)  # type: ignore[operator]
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))


def test_description_and_custom_fields_reach_every_intention_input(demo_world: Path) -> None:
    _edit(demo_world / "world.json", lambda d: d.update(description="MARKER-PREMISE-41 a vote"))
    _edit(demo_world / "world.json", lambda d: d.update(season="drought"))
    for path in sorted((demo_world / "characters").glob("*.json")):
        _edit(path, lambda d: d["identity"].update(secret_goal="MARKER-SECRET-77"))
        _edit(path, lambda d: d["state"].update(age=61))
        _edit(path, lambda d: d["memory"].update(grudge="MARKER-GRUDGE-5"))
    for path in sorted((demo_world / "locations").glob("*.json")):
        _edit(path, lambda d: d.update(smell="MARKER-SMELL-9"))
    Runner(demo_world, load_config(world_dir=demo_world)).run(2)
    for tick in (1, 2):
        log = read_log(log_path(demo_world, tick))
        intentions = [c for c in log.calls.values() if c.phase == "intentions"]
        assert len(intentions) == 10
        for call in intentions:
            document = sections.loads(call.input)
            assert document is not None
            assert "MARKER-PREMISE-41" in call.input
            assert "MARKER-SECRET-77" in call.input
            assert document["world"]["season"] == "drought"
            assert document["character"]["age"] == 61
            assert document["memory"]["grudge"] == "MARKER-GRUDGE-5"
            assert document["location"]["smell"] == "MARKER-SMELL-9"
        resolutions = [c for c in log.calls.values() if c.phase == "resolution"]
        assert resolutions and all("MARKER-SECRET-77" in c.input for c in resolutions)
        assert all("MARKER-PREMISE-41" in c.input for c in log.calls.values())


def test_a_characters_secret_is_not_shown_to_the_others(demo_world: Path) -> None:
    path = demo_world / "characters" / "ada.json"
    _edit(path, lambda d: d.update(secret="ADA-ONLY-SECRET"))
    Runner(demo_world, load_config(world_dir=demo_world)).run(1)
    log = read_log(log_path(demo_world, 1))
    for call in log.calls.values():
        if call.phase == "intentions":
            assert ("ADA-ONLY-SECRET" in call.input) == (call.entity_key == "intention:ada")


def test_cli_tick_runs(demo_world: Path) -> None:
    result = CliRunner().invoke(main, ["tick", "--world", str(demo_world)])
    assert result.exit_code == 0, result.output


# -- phases the world declares ----------------------------------------------------------------

#: the issue's text, verbatim (one line split to fit)
ISSUE_CONFIG = (
    """
[tick]
phases = ["intentions", "resolution", "narrative", "apply", "opinion", "memory"]"""
    """   # order; built-ins by name

[phases.opinion]
per = "character"                          # character | location | world
instructions = "prompts/opinion.md"        # world-relative template
input = "prompts/opinion.input.md"         # optional; default: the subject's JSON view
schema = "schemas/opinion.json"            # JSON Schema of the answer (world-relative)
writes = { "state.stance" = "stance", "state.mood" = "mood" }   # entity field <- answer field
response_chain_depth = 1
"""
)

OPINION_SCHEMA = {
    "type": "object",
    "properties": {
        "stance": {"type": "string", "enum": ["for", "against", "undecided"]},
        "mood": {"type": "string", "maxLength": 60},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["stance", "mood", "confidence"],
    "additionalProperties": False,
}


def opinion_world(world: Path) -> Path:
    (world / "config.toml").write_text(ISSUE_CONFIG)
    (world / "prompts").mkdir(exist_ok=True)
    (world / "schemas").mkdir(exist_ok=True)
    (world / "prompts" / "opinion.md").write_text(
        "You are {{ character.identity.name }} in {{ world.name }}. Where do you stand?\n"
    )
    (world / "prompts" / "opinion.input.md").write_text(
        "{{ world.description }}\nYou are at {{ location.identity.name }}.\n"
        "{% for p in present %}{{ p.identity.name }} is here.\n{% endfor %}"
        "{% if outcome %}This turn: {{ outcome }}{% endif %}\n"
    )
    (world / "schemas" / "opinion.json").write_bytes(orjson.dumps(OPINION_SCHEMA))
    return world


def test_the_issues_config_adds_a_phase_that_writes_stance(demo_world: Path) -> None:
    world = opinion_world(demo_world)
    runner = CliRunner()
    result = runner.invoke(main, ["tick", "--world", str(world), "--ticks", "2"])
    assert result.exit_code == 0, result.output
    assert "opinion" in result.output
    for path in sorted((world / "characters").glob("*.json")):
        state = orjson.loads(path.read_bytes())["state"]
        assert state["stance"] in ("for", "against", "undecided")
    log = read_log(log_path(world, 2))
    opinion = [c for c in log.calls.values() if c.phase == "opinion"]
    assert len(opinion) == 10
    assert {c.entity_key.split(":")[0] for c in opinion} == {"opinion"}
    assert all(len(c.history) == 1 for c in opinion)  # depth 1, second tick
    assert log.header.phases[4] == "opinion"
    assert log.header.templates and "opinion.md" in log.header.templates
    assert log.header.schemas and "opinion" in log.header.schemas
    shown = runner.invoke(main, ["log", "--world", str(world), "--tick", "2"])
    assert "[opinion]" in shown.output and "stance: " in shown.output
    usage = runner.invoke(main, ["usage", "--world", str(world), "--by", "phase"])
    assert any(line.startswith("opinion ") for line in usage.output.splitlines()), usage.output
    tuned = runner.invoke(
        main,
        ["tune", "--world", str(world), "--phase", "opinion", "--depths", "0,1", "--ticks", "1"],
    )
    assert tuned.exit_code == 0, tuned.output
    assert "tune opinion" in tuned.output
    out = world / "report.html"
    report = runner.invoke(main, ["report", "--world", str(world), "--out", str(out)])
    assert report.exit_code == 0, report.output
    assert "simReportTick" in out.read_text()  # in the world: the ticks' detail beside it
    detail = [p.read_text() for p in (world / "report-ticks").glob("tick-*.js")]
    assert len(detail) == 2 and all('"p":"opinion"' in text for text in detail)


def test_writes_that_break_the_world_are_refused_up_front(demo_world: Path) -> None:
    world = opinion_world(demo_world)
    text = ISSUE_CONFIG.replace('"state.mood" = "mood"', '"state.location" = "mood"')
    (world / "config.toml").write_text(text)
    result = CliRunner().invoke(main, ["check", "--world", str(world)])
    assert result.exit_code == 2
    assert "phases.opinion.writes.state.location" in result.output
    assert "state.location is the engine's" in result.output


def test_a_write_of_the_wrong_type_is_undone_and_reported(demo_world: Path) -> None:
    world = opinion_world(demo_world)
    (world / "config.toml").write_text(
        ISSUE_CONFIG.replace('"state.mood" = "mood"', '"state.inventory" = "mood"')
    )
    before = {p.name: orjson.loads(p.read_bytes()) for p in (world / "characters").glob("*")}
    checked = CliRunner().invoke(main, ["check", "--world", str(world)])
    assert checked.exit_code == 0  # a warning: the config itself is valid
    assert "phases.opinion.writes: a sample answer would be refused" in checked.output
    assert "state.inventory" in checked.output
    result = CliRunner().invoke(main, ["tick", "--world", str(world)])
    assert result.exit_code == 0, result.output
    assert "writes ignored" in result.output
    for path in (world / "characters").glob("*.json"):
        state = orjson.loads(path.read_bytes())["state"]
        assert "stance" not in state  # the whole write of that subject was undone
        assert isinstance(state["inventory"], list)
        assert before[path.name]["identity"] == orjson.loads(path.read_bytes())["identity"]


def test_unsupported_schema_keyword_is_named(demo_world: Path) -> None:
    world = opinion_world(demo_world)
    schema = dict(OPINION_SCHEMA)
    schema["properties"] = {**OPINION_SCHEMA["properties"], "x": {"type": "string", "pattern": "a"}}  # type: ignore[dict-item]
    (world / "schemas" / "opinion.json").write_bytes(orjson.dumps(schema))
    result = CliRunner().invoke(main, ["check", "--world", str(world)])
    assert result.exit_code == 2
    assert "properties.x.pattern" in result.output and "unsupported" in result.output


def test_a_declared_phase_not_listed_is_an_error(demo_world: Path) -> None:
    world = opinion_world(demo_world)
    (world / "config.toml").write_text(
        ISSUE_CONFIG.split("[phases.opinion]")[1].join(["[phases.opinion]", ""])
    )
    result = CliRunner().invoke(main, ["tick", "--world", str(world)])
    assert result.exit_code == 2
    assert "not in [tick] phases" in result.output
    assert not (world / ".sim" / "log").exists()


@pytest.mark.parametrize(
    ("phases", "message"),
    [
        (
            ["intentions", "resolution", "narrative", "memory", "apply"],
            "'memory' must come after 'apply'",
        ),
        (["resolution", "narrative", "apply"], "'resolution' needs 'intentions' earlier"),
        (["intentions", "apply", "intentions"], "'intentions' is listed twice"),
        (["intentions", "gossip"], "unknown phase 'gossip'"),
    ],
)
def test_impossible_orders_are_named_errors(
    demo_world: Path, phases: list[str], message: str
) -> None:
    (demo_world / "config.toml").write_text(f"[tick]\nphases = {orjson.dumps(phases).decode()}\n")
    result = CliRunner().invoke(main, ["check", "--world", str(demo_world)])
    assert result.exit_code == 2
    assert message in result.output, result.output


def test_builtins_can_be_removed(demo_world: Path) -> None:
    (demo_world / "config.toml").write_text('[tick]\nphases = ["intentions", "apply"]\n')
    result = CliRunner().invoke(main, ["tick", "--world", str(demo_world)])
    assert result.exit_code == 0, result.output
    log = read_log(log_path(demo_world, 1))
    assert {c.phase for c in log.calls.values()} == {"intentions"}
    assert log.header.phases == ["intentions", "apply"]


# -- a phase from an entry point ------------------------------------------------------------

PLUGIN = CENSUS


def install_plugin(
    folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    module: str = "simtest_census",
    code: str = PLUGIN,
) -> None:
    """A tiny installed distribution offering ``census`` in the ``sim.phases`` group."""
    install_distribution(
        folder, monkeypatch, module, code, "sim.phases", f"census = {module}:CensusPhase"
    )


def test_a_python_phase_from_an_entry_point_runs(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "site").mkdir()
    install_plugin(tmp_path / "site", monkeypatch)
    (demo_world / "config.toml").write_text(
        '[tick]\nphases = ["intentions", "resolution", "narrative", "apply", "census", "memory"]\n'
        "[phases.census]\nresponse_chain_depth = 1\ntemperature = 0.1\n"
    )
    result = CliRunner().invoke(main, ["tick", "--world", str(demo_world)])
    assert result.exit_code == 0, result.output
    assert "census" in result.output
    log = read_log(log_path(demo_world, 1))
    census = [c for c in log.calls.values() if c.phase == "census"]
    assert len(census) == len(list((demo_world / "locations").glob("*.json")))
    assert log.phase_results("census")
    for path in (demo_world / "locations").glob("*.json"):
        assert isinstance(orjson.loads(path.read_bytes())["state"]["crowd"], str)
    assert log.header.schemas and "census" in log.header.schemas


#: the demo's phases with ``census`` after the moves
CENSUS_PHASES = '["intentions", "resolution", "narrative", "apply", "census", "memory"]'


def test_a_python_phase_about_one_place_at_a_time_runs_on_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package's phase that says ``per = "location"`` (and takes its subjects from
    ``ctx.locations()``) runs on each shard of ``sim tick --workers``, with one process's
    files and results."""
    site = tmp_path / "site"
    place_local = PLUGIN.replace('name = "census"', 'name = "census"\n    per = "location"')
    place_local = place_local.replace(
        "return list(ctx.world.locations.values())", "return ctx.locations()"
    )
    assert place_local.count('per = "location"') == place_local.count("ctx.locations()") == 1
    install_plugin(site, monkeypatch, code=place_local)
    monkeypatch.setenv("PYTHONPATH", str(site))  # the workers import it too
    worlds = {}
    for workers in (1, 2, 3):
        world = tmp_path / f"w{workers}"
        shutil.copytree(DEMO, world, ignore=shutil.ignore_patterns(".sim"))
        (world / "config.toml").write_text(f"[tick]\nphases = {CENSUS_PHASES}\n")
        args = ["tick", "--world", str(world), "--ticks", "3", "--workers", str(workers)]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        assert "one process" not in result.output
        worlds[workers] = world

    def books(world: Path) -> str:
        shown = CliRunner().invoke(main, ["usage", "--world", str(world), "--by", "phase"])
        assert shown.exit_code == 0, shown.output
        return shown.output

    for workers in (2, 3):
        assert tree(worlds[workers]) == tree(worlds[1])
        assert books(worlds[workers]) == books(worlds[1])  # each place's call made once
        for tick in (1, 2, 3):
            ours = read_log(log_path(worlds[workers], tick)).phase_results("census")
            assert list(ours.items()) == list(
                read_log(log_path(worlds[1], tick)).phase_results("census").items()
            )


#: the demo's phases with ``census`` before the moves
CENSUS_FIRST = '["intentions", "resolution", "census", "narrative", "apply", "memory"]'


@pytest.mark.parametrize(
    ("kind", "phases"),
    [("demo", CENSUS_PHASES), ("demo", CENSUS_FIRST), ("messages", CENSUS_FIRST), ("minds", "")],
    ids=["after-the-moves", "before-the-moves", "before-the-messages", "after-conversations"],
)
def test_a_python_phase_that_does_not_say_runs_in_sim_tick_alone_after_the_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, phases: str
) -> None:
    """A package's phase that does not say it is about one place at a time may read or
    write any entity: the shards run the phases before it, then hand ``sim tick`` their
    parts, and it runs the rest of the tick by itself, as one process. The files, each
    phase's logged results, the story and the books are one process's, wherever the
    phase is: after the moves; before them (``apply`` then runs in ``sim tick`` with
    every shard's resolutions); before ``apply`` delivers the tick's messages; and after
    the minds world's conversations, which its resolution and narrative read, every
    shard's."""
    from sim.engine import sharded_tick

    install_plugin(tmp_path / "site", monkeypatch)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))  # the workers import it too
    taken: list[int] = []
    take_over = sharded_tick.take_over

    async def counted(*args: object) -> object:
        taken.append(len(args[1].active))  # type: ignore[attr-defined]
        return await take_over(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(sharded_tick, "take_over", counted)
    source = tmp_path / "source"
    settings: list[str] = []
    if kind == "messages":
        args = ["init", str(source), "--characters", "12", "--locations", "6"]
        assert CliRunner().invoke(main, [*args, "--network", "ring"]).exit_code == 0
        (source / "config.toml").write_text(
            f"[tick]\nphases = {phases}\n[messages]\nenabled = true\n"
        )
    elif kind == "minds":
        after = '"conversation", "census", "resolution"'
        configured("minds", source, '"conversation", "resolution"', after)
        settings = ["--set", "conversation.max_conversations_per_tick=2"]
    else:
        shutil.copytree(DEMO, source, ignore=shutil.ignore_patterns(".sim"))
        (source / "config.toml").write_text(f"[tick]\nphases = {phases}\n")
    worlds = {}
    for workers in (1, 2, 3):
        world = worlds[workers] = tmp_path / f"w{workers}"
        shutil.copytree(source, world)
        args = ["tick", "--world", str(world), "--ticks", "3", "--workers", str(workers)]
        result = CliRunner().invoke(main, [*args, *settings])
        assert result.exit_code == 0, result.output
        assert "one process" not in result.output
    assert taken == [1] * 3 + [2] * 3  # each tick's workers handed their parts over

    def shown(world: Path, *args: str) -> str:
        out = CliRunner().invoke(main, [*args, "--world", str(world)])
        assert out.exit_code == 0, out.output
        return re.sub(r"\d+\.\d+s\b", "<s>", out.output)

    for workers in (2, 3):
        assert tree(worlds[workers]) == tree(worlds[1])
        assert shown(worlds[workers], "usage", "--by", "phase") == shown(
            worlds[1], "usage", "--by", "phase"
        )
        for tick in (1, 2, 3):
            assert shown(worlds[workers], "log", "--tick", str(tick)) == shown(
                worlds[1], "log", "--tick", str(tick)
            )
            ours = read_log(log_path(worlds[workers], tick))
            theirs = read_log(log_path(worlds[1], tick))
            assert [(n, list(p.results.items())) for n, p in ours.phases.items()] == [
                (n, list(p.results.items())) for n, p in theirs.phases.items()
            ]
    if kind == "messages":  # some messages went out
        sent = read_log(log_path(worlds[3], 1)).phase_results("apply")
        assert sent.get("messages")
    report = replay(worlds[3], 1, 3, config=load_config(worlds[3] / "config.toml"))
    assert report.identical, [(t.tick, t.drifts[:1]) for t in report.ticks]


def test_a_python_phase_over_the_whole_world_first_runs_the_tick_in_one_process(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before any phase that runs on a part there is nothing for a worker to do: the tick
    runs in one process, saying why."""
    (tmp_path / "site").mkdir()
    install_plugin(tmp_path / "site", monkeypatch)
    (demo_world / "config.toml").write_text(
        '[tick]\nphases = ["census", "intentions", "resolution", "narrative", "apply"]\n'
    )
    result = CliRunner().invoke(main, ["tick", "--world", str(demo_world), "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert "--workers 2: ran in one process (phase 'census' runs over the whole world" in (
        result.output
    )


def test_check_names_undefined_names_and_syntax_errors_with_file_and_line(demo_world: Path) -> None:
    world = opinion_world(demo_world)
    (world / "prompts" / "opinion.md").write_text(
        "Line one is fine: {{ world.name }}\n{{ character.identity.nickname }}\n"
    )
    result = CliRunner().invoke(main, ["check", "--world", str(world)])
    assert result.exit_code == 2
    assert "prompts/opinion.md:2: undefined name" in result.output
    assert "nickname" in result.output and "opinion:ada, and 9 more" in result.output
    (world / "prompts" / "opinion.md").write_text("fine\n\n{% if character %}\n")
    result = CliRunner().invoke(main, ["check", "--world", str(world)])
    assert result.exit_code == 2
    assert "prompts/opinion.md:3" in result.output


def test_check_renders_builtin_overrides_and_warns_about_stray_prompts(demo_world: Path) -> None:
    (demo_world / "prompts").mkdir()
    (demo_world / "prompts" / "intentions.md").write_text("{{ character.state.mood }}\n")
    (demo_world / "prompts" / "resolution.input.md").write_text("{{ location.nope }}\n")
    (demo_world / "prompts" / "intention.md").write_text("typo in the name\n")
    result = CliRunner().invoke(main, ["check", "--world", str(demo_world)])
    assert result.exit_code == 2
    assert "prompts/resolution.input.md:1: undefined name" in result.output
    assert "intentions.md" not in result.output.split("warning")[0]
    assert "intention.md: matches no phase" in result.output


def test_a_world_input_template_replaces_the_json_document(demo_world: Path) -> None:
    (demo_world / "prompts").mkdir()
    (demo_world / "prompts" / "intentions.input.md").write_text(
        "{{ character.identity.name }} at {{ location.identity.name }}; exits: "
        "{% for e in exits %}{{ e.id }} {% endfor %}\n"
    )
    result = CliRunner().invoke(main, ["tick", "--world", str(demo_world)])
    assert result.exit_code == 0, result.output
    log = read_log(log_path(demo_world, 1))
    call = log.calls[next(k for k, c in log.calls.items() if c.entity_key == "intention:ada")]
    assert call.input.startswith("Ada Strand at Herring Quay; exits: ")


def test_a_template_cannot_read_outside_prompts(demo_world: Path, tmp_path: Path) -> None:
    (tmp_path / "secret.md").write_text("TOP-SECRET")
    (demo_world / "prompts").mkdir()
    (demo_world / "prompts" / "leak.md").symlink_to(tmp_path / "secret.md")
    (demo_world / "prompts" / "intentions.md").write_text('{% include "leak.md" %}\n')
    result = CliRunner().invoke(main, ["check", "--world", str(demo_world)])
    assert result.exit_code == 2
    assert "TOP-SECRET" not in result.output and "symlink" in result.output
    (demo_world / "prompts" / "leak.md").unlink()
    (demo_world / "prompts" / "intentions.md").write_text('{% include "../world.json" %}\n')
    result = CliRunner().invoke(main, ["check", "--world", str(demo_world)])
    assert result.exit_code == 2 and "not found" in result.output


# -- replay names what changed ----------------------------------------------------------------


def test_replay_uses_the_logged_config_and_names_the_keys_that_differ(demo_world: Path) -> None:
    runner = CliRunner()
    ran = runner.invoke(
        main, ["tick", "--world", str(demo_world), "--ticks", "2", "--depth", "phase2a=3"]
    )
    assert ran.exit_code == 0, ran.output
    result = runner.invoke(main, ["replay", "--world", str(demo_world), "--tick", "2"])
    assert result.exit_code == 0, result.output
    assert "tick 2: identical" in result.output
    assert "phase2a.response_chain_depth: logged 3, now 2" in result.output


def test_replay_names_a_changed_template_and_schema(demo_world: Path) -> None:
    world = opinion_world(demo_world)
    runner = CliRunner()
    assert runner.invoke(main, ["tick", "--world", str(world), "--ticks", "2"]).exit_code == 0
    (world / "prompts" / "opinion.md").write_text(
        "Where do you stand, {{ character.identity.name }}?"
    )
    schema = dict(OPINION_SCHEMA)
    schema["properties"] = {**OPINION_SCHEMA["properties"]}  # type: ignore[dict-item]
    schema["properties"]["reason"] = {"type": "string"}  # type: ignore[index]  (optional)
    (world / "schemas" / "opinion.json").write_bytes(orjson.dumps(schema))
    result = runner.invoke(main, ["replay", "--world", str(world), "--tick", "2"])
    assert "template opinion.md: changed" in result.output, result.output
    assert "schema opinion: changed" in result.output
    assert "template opinion.input.md" not in result.output
    assert "requests drifted" in result.output


def test_replay_names_a_changed_phase_list(demo_world: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["tick", "--world", str(demo_world)]).exit_code == 0
    (demo_world / "config.toml").write_text('[tick]\nphases = ["intentions", "apply"]\n')
    result = runner.invoke(main, ["replay", "--world", str(demo_world), "--tick", "1"])
    assert "tick 1: identical" in result.output, result.output
    assert (
        "phases changed: logged intentions, resolution, narrative, apply, memory; now "
        "intentions, apply" in result.output
    )


# -- verbs the world declares -----------------------------------------------------------------


def test_a_declared_verb_reaches_schema_instructions_and_resolution(demo_world: Path) -> None:
    (demo_world / "config.toml").write_text(
        '[actions]\ntrade = "offer an item from your inventory to someone here"\n'
    )
    Runner(demo_world, load_config(world_dir=demo_world)).run(6)
    traded = 0
    for tick in range(1, 7):
        log = read_log(log_path(demo_world, tick))
        call = next(c for c in log.calls.values() if c.phase == "intentions")
        text = log.instructions[call.instructions_digest]
        assert '"trade": offer an item from your inventory to someone here' in text
        resolution = next(c for c in log.calls.values() if c.phase == "resolution")
        assert "trade" in log.instructions[resolution.instructions_digest]
        outcomes = {
            o["character_id"]: o["outcome"]
            for r in log.phase_results("resolution").values()
            for o in r["outcomes"]
        }
        for cid, intention in log.phase_results("intentions").items():
            if intention["action"] == "trade":
                traded += 1
                assert "tried to trade " in outcomes[cid]
    assert traded > 0


def test_a_declared_verb_is_a_tool_in_tools_mode(demo_world: Path) -> None:
    (demo_world / "config.toml").write_text(
        '[phase1]\nmode = "tools"\n[actions]\ntrade = "offer an item to someone here"\n'
    )
    Runner(demo_world, load_config(world_dir=demo_world)).run(1)
    log = read_log(log_path(demo_world, 1))
    assert len(log.phase_results("intentions")) == 10
    from sim.llm.tools import FunctionCall, ToolCalls
    from sim.phases.intention_tools import intention_data, tools_for

    assert [t.name for t in tools_for({"trade": "x"})][-1] == "trade"
    call = FunctionCall(
        name="trade", arguments={"target": "bram", "content": "a lamp"}, call_id="1"
    )
    data = intention_data(ToolCalls(calls=[call]), {"trade": "x"})
    assert data["action"] == "trade" and data["target"] == "bram"


def test_a_verb_may_not_shadow_a_builtin_action(demo_world: Path) -> None:
    (demo_world / "config.toml").write_text('[actions]\nmove = "walk"\n')
    result = CliRunner().invoke(main, ["check", "--world", str(demo_world)])
    assert result.exit_code == 2 and "actions.move" in result.output


# -- a phase's own provider -------------------------------------------------------------------


def test_a_phase_can_send_its_requests_to_another_provider(
    demo_world: Path, tmp_path: Path, stub_server: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_KEY", "sk-local")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    # the user's own config (where requests go is the user's choice, not a world's)
    mine = tmp_path / "mine.toml"
    mine.write_text(
        f'[phase1]\nprovider = "chat"\nbase_url = "{stub_server.base_url}"\n'
        'api_key_env = "LOCAL_KEY"\nmodel = "local-model"\n'
    )
    args = ["tick", "--world", str(demo_world), "--config", str(mine)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert stub_server.stats.generations == 10  # the intentions only; the rest offline
    assert {r.get("model") for r in stub_server.log} == {"local-model"}
    log = read_log(log_path(demo_world, 1))
    models = {c.phase: c.response_model or c.model for c in log.calls.values()}
    assert models["intentions"] == "local-model" and models["resolution"] == "offline"


# -- the harvest-vote example world ------------------------------------------------------------


def test_harvest_vote_runs_offline_and_writes_every_stance(tmp_path: Path) -> None:
    import shutil

    copies = []
    for n in (1, 2):
        world = tmp_path / f"hv{n}"
        shutil.copytree(HARVEST, world, ignore=shutil.ignore_patterns(".sim"))
        runner = CliRunner()
        assert runner.invoke(main, ["check", "--world", str(world)]).exit_code == 0
        result = runner.invoke(main, ["tick", "--world", str(world), "--ticks", "5"])
        assert result.exit_code == 0, result.output
        copies.append(world)
    world = copies[0]
    verbs = set()
    for tick in range(1, 6):
        log = read_log(log_path(world, tick))
        votes = [c for c in log.calls.values() if c.phase == "vote"]
        assert len(votes) == 6
        marta = next(c for c in votes if c.entity_key == "vote:marta")
        assert "She has already decided to vote no" in marta.input  # a custom field
        assert "Harrow Valley" in log.instructions[marta.instructions_digest]
        verbs |= {i["action"] for i in log.phase_results("intentions").values()}
    assert {"bribe", "petition"} & verbs
    for path in sorted((world / "characters").glob("*.json")):
        assert orjson.loads(path.read_bytes())["state"]["stance"] in ("sell", "keep", "undecided")
        twin = copies[1] / "characters" / path.name
        assert path.read_bytes() == twin.read_bytes()  # offline runs are reproducible


def test_declared_phases_per_location_and_per_world(demo_world: Path) -> None:
    (demo_world / "prompts").mkdir()
    (demo_world / "schemas").mkdir()
    (demo_world / "prompts" / "weather.md").write_text(
        "Describe the weather at {{ location.identity.name }}.\n"
    )
    (demo_world / "prompts" / "omen.md").write_text(
        "{{ characters | length }} people, {{ locations | length }} places: name an omen.\n"
    )
    (demo_world / "schemas" / "weather.json").write_bytes(
        orjson.dumps(
            {
                "type": "object",
                "properties": {
                    "sky": {"type": "string", "enum": ["clear", "fog", "storm"]},
                    "wind": {"type": "integer", "minimum": 0, "maximum": 12},
                },
                "required": ["sky", "wind"],
            }
        )
    )
    (demo_world / "schemas" / "omen.json").write_bytes(
        orjson.dumps(
            {
                "type": "object",
                "properties": {"omen": {"type": "string", "maxLength": 80}},
                "required": ["omen"],
            }
        )
    )
    (demo_world / "config.toml").write_text(
        '[tick]\nphases = ["weather", "intentions", "resolution", "narrative", "apply", '
        '"memory", "omen"]\n'
        '[phases.weather]\nper = "location"\ninstructions = "prompts/weather.md"\n'
        'schema = "schemas/weather.json"\nwrites = { "state.weather.sky" = "sky", '
        '"state.weather.wind" = "wind" }\n'
        '[phases.omen]\nper = "world"\ninstructions = "prompts/omen.md"\n'
        'schema = "schemas/omen.json"\nwrites = { "omen" = "omen" }\n'
    )
    result = CliRunner().invoke(main, ["tick", "--world", str(demo_world), "--ticks", "2"])
    assert result.exit_code == 0, result.output
    for path in (demo_world / "locations").glob("*.json"):
        weather = orjson.loads(path.read_bytes())["state"]["weather"]
        assert weather["sky"] in ("clear", "fog", "storm") and 0 <= weather["wind"] <= 12
    meta = orjson.loads((demo_world / "world.json").read_bytes())
    assert isinstance(meta["omen"], str) and meta["tick"] == 2
    log = read_log(log_path(demo_world, 2))
    assert [k for k in log.phase_results("omen")] == ["world"]
    assert any(c.entity_key == "omen:world" for c in log.calls.values())
    # the world's own new field reaches the next tick's inputs
    first = next(c for c in log.calls.values() if c.phase == "intentions")
    assert (sections.loads(first.input) or {})["world"]["omen"]


def test_a_python_phase_that_raises_is_named(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    broken = PLUGIN.replace('s["state"]["crowd"] = r.crowd', 'raise KeyError("crowd")')
    install_plugin(site, monkeypatch, "simtest_broken_census", broken)
    (demo_world / "config.toml").write_text('[tick]\nphases = ["intentions", "census"]\n')
    result = CliRunner().invoke(main, ["tick", "--world", str(demo_world)])
    assert result.exit_code == 1
    assert "phase 'census' failed applying its answers: KeyError('crowd')" in result.output
    assert orjson.loads((demo_world / "world.json").read_bytes())["tick"] == 0


def test_replay_of_a_log_from_before_these_keys_names_no_changes(demo_world: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["tick", "--world", str(demo_world)]).exit_code == 0
    path = plain_log(demo_world, 1)
    lines = path.read_bytes().splitlines(keepends=True)
    head = orjson.loads(lines[0])
    for key in ("tick", "phases", "actions"):
        del head["config"][key]
    for section in ("phase1", "phase2a", "phase2b", "phase4"):
        for key in ("provider", "base_url", "api_key_env"):
            del head["config"][section][key]
    for key in ("phases", "templates", "schemas"):
        del head[key]
    path.write_bytes(orjson.dumps(head) + b"\n" + b"".join(lines[1:]))
    result = runner.invoke(main, ["replay", "--world", str(demo_world), "--tick", "1"])
    assert result.output.splitlines() == [
        "tick 1: identical (22 calls served from the log)",
        "identical",
    ]


def test_check_renders_a_declared_phase_as_the_tick_would_see_it(demo_world: Path) -> None:
    world = opinion_world(demo_world)
    (world / "prompts" / "opinion.md").write_text("You meant to {{ intention.action }}.\n")
    assert CliRunner().invoke(main, ["check", "--world", str(world)]).exit_code == 0
    early = ISSUE_CONFIG.replace(
        '["intentions", "resolution", "narrative", "apply", "opinion", "memory"]',
        '["opinion", "intentions", "resolution", "narrative", "apply", "memory"]',
    )
    (world / "config.toml").write_text(early)
    result = CliRunner().invoke(main, ["check", "--world", str(world)])
    assert result.exit_code == 2
    assert "opinion.md:1" in result.output and "no attribute 'action'" in result.output


def test_depth_and_model_flags_reach_a_declared_phase(demo_world: Path) -> None:
    world = opinion_world(demo_world)
    from sim.cli.common import build_config

    config = build_config(None, world, depth=("opinion=3",), model="m-1")
    assert config.phase("opinion").response_chain_depth == 3
    assert config.phase("phases.opinion").model == "m-1"
    with pytest.raises(InputError, match="unknown phase 'gossip'"):
        build_config(None, world, depth=("gossip=1",))


def test_replay_never_reads_a_symlinked_template_or_a_fifo(
    demo_world: Path, tmp_path: Path
) -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["tick", "--world", str(demo_world)]).exit_code == 0
    secret = tmp_path / "secret.md"
    secret.write_text("TOP-SECRET")
    (demo_world / "prompts").mkdir()
    (demo_world / "prompts" / "narrative.md").symlink_to(secret)
    os.mkfifo(demo_world / "prompts" / "pipe.md")
    result = runner.invoke(main, ["replay", "--world", str(demo_world), "--tick", "1"])
    assert "TOP-SECRET" not in result.output
    assert "tick 1: identical" in result.output, result.output  # the built-in was used


def test_a_declared_phase_over_http_with_the_real_sdk(
    demo_world: Path, stub_server: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = opinion_world(demo_world)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    for provider in ("chat", "openai"):
        args = ["tick", "--world", str(world), "--provider", provider]
        result = CliRunner().invoke(main, [*args, "--base-url", stub_server.base_url])
        assert result.exit_code == 0, result.output
    for path in (world / "characters").glob("*.json"):
        assert orjson.loads(path.read_bytes())["state"]["stance"] in ("for", "against", "undecided")
    sent = [r for r in stub_server.log if "Where do you stand" in orjson.dumps(r).decode()]
    assert len(sent) == 20  # ten characters, two ticks, one opinion request each


def test_a_template_that_does_not_parse_stops_tick_before_anything_is_written(
    demo_world: Path,
) -> None:
    (demo_world / "prompts").mkdir()
    (demo_world / "prompts" / "narrative.md").write_text("ok\n{% for x in %}\n")
    result = CliRunner().invoke(main, ["tick", "--world", str(demo_world)])
    assert result.exit_code == 2
    assert "narrative.md:2" in result.output
    assert not (demo_world / ".sim").exists()


def test_the_python_phase_in_docs_phases_md_runs(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "phases.md").read_text()
    code = re.search(r"```python\n((?:(?!```).)*?class CensusPhase.*?)```", doc, re.S)
    assert code is not None
    (tmp_path / "site").mkdir()
    install_plugin(tmp_path / "site", monkeypatch, "simtest_doc_census", code.group(1))
    (demo_world / "config.toml").write_text('[tick]\nphases = ["intentions", "apply", "census"]\n')
    result = CliRunner().invoke(main, ["tick", "--world", str(demo_world)])
    assert result.exit_code == 0, result.output
    log = read_log(log_path(demo_world, 1))
    assert len(log.phase_results("census")) == len(list((demo_world / "locations").iterdir()))


def test_check_json_lists_phases_and_template_errors(demo_world: Path) -> None:
    world = opinion_world(demo_world)
    result = CliRunner().invoke(main, ["check", "--world", str(world), "--json"])
    assert result.exit_code == 0, result.output
    document = orjson.loads(result.stdout.splitlines()[-1])
    assert document["ok"] and document["phases"][4] == "opinion"
    (world / "prompts" / "opinion.md").write_text("{{ nope }}\n")
    result = CliRunner().invoke(main, ["check", "--world", str(world), "--json"])
    assert result.exit_code == 2
    document = orjson.loads(result.stdout.splitlines()[0])
    assert not document["ok"] and "opinion.md:1: undefined name" in document["errors"][0]
