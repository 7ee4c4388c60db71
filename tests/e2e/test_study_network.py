"""The network as a study condition (issue 39): ``network = "ring"`` or an ``edges`` file
sets the relationships of a condition's arms before their first tick, drawn with the
arm's seed, so one world gives two densities (the ``edges`` table shows them); with the
message channel on, the ``messages`` table is exported per arm. A bad spec or edge file
is refused with exit 2 before anything runs."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli import main

STUDY = """\
world = "w"
seeds = "1-2"
ticks = 2
[conditions.sparse]
network = "ring"
[conditions.dense]
network = "random:0.9"
[conditions.listed]
edges = "ties.csv"
"""


def sim(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A world of 8 characters with no relationships, the message channel on."""
    monkeypatch.chdir(tmp_path)
    code, out = sim("init", "w", "--characters", "8", "--locations", "3")
    assert code == 0, out
    with (tmp_path / "w" / "config.toml").open("a") as handle:
        handle.write("\n[messages]\nenabled = true\n")
    (tmp_path / "ties.csv").write_text(
        "from,to,kind\nada,bram,family\nbram,ada,family\ncora,hal,\n"
    )
    (tmp_path / "study.toml").write_text(STUDY)
    return tmp_path


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_two_network_conditions_give_two_densities(here: Path) -> None:
    code, out = sim("study", "run", "study.toml", "--out", "runs")
    assert code == 0, out
    assert not (here / "runs" / "_shared").exists()  # the network differs from tick 1
    code, out = sim("export", "--study", "runs", "--out", "t")
    assert code == 0, out
    edges = rows(here / "t" / "edges.csv")
    per_run = Counter((r["condition"], r["seed"]) for r in edges if r["tick"] == "0")
    # a ring of 8: 8 ties, both ways; G(8, 0.9): far more
    assert per_run[("sparse", "1")] == per_run[("sparse", "2")] == 16
    assert per_run[("dense", "1")] > 30 and per_run[("dense", "2")] > 30
    listed = sorted(
        (r["from"], r["to"], r["kind"])
        for r in edges
        if r["condition"] == "listed" and r["seed"] == "1" and r["tick"] == "0"
    )
    assert listed == [
        ("ada", "bram", "family"),
        ("bram", "ada", "family"),
        ("cora", "hal", "acquaintance"),
        ("hal", "cora", "acquaintance"),
    ]
    # the random network is drawn with the arm's seed: the same seed, the same network
    code, out = sim("study", "run", "study.toml", "--out", "again")
    assert code == 0, out
    for run in ("dense/seed-1", "dense/seed-2"):
        for char in (here / "runs" / run / "characters").glob("*.json"):
            twin = here / "again" / run / "characters" / char.name
            assert char.read_bytes() == twin.read_bytes()
    # the message channel, per arm: condition, seed, run, tick, from, to, text
    messages = rows(here / "t" / "messages.csv")
    assert messages, "no message was sent"
    assert list(messages[0])[:7] == ["condition", "seed", "run", "tick", "from", "to", "text"]
    ties = {(r["condition"], r["seed"], r["tick"], r["from"], r["to"]) for r in edges}
    for m in messages:  # every message went along a tie of its own arm
        before = str(int(m["tick"]) - 1)
        assert (m["condition"], m["seed"], before, m["from"], m["to"]) in ties
    # and as a DataFrame (sim.analysis.load_study)
    pytest.importorskip("pandas")
    from sim.analysis import load_study

    frames = load_study(here / "runs")
    assert frames.messages is not None and len(frames.messages) == len(messages)


FACTOR_STUDY = """\
world = "w"
seeds = "1"
ticks = 2
[factors]
network = ["ring", "random:0.9"]
[conditions.control]
[conditions.announce]
inject = [{ tick = 2, everywhere = true, text = "The mill burned down." }]
"""


def test_the_network_factor_crosses_density_with_conditions(here: Path) -> None:
    """A 2 x 2: each unit (seed, network) shares its prefix between its arms, and the
    network column leads the tables like any factor."""
    (here / "factor.toml").write_text(FACTOR_STUDY)
    code, out = sim("study", "run", "factor.toml", "--out", "runs")
    assert code == 0, out
    shared = sorted(p.name for p in (here / "runs" / "_shared").iterdir())
    assert shared[0].startswith("seed-1_network=random-0.9") and shared[1] == "seed-1_network=ring"
    code, out = sim("export", "--study", "runs", "--out", "t")
    assert code == 0, out
    edges = rows(here / "t" / "edges.csv")
    per_arm = Counter((r["condition"], r["network"]) for r in edges if r["tick"] == "0")
    assert per_arm[("control", "ring")] == per_arm[("announce", "ring")] == 16
    assert per_arm[("control", "random:0.9")] == per_arm[("announce", "random:0.9")] > 30
    # the config of each run holds no "network" setting (it is no config key)
    configs = list((here / "runs").glob("*/*/config.toml"))
    assert len(configs) == 6  # 2 prefixes, 4 arms
    for config in configs:
        assert "network =" not in config.read_text()


@pytest.mark.parametrize(
    ("condition", "csv_text", "where"),
    [
        ('network = "random:2"', None, "conditions.bad.network"),
        ('network = "grid"', None, "conditions.bad.network"),
        ('network = "ring"\nedges = "e.csv"', None, "conditions.bad"),
        ('edges = "../e.csv"', None, "conditions.bad.edges"),
        ('edges = "missing.csv"', None, "conditions.bad.edges"),
        ('edges = "e.csv"', "from,to\nada,zed\n", "line 2, to"),
        ('edges = "e.csv"', "a,b\nada,bram\n", "line 1"),
        ('edges = "e.csv"', "from,to\nada,ada\n", "line 2"),
        ('edges = "e.csv"', "from,to,trust\nada,bram,2\n", "line 2, trust"),
        ('edges = "e.csv"', "from,to\nada\n", "line 2"),
        ('[factors]\nnetwork = ["ring", "mesh"]', None, "factors.network"),
        ('network = "star"\n[factors]\nnetwork = ["ring"]', None, "conditions.bad.network"),
    ],
)
def test_a_bad_network_is_refused_before_anything_runs(
    here: Path, condition: str, csv_text: str | None, where: str
) -> None:
    if csv_text is not None:
        (here / "e.csv").write_text(csv_text)
    (here / "bad.toml").write_text(f'world = "w"\nticks = 2\n[conditions.bad]\n{condition}\n')
    code, out = sim("study", "run", "bad.toml", "--out", "runs")
    assert code == 2, out
    assert where in out, out
    assert ("e.csv" if csv_text is not None else "bad.toml") in out
    assert not (here / "runs").exists()
