"""The newcomer's path (issue 35): what a first-time user, following the README from a fresh
clone, tripped on. Each test runs the command as the docs write it, or reads the docs
against what the code does."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import DEMO, copy_demo

from sim.cli import main
from sim.testing.stub_server import StubServer

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")


def sim(*args: str, env: dict[str, str | None] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.output


def edit(path: Path, change: dict[str, object], part: str = "state") -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    data[part].update(change)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


# -- 1. from a fresh clone to a second command that works -------------------------------


def test_the_readme_says_how_sim_gets_on_the_path_before_its_first_sim_command() -> None:
    lines = README.splitlines()
    first_sim = next(
        n for n, line in enumerate(lines) if line.startswith("sim ") or "&& sim " in line
    )
    activate = next(n for n, line in enumerate(lines) if "source .venv/bin/activate" in line)
    assert activate < first_sim
    assert activate < 20  # among the README's first lines


def test_make_demo_ends_with_a_next_step() -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    recipe = subprocess.run(
        ["make", "-n", "demo"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout
    # what make demo would run, in order: the last thing it does is say what to do next
    tail = recipe.strip().splitlines()[-4:]
    assert any("source .venv/bin/activate" in line for line in tail), recipe
    assert any("sim tick --world world" in line for line in tail), recipe


# -- 2. the README's samples run on the README's own world ---------------------------------


def test_the_readmes_intervention_sample_names_places_and_people_of_its_world() -> None:
    places = {p.stem for p in (DEMO / "locations").glob("*.json")}
    people = {p.stem for p in (DEMO / "characters").glob("*.json")}
    at = re.findall(r"sim inject --world world --at (\S+)", README)
    assert at and set(at) <= places, at
    setting = re.findall(r"sim set --world world '(\w[\w-]*)\.", README)
    assert setting and set(setting) <= people, setting
    asked = re.findall(r"sim ask --world world (\w[\w-]*) ", README)
    assert set(asked) <= people, asked


def test_the_readmes_intervention_sample_runs_on_a_copy_of_the_demo(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "world")
    at = re.findall(r"sim inject --world world --at (\S+)", README)[0]
    code, out = sim("inject", "--world", str(world), "--at", at, "A storm breaks.")
    assert code == 0, out


# -- 4. a `sim init` world agrees with itself ----------------------------------------------


def test_a_new_world_checks_without_warnings_and_its_readme_tells_what_works(
    tmp_path: Path,
) -> None:
    world = tmp_path / "mine"
    code, out = sim("init", str(world))
    assert code == 0, out
    code, out = sim("check", "--world", str(world))
    assert code == 0, out
    assert "warning:" not in out  # no prompt file it wrote itself is unused
    readme = (world / "README.md").read_text(encoding="utf-8")
    # no relative link to a file the world does not have
    for path in re.findall(r"\b((?:docs|prompts|characters|locations)/[\w.-]+\.md)\b", readme):
        assert (world / path).exists() or "sim's source" in readme, path
    assert "Switch `provider`" not in readme
    # the way it gives to a real model works: on the command line, not in the world's config
    command = re.search(r"`(sim tick --world \S+ --provider openai)`", readme)
    assert command is not None, readme
    code, out = sim("tick", "--help")
    assert code == 0 and "--provider" in out and "--base-url" in out
    # ... and the world's config may not choose it (what the old README said to do)
    config = world / "config.toml"
    config.write_text(config.read_text().replace('"offline"', '"openai"'))
    code, out = sim("check", "--world", str(world))
    assert code == 2 and "may not change where requests go" in out


# -- 5. sim check reports every problem at once ---------------------------------------------


def test_check_reports_a_config_problem_and_the_worlds_problems_together(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    (world / "config.toml").write_text('[phase1]\ntemperature = "hot"\n')
    edit(world / "characters" / "bram.json", {"location": "nowhere"})
    edit(world / "characters" / "ada.json", {"mood": 5})
    code, out = sim("check", "--world", str(world))
    assert code == 2
    assert "3 problems" in out
    assert "config.toml: field 'phase1.temperature'" in out
    assert "bram.json: field 'state.location': unknown location 'nowhere'" in out
    assert "ada.json: field 'state.mood'" in out


def test_check_with_only_a_config_problem_says_just_that(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    (world / "config.toml").write_text('[phase1]\ntemperature = "hot"\n')
    code, out = sim("check", "--world", str(world))
    assert code == 2
    assert "world is invalid" not in out
    assert "config.toml: field 'phase1.temperature'" in out


# -- 9. smaller ----------------------------------------------------------------------------


def test_a_mistyped_command_gets_the_nearest_one() -> None:
    code, out = sim("tik")
    assert code == 2
    assert "No such command 'tik'. Did you mean 'tick'?" in out
    code, out = sim("zzzz")
    assert code == 2 and "Did you mean" not in out


def test_the_readmes_outputs_are_ignored_by_git() -> None:
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "world/", "tables/", "runs/", "harvest-runs/"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert sorted(ignored) == ["harvest-runs/", "runs/", "tables/", "world/"]


def test_shell_completion_is_documented_and_works() -> None:
    assert 'eval "$(_SIM_COMPLETE=bash_source' in README
    done = subprocess.run(
        [sys.executable, "-c", "from sim.cli import main; main(prog_name='sim')"],
        env={**os.environ, "_SIM_COMPLETE": "bash_source", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert "_sim_completion" in done.stdout and "complete " in done.stdout, done.stderr


# -- 3. the stub-server samples run as written -----------------------------------------------

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
KEYED = re.compile(r"sim (tick|tune|ask|sweep)\b.*--provider (openai|gemini|anthropic)\b")


def test_every_loopback_sample_with_a_keyed_provider_sets_a_key() -> None:
    found = []
    for path in DOCS:
        for line in path.read_text(encoding="utf-8").splitlines():
            if KEYED.search(line) and "127.0.0.1" in line:
                found.append(line)
                assert "_API_KEY=" in line, f"{path.name}: {line}"
    assert len(found) >= 3


def test_the_stub_server_sample_runs_as_written(stub_server: StubServer, tmp_path: Path) -> None:
    text = (REPO / "docs" / "providers.md").read_text(encoding="utf-8")
    line = next(
        line
        for line in text.splitlines()
        if line.startswith("OPENAI_API_KEY=")
        and "--base-url http://127.0.0.1:8765/v1" in line
        and "--batch" not in line
    )
    assignment, command = line.split(" ", 1)
    name, value = assignment.split("=", 1)
    world = copy_demo(tmp_path / "my-world")
    args = shlex.split(command)[1:]
    args[args.index("--world") + 1] = str(world)
    args[args.index("--base-url") + 1] = stub_server.base_url
    environment = {k: None for k in os.environ if k.endswith("_API_KEY")}
    code, out = sim(*args, env={**environment, name: value})
    assert code == 0, out
    assert stub_server.log  # it went to the stub


# -- 6. the numbers agree between commands ------------------------------------------------


def test_calls_csv_names_the_model_as_sim_usage_does(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    assert sim("tick", "--world", str(world))[0] == 0
    code, out = sim("export", "--world", str(world), "--out", str(tmp_path / "t"))
    assert code == 0, out
    with (tmp_path / "t" / "calls.csv").open(encoding="utf-8") as handle:
        models = {row["model"] for row in csv.DictReader(handle)}
    code, out = sim("usage", "--world", str(world), "--by", "model", "--json")
    assert code == 0, out
    rows = json.loads(out)["rows"]
    assert models == {row["key"] for row in rows} == {"offline/offline"}


def test_usage_by_tick_is_in_tick_order(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    assert sim("tick", "--world", str(world), "--ticks", "3")[0] == 0
    code, out = sim("usage", "--world", str(world), "--by", "tick")
    assert code == 0, out
    ticks = [line.split()[0] for line in out.splitlines()[1:]]
    assert ticks == ["1", "2", "3", "total"]  # tick 3 spent the most tokens


def test_compaction_says_it_ends_replay_and_export_says_what_it_leaves_out(
    tmp_path: Path,
) -> None:
    world = copy_demo(tmp_path / "w")
    assert sim("tick", "--world", str(world), "--ticks", "3")[0] == 0
    code, out = sim("log", "--world", str(world), "--compact", "--before", "3")
    assert code == 0, out
    assert "note: ticks 1-2 can no longer be replayed" in out
    code, out = sim("export", "--world", str(world), "--out", str(tmp_path / "t"))
    assert code == 0, out
    assert re.search(r"note: 2 ticks \(first 1, last 2\) were compacted .*: their \d+ calls", out)
    with (tmp_path / "t" / "calls.csv").open(encoding="utf-8") as handle:
        assert {row["tick"] for row in csv.DictReader(handle)} == {"3"}
    assert "no more replay" in README


def test_sweep_report_sorts_naturally_and_pools_each_setting(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    for path in sorted((world / "characters").glob("*.json")):
        edit(path, {"coins": len(path.stem)})
    runs = tmp_path / "runs"
    args = ["--world", str(world), "--seeds", "2,10,3", "--ticks", "1", "--out", str(runs)]
    code, out = sim("sweep", *args, "--set", "phase1.temperature=0.5,0.9")
    assert code == 0, out
    code, out = sim("sweep", "report", "--runs", str(runs), "--json")
    assert code == 0, out
    report = json.loads(out)
    assert [r["name"] for r in report["runs"]] == [
        f"seed-{seed}_phase1.temperature={t}" for seed in (2, 3, 10) for t in (0.5, 0.9)
    ]
    settings = {s["setting"]: s for s in report["settings"]}
    assert set(settings) == {"phase1.temperature=0.5", "phase1.temperature=0.9"}
    for name, row in settings.items():
        mine = [r for r in report["runs"] if r["name"].endswith(name)]
        calls = [r["calls"] for r in mine]
        assert row["runs"] == 3 and row["calls"]["n"] == 3
        assert row["calls"]["mean"] == pytest.approx(statistics.fmean(calls))
        assert row["calls"]["sd"] == pytest.approx(statistics.stdev(calls), abs=1e-6)
        assert row["coins"]["mean"] == pytest.approx(
            statistics.fmean(r["fields"]["coins"]["mean"] for r in mine)
        )
    code, text = sim("sweep", "report", "--runs", str(runs))
    assert "per setting, seeds pooled (mean ± sd over runs):" in text
    assert re.search(r"phase1\.temperature=0\.5\s+3\s+\d+ ± \d", text)


# -- 7. stale claims -------------------------------------------------------------------------


def test_world_format_names_the_required_world_json_fields_once_and_rightly() -> None:
    from sim.world import WorldMeta

    text = (REPO / "docs" / "world-format.md").read_text(encoding="utf-8")
    required = {name for name, f in WorldMeta.model_fields.items() if f.is_required()}
    tree_line = next(line for line in text.splitlines() if "├── world.json" in line)
    named = re.search(r"required: ([\w, ]+?)(?: \(|$)", tree_line)
    assert named is not None, tree_line
    assert {n.strip() for n in named.group(1).split(",")} == required
    table = text.split("## world.json", 1)[1].split("\n## ", 1)[0]
    in_table = set(re.findall(r"^\| `(\w+)`\s*\|[^|]*\|\s*\*required\*", table, re.M))
    assert in_table == required


def test_the_readme_states_the_measured_size_of_the_demo_venv() -> None:
    # measured: `python -m venv v && v/bin/pip install -e .` is 159 MB (issue 35)
    size = re.search(r"installs sim alone \(~(\d+) MB\)", README)
    assert size is not None and 140 <= int(size.group(1)) <= 180


def test_check_reports_a_broken_template_beside_the_worlds_problems(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    (world / "prompts").mkdir()
    (world / "prompts" / "intentions.md").write_text("{{ character.name \n")
    edit(world / "characters" / "bram.json", {"location": "nowhere"})
    code, out = sim("check", "--world", str(world))
    assert code == 2
    assert "2 problems" in out
    assert "bram.json: field 'state.location': unknown location 'nowhere'" in out
    assert "prompts/intentions.md:1: unexpected end of template" in out
    # with a config problem too: all three
    (world / "config.toml").write_text('[phase1]\ntemperature = "hot"\n')
    code, out = sim("check", "--world", str(world))
    assert code == 2 and "3 problems" in out and "prompts/intentions.md:1:" in out
