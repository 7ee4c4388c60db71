"""``sim study compare`` (issue 39): named tests between a study's arms and against real
data, each checked against scipy computed here on the same samples, the JSON shape, Holm's
correction by hand, and malformed reference files refused by file, line and column."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from sim.analysis.compare import adjust, cohen_d, compare_samples, read_reference
from sim.analysis.export import MissingExtra
from sim.cli import main
from sim.errors import InputError
from sim.storage import dump_json

stats = pytest.importorskip("scipy.stats")
np = pytest.importorskip("numpy")

STUDY = """\
world = "w"
seeds = "1-3"
ticks = 3
[conditions.control]
[conditions.announce]
set = [{ tick = 2, path = "ada.state.coins", value = 99 }]
[[surveys]]
ticks = [1, 3]
question = "Will you vote to rebuild the mill?"
format = "yesno"
[[surveys]]
ticks = [3]
question = "Who do you trust most?"
format = "character"
"""
ROW_KEYS = {
    "field", "tick", "a", "b", "test", "unit", "n_a", "n_b", "estimate", "estimate_of",
    "ci_low", "ci_high", "statistic", "p_value", "p_adjusted", "effect", "effect_size", "note",
}  # fmt: skip


def sim(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A study of two conditions x 3 seeds, run once for the module (offline)."""
    here = tmp_path_factory.mktemp("compare")
    code, output = sim("init", str(here / "w"))
    assert code == 0, output
    for i, path in enumerate(sorted((here / "w" / "characters").glob("*.json"))):
        data = orjson.loads(path.read_bytes())
        data["state"]["coins"] = 5 + i
        path.write_bytes(dump_json(data))
    (here / "study.toml").write_text(STUDY)
    code, output = sim(
        "study", "run", str(here / "study.toml"), "--out", str(here / "out"), "--jobs", "2"
    )
    assert code == 0, output
    code, output = sim(
        "export", "--study", str(here / "out"), "--out", str(here / "tables"), "--format", "jsonl"
    )
    assert code == 0, output
    return here


def _rows(here: Path, table: str) -> list[dict[str, object]]:
    return [
        orjson.loads(line)
        for line in (here / "tables" / f"{table}.jsonl").read_bytes().splitlines()
    ]


def test_welch_between_arms_is_scipys_on_the_run_means(study: Path) -> None:
    code, output = sim("study", "compare", str(study / "out"), "--field", "coins", "--json")
    assert code == 0, output
    result = orjson.loads(output)
    assert result["correction"] == "holm"
    rows = result["comparisons"]
    assert all(set(r) == ROW_KEYS for r in rows)
    assert [r["tick"] for r in rows] == [0, 1, 2, 3]  # every tick the field holds
    characters = _rows(study, "characters")
    for row in rows:
        assert (row["a"], row["b"], row["test"], row["unit"]) == (
            "control",
            "announce",
            "welch",
            "run",
        )
        means = {
            cond: [
                statistics.fmean(
                    r["state.coins"]  # type: ignore[misc]
                    for r in characters
                    if (r["condition"], r["seed"], r["tick"]) == (cond, seed, row["tick"])
                )
                for seed in (1, 2, 3)
            ]
            for cond in ("control", "announce")
        }
        assert row["n_a"] == row["n_b"] == 3
        assert row["estimate"] == pytest.approx(
            statistics.fmean(means["announce"]) - statistics.fmean(means["control"])
        )
        if row["tick"] == 0:  # before anything ran: the same, so no test
            assert row["estimate"] == 0 and row["p_value"] is None and "constant" in row["note"]
        if row["tick"] == 3:  # ada's 99 coins: the arms differ
            assert means["announce"] != means["control"]
        if means["announce"] != means["control"]:
            expected = stats.ttest_ind(means["announce"], means["control"], equal_var=False)
            # offline, every seed's arm holds the same coins: t is infinite (JSON null), p 0
            finite = expected.statistic if np.isfinite(expected.statistic) else None
            assert row["statistic"] == pytest.approx(finite)
            assert row["p_value"] == pytest.approx(expected.pvalue)
            assert row["ci_low"] <= row["estimate"] <= row["ci_high"]
            # no spread within an arm: no Cohen's d
            assert row["effect_size"] == "cohen_d" and (row["effect"] or 1) > 0
    # Holm over the comparisons that have a p value
    ps = [r["p_value"] for r in rows]
    assert [r["p_adjusted"] for r in rows] == pytest.approx(adjust(ps, "holm"))  # type: ignore[arg-type]
    # seeded: the same command gives the same bytes
    assert sim("study", "compare", str(study / "out"), "--field", "coins", "--json")[1] == output

    code, text = sim("study", "compare", str(study / "out"), "--field", "coins", "--tick", "3")
    assert code == 0 and "announce vs control" in text and "welch" in text and "Holm" in text


def test_chi2_on_a_character_survey_is_scipys(study: Path) -> None:
    code, output = sim("study", "compare", str(study / "out"), "--field", "survey:2", "--json")
    assert code == 0, output
    (row,) = orjson.loads(output)["comparisons"]
    assert (row["test"], row["unit"], row["tick"], row["effect_size"]) == (
        "chi2",
        "answer",
        3,
        "cramer_v",
    )
    answers = [r for r in _rows(study, "surveys") if r["question"] == "Who do you trust most?"]
    by = {
        c: [str(r["answer"]).casefold() for r in answers if r["condition"] == c]
        for c in ("control", "announce")
    }
    assert (row["n_a"], row["n_b"]) == (len(by["control"]), len(by["announce"])) == (9, 9)
    levels = sorted(set(by["control"]) | set(by["announce"]))
    table = np.array([[by[c].count(level) for level in levels] for c in ("announce", "control")])
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] > 1:
        expected = stats.chi2_contingency(table)
        assert row["statistic"] == pytest.approx(expected.statistic)
        assert row["p_value"] == pytest.approx(expected.pvalue)
        assert row["estimate"] == pytest.approx(stats.contingency.association(table))
    else:
        assert row["p_value"] is None and "one category" in row["note"]


def test_known_samples(tmp_path: Path) -> None:
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0], [3.0, 4.0, 5.0, 6.0, 9.0]
    for test, scipy_test in (
        ("welch", lambda: stats.ttest_ind(b, a, equal_var=False)),
        ("mannwhitney", lambda: stats.mannwhitneyu(b, a, alternative="two-sided")),
        ("ks", lambda: stats.ks_2samp(b, a)),
    ):
        c = compare_samples("x", 1, ("a", "b"), (a, b), None, test, "answer")  # type: ignore[arg-type]
        expected = scipy_test()
        assert c.test == test and c.estimate == pytest.approx(2.4)
        assert c.statistic == pytest.approx(expected.statistic)
        assert c.p_value == pytest.approx(expected.pvalue)
        assert c.ci_low is not None and c.ci_high is not None and c.ci_low < 2.4 < c.ci_high
        boot = stats.bootstrap(
            (np.array(b), np.array(a)),
            lambda x, y, axis=-1: np.mean(x, axis=axis) - np.mean(y, axis=axis),
            n_resamples=9999,
            rng=np.random.default_rng(0),
        )
        assert (c.ci_low, c.ci_high) == pytest.approx(
            (boot.confidence_interval.low, boot.confidence_interval.high)
        )
    # Cohen's d by hand: both variances 2.5 and 5.3 -> pooled 3.9
    assert cohen_d(a, b) == pytest.approx(2.4 / 3.9**0.5)
    # yes/no as 1/0, auto -> welch; as categories, chi2 of the 2 x 2 table
    yes_a, yes_b = ["no"] * 8 + ["yes"] * 2, ["yes"] * 7 + ["no"] * 3
    c = compare_samples("q", 2, ("a", "b"), (yes_a, yes_b), None, "auto", "answer")
    assert c.test == "welch" and c.estimate == pytest.approx(0.5)
    c = compare_samples("q", 2, ("a", "b"), (yes_a, yes_b), None, "chi2", "answer")
    table = np.array([[3, 7], [8, 2]])  # rows b, a; columns no, yes
    assert c.statistic == pytest.approx(stats.chi2_contingency(table).statistic)
    assert c.estimate == pytest.approx(stats.contingency.association(table))
    # Holm by hand: 0.01*3, max(0.03*2, 0.03), max(0.04, 0.06); None is not counted
    assert adjust([0.04, None, 0.01, 0.03], "holm") == pytest.approx([0.06, None, 0.03, 0.06])
    assert adjust([0.04, 0.01, 0.03], "bh") == pytest.approx(
        list(stats.false_discovery_control([0.04, 0.01, 0.03]))
    )
    with pytest.raises(InputError, match="chi2"):
        compare_samples("m", 1, ("a", "b"), (["calm", "angry"], ["calm"] * 2), None, "welch", "run")


def test_a_reference_of_real_answers(study: Path, tmp_path: Path) -> None:
    ref = tmp_path / "people.csv"
    people = ["yes"] * 7 + ["no"] * 5
    ref.write_text("field,tick,value\n" + "".join(f"survey:1,3,{a}\n" for a in people))
    code, output = sim("study", "compare", str(study / "out"), "--reference", str(ref), "--json")
    assert code == 0, output
    rows = orjson.loads(output)["comparisons"]
    assert [(r["a"], r["b"], r["tick"], r["unit"]) for r in rows] == [
        ("reference", "control", 3, "answer"),
        ("reference", "announce", 3, "answer"),
    ]
    answers = _rows(study, "surveys")
    for row in rows:
        sim_yes = [
            1.0 if r["answer"] == "yes" else 0.0
            for r in answers
            if r["condition"] == row["b"] and r["tick"] == 3 and r["question"].startswith("Will")  # type: ignore[union-attr]
        ]
        real = [1.0 if a == "yes" else 0.0 for a in people]
        assert (row["n_a"], row["n_b"]) == (12, len(sim_yes)) == (12, 9)
        assert row["estimate"] == pytest.approx(statistics.fmean(sim_yes) - statistics.fmean(real))
        expected = stats.ttest_ind(sim_yes, real, equal_var=False)
        if np.isfinite(expected.pvalue):
            assert row["p_value"] == pytest.approx(expected.pvalue)
    assert [r["p_adjusted"] for r in rows] == pytest.approx(
        adjust([r["p_value"] for r in rows], "holm")
    )


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("field,tick,value\nsurvey:1,3\n", "line 2"),
        ("survey:1,three,yes\n", "line 1, column 2 (tick)"),
        ("survey:1,3,yes\n,3,no\n", "line 2, column 1 (field)"),
        ("survey:1,3,yes\nsurvey:1,3,\n", "line 2, column 3 (value)"),
        ("survey:1,3,yes\nnope,3,no\n", "line 2, column 1 (field)"),
        ("survey:1,3,yes\nsurvey:1,2,no\n", "line 2, column 2 (tick)"),
        ('survey:1,3,"yes\n', "line"),
        ("", "no rows"),
    ],
)
def test_a_malformed_reference_names_file_line_and_column(
    study: Path, tmp_path: Path, text: str, where: str
) -> None:
    ref = tmp_path / "bad.csv"
    ref.write_text(text)
    code, output = sim("study", "compare", str(study / "out"), "--reference", str(ref))
    assert code == 2, output
    assert str(ref) in output and where in output and "Traceback" not in output
    code, output = sim("study", "compare", str(study / "out"), "--reference", str(ref), "--json")
    assert code == 2 and orjson.loads(output.strip().splitlines()[-1])["ok"] is False


def test_reference_reader_and_bad_bytes(tmp_path: Path) -> None:
    ref = tmp_path / "r.csv"
    ref.write_bytes(b"\xef\xbb\xbfsurvey,0, yes \n\nsurvey,1,no\n")
    assert [(r.field, r.tick, r.value, r.line) for r in read_reference(ref)] == [
        ("survey", 0, "yes", 1),
        ("survey", 1, "no", 3),
    ]
    ref.write_bytes(b"survey,0,yes\nsurvey,1,\xff\n")
    with pytest.raises(InputError, match=r"line 2.*not UTF-8"):
        read_reference(ref)
    with pytest.raises(InputError, match="cannot read"):
        read_reference(tmp_path / "missing.csv")


def test_wrong_test_and_missing_scipy(study: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, output = sim(
        "study", "compare", str(study / "out"), "--field", "survey:2", "--test", "ks"
    )
    assert code == 2 and "--test chi2" in output
    code, output = sim("study", "compare", str(study / "out"), "--field", "nope")
    assert code == 2 and "no state field" in output
    monkeypatch.setitem(sys.modules, "scipy.stats", None)
    code, output = sim("study", "compare", str(study / "out"))
    assert code == 2 and "scipy" in output and "sim[analysis]" in output
    with pytest.raises(MissingExtra):
        compare_samples("x", 1, ("a", "b"), ([1.0, 2.0], [3.0, 4.0]), None, "welch", "run")


def _svg_text(path: Path) -> str:
    from xml.etree import ElementTree

    root = ElementTree.parse(path).getroot()  # parses, or raises
    return " ".join(t for t in root.itertext() if t.strip())


def test_figures_are_written_as_svg_and_png(study: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    figures = tmp_path / "figs"
    code, output = sim(
        "study",
        "report",
        str(study / "out"),
        "--field",
        "coins",
        "--figures",
        str(figures),
        "--json",
    )
    assert code == 0, output
    written = orjson.loads(output)["figures"]
    assert sorted(Path(p).name for p in written) == sorted(
        f"{n}.{f}" for n in ("means", "differences", "panels") for f in ("svg", "png")
    )
    for name in ("means", "differences", "panels"):
        assert (figures / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        text = _svg_text(figures / f"{name}.svg")
        assert "tick" in text and "coins" in text  # the axis titles
        assert "announce" in text and "control" in text  # the legend, every condition
        assert "seeds: 1, 2, 3" in text and "provider: offline" in text  # the design
        assert "announce: set ada.state.coins (tick 2)" in text  # the intervention, marked
        assert "dotted: the tick whose inputs hold an intervention" in text
    assert "difference from control" in _svg_text(figures / "differences.svg")
    first = {p.name: p.read_bytes() for p in figures.iterdir()}
    code, _ = sim(
        "study", "report", str(study / "out"), "--field", "coins", "--figures", str(figures)
    )
    assert code == 0 and {p.name: p.read_bytes() for p in figures.iterdir()} == first
    # the design, printed on the text report too
    code, output = sim("study", "report", str(study / "out"))
    assert code == 0 and "seeds: 1, 2, 3; ticks: 3" in output and "intervention: announce" in output
    # a file where the folder should be
    (tmp_path / "file").write_text("x")
    code, output = sim("study", "report", str(study / "out"), "--figures", str(tmp_path / "file"))
    assert code == 2 and "Traceback" not in output


def test_every_cell_of_a_two_by_two_on_one_page(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from sim.analysis.figures import write_figures
    from sim.analysis.studyreport import DesignSummary, Intervention, StudyReport, estimate

    conditions = ("control", "announce")
    values = {
        (cond, f"seed-{seed}_density={d}", tick): tick * (0.1 if cond == "control" else 0.2)
        + seed / 100
        + d
        for cond in conditions
        for d in (0.1, 0.5)
        for seed in (1, 2)
        for tick in (1, 2, 3)
    }
    report = StudyReport(
        "survey: heard of it?",
        "answer (numbers; yes/true = 1, no/false = 0)",
        "control",
        {
            c: [
                estimate(t, [v for (cc, _, tt), v in values.items() if cc == c and tt == t])
                for t in (1, 2, 3)
            ]
            for c in conditions
        },
        {"announce": [estimate(t, [0.1 * t] * 4) for t in (1, 2, 3)]},
        design=DesignSummary(
            list(conditions),
            [Intervention("announce", 2, "inject", "everywhere")],
            [1, 2],
            {"density": [0.1, 0.5]},
            3,
            1,
            8,
            ["offline"],
            ["m"],
        ),
        run_values=values,
        run_factors={run: (("density", float(run.rpartition("=")[2])),) for (_, run, _) in values},
    )
    write_figures(report, tmp_path)
    from xml.etree import ElementTree

    root = ElementTree.parse(tmp_path / "panels.svg").getroot()
    pieces = [t.strip() for t in root.itertext() if t.strip()]
    # one panel per cell: its title is the condition over the factor's value
    for cond in conditions:
        for d in (0.1, 0.5):
            assert [cond, f"density = {d}"] in [pieces[i : i + 2] for i in range(len(pieces))]
    text = " ".join(pieces)
    assert "share answering yes" in text and "announce: inject everywhere (tick 2)" in text


def test_four_conditions_without_factors_make_a_two_by_two_page(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from sim.analysis.figures import write_figures
    from sim.analysis.studyreport import StudyReport, estimate

    conditions = ("control", "sparse", "dense", "dense-announce")
    values = {
        (c, f"seed-{s}", t): i * 0.1 + t * 0.01 + s * 0.001
        for i, c in enumerate(conditions)
        for s in (1, 2)
        for t in (1, 2, 3)
    }
    report = StudyReport(
        "coins",
        "field (numbers; yes/true = 1, no/false = 0)",
        "control",
        {
            c: [
                estimate(t, [v for (cc, _, tt), v in values.items() if (cc, tt) == (c, t)])
                for t in (1, 2, 3)
            ]
            for c in conditions
        },
        {},
        run_values=values,
        run_factors={f"seed-{s}": () for s in (1, 2)},
    )
    paths = write_figures(report, tmp_path / "new" / "figs")
    assert [p.name for p in paths] == ["means.svg", "means.png", "panels.svg", "panels.png"]
    text = _svg_text(tmp_path / "new" / "figs" / "panels.svg")
    assert all(c in text for c in conditions) and "mean coins" in text
    assert "dotted" not in text  # no intervention, so no key to one
    assert "1.5" not in text and "2.5" not in text  # whole ticks on the axis


def test_a_share_between_arms_matches_the_report(study: Path) -> None:
    """FIELD=VALUE between arms: the runs' shares, coded once (they were coded twice, so
    every estimate was 0): ada's 99 coins in the announce arm are a third of its characters."""
    code, output = sim("study", "report", str(study / "out"), "--field", "coins=99", "--json")
    assert code == 0, output
    report = orjson.loads(output)["conditions"]
    code, output = sim("study", "compare", str(study / "out"), "--field", "coins=99", "--json")
    assert code == 0, output
    rows = orjson.loads(output)["comparisons"]
    assert rows and all(r["field"] == "coins = 99" for r in rows)
    means = {c: {e["tick"]: e["mean"] for e in es} for c, es in report.items()}
    for row in rows:
        expected = means["announce"][row["tick"]] - means["control"][row["tick"]]
        assert row["estimate"] == pytest.approx(expected, abs=1e-6)
    assert rows[-1]["estimate"] == pytest.approx(1 / 3, abs=1e-6)
