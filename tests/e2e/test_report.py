"""`sim report`: the HTML page of a world's history, its content, escaping and a real browser."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import copy_demo

from sim.analysis.report import collect, embed_json
from sim.cli import main
from sim.config import load_config
from sim.engine.runner import Runner
from sim.testing.logs import plain_log
from sim.ticklog.format import list_logs, log_path, summary_rel
from sim.ticklog.reader import read_log
from sim.ticklog.summary import dump_summary, read_summary

HOSTILE = "<script>alert(1)</script>"
DATA_RE = re.compile(r'<script type="application/json" id="report-data">(.*?)</script>', re.DOTALL)
EXTERNAL_RE = re.compile(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)


def run(world: Path, ticks: int) -> None:
    Runner(world, load_config(world_dir=world, cwd=world)).run(ticks)


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


SIDE_RE = re.compile(
    r'^simReport(?:Tick\("([0-9a-f]{16})", (\d+), |Memory\("([0-9a-f]{16})", )(.*)\);\n$',
    re.DOTALL,
)


def side_file(path: Path) -> tuple[str, int | None, object]:
    """A detail file's token, tick (``None``: the memory file) and data."""
    match = SIDE_RE.match(path.read_text(encoding="utf-8"))
    assert match, path
    token = match.group(1) or match.group(3)
    tick = int(match.group(2)) if match.group(2) else None
    return token, tick, orjson.loads(match.group(4))


def page_data(page: str) -> dict:
    match = DATA_RE.search(page)
    assert match, "no data block"
    return orjson.loads(match.group(1))


@pytest.fixture(scope="module")
def five_ticks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo world after 5 offline ticks (shared read-only: copy before changing it)."""
    world = copy_demo(tmp_path_factory.mktemp("report") / "demo")
    run(world, 5)
    return world


@pytest.fixture(scope="module")
def hostile_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo world with a character named like a script tag and a `</script>` narrative."""
    world = copy_demo(tmp_path_factory.mktemp("hostile") / "demo")
    path = world / "characters" / "ada.json"
    ada = orjson.loads(path.read_bytes())
    ada["identity"]["name"] = HOSTILE
    path.write_bytes(orjson.dumps(ada, option=orjson.OPT_INDENT_2))
    path = world / "locations" / "quay.json"
    quay = orjson.loads(path.read_bytes())
    quay["identity"]["name"] = "Quay </script><img src=x onerror=alert(2)> & \u2028 end"
    path.write_bytes(orjson.dumps(quay, option=orjson.OPT_INDENT_2))
    run(world, 3)
    return world


def test_report_of_five_ticks_shows_ticks_names_narratives(five_ticks: Path, tmp_path: Path):
    out = tmp_path / "r.html"
    result = invoke("report", "--world", str(five_ticks), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {out} (5 ticks)" in result.output
    page = out.read_text(encoding="utf-8")
    data = page_data(page)
    assert [t["t"] for t in data["ticks"]] == [1, 2, 3, 4, 5]
    assert data["world"] == "Saltglass Isle: The Lantern Tide"
    assert "<title>Saltglass Isle: The Lantern Tide — sim report</title>" in page
    names = {c["name"] for c in data["chars"]}
    assert {"Ada Strand", "Pell Dunmore", "Brother Elm"} <= names and len(names) == 10
    assert len(data["locs"]) == 9 and data["edges"]
    for tick in data["ticks"]:
        log = read_log(log_path(five_ticks, tick["t"]))
        narratives = log.phase_results("narrative")
        assert narratives
        assert {data["locs"][s["l"]]["id"]: s["n"] for s in tick["scenes"]} == narratives
        rows = [row for scene in tick["scenes"] for row in scene["r"]]
        assert len(rows) == 10  # every character: an intention and an outcome
        assert all(row[1] and row[4] for row in rows)
        assert tick["calls"] == len(log.calls) and tick["tokens"] > 0
        assert tick["cost"] == 0.0  # the offline provider is priced at zero
        assert len(tick["at"]) == 10
    assert any(t["moves"] for t in data["ticks"])
    for char in data["chars"]:
        assert char["tokens"] > 0 and char["calls"] >= 5
    assert any(len(c["memory"]) > 1 for c in data["chars"])  # summaries evolved
    assert not EXTERNAL_RE.search(page)
    assert "<link" not in page and "@import" not in page


def test_default_out_is_report_html_in_the_world(five_ticks: Path, tmp_path: Path):
    world = tmp_path / "w"
    shutil.copytree(five_ticks, world)
    result = invoke("report", "--world", str(world))
    assert result.exit_code == 0, result.output
    assert (world / "report.html").is_file()


def test_from_to_limits_the_ticks(five_ticks: Path, tmp_path: Path):
    out = tmp_path / "r.html"
    result = invoke(
        "report", "--world", str(five_ticks), "--out", str(out), "--from", "2", "--to", "4"
    )
    assert result.exit_code == 0, result.output
    assert [t["t"] for t in page_data(out.read_text())["ticks"]] == [2, 3, 4]
    result = invoke("report", "--world", str(five_ticks), "--out", str(out), "--from", "9")
    assert result.exit_code == 0 and "no ticks in that range" in result.output
    data = page_data(out.read_text())
    assert data["ticks"] == [] and data["logged"] == 5
    result = CliRunner().invoke(
        main, ["report", "--world", str(five_ticks), "--from", "4", "--to", "2"]
    )
    assert result.exit_code == 2


def test_a_world_without_logs_gets_a_page_that_says_so(demo_world: Path, tmp_path: Path):
    out = tmp_path / "r.html"
    result = invoke("report", "--world", str(demo_world), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "no tick logs yet" in result.output
    page = out.read_text()
    assert "No tick logs yet" in page
    data = page_data(page)
    assert data["ticks"] == [] and len(data["chars"]) == 10


def test_a_missing_world_is_bad_input(tmp_path: Path):
    result = CliRunner().invoke(main, ["report", "--world", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "world folder not found" in result.output


def test_an_unreadable_log_is_reported_and_the_page_still_written(five_ticks: Path, tmp_path: Path):
    world = tmp_path / "w"
    shutil.copytree(five_ticks, world)
    plain_log(world, 3).write_text("not json\n")
    result = CliRunner().invoke(main, ["report", "--world", str(world)])
    assert result.exit_code == 1
    assert "unreadable" in result.output and "tick-000003" in result.output
    data = page_data((world / "report.html").read_text())
    assert [t["t"] for t in data["ticks"]] == [1, 2, 4, 5]
    assert data["problems"]


def test_hostile_names_and_narratives_are_escaped(hostile_world: Path, tmp_path: Path):
    out = tmp_path / "r.html"
    assert invoke("report", "--world", str(hostile_world), "--out", str(out)).exit_code == 0
    page = out.read_text(encoding="utf-8")
    data = page_data(page)
    narratives = [s["n"] for t in data["ticks"] for s in t["scenes"]]
    assert any("</script>" in n for n in narratives)  # the data still holds the real text
    assert HOSTILE in {c["name"] for c in data["chars"]}
    assert HOSTILE not in page
    assert "<img" not in page and "\u2028" not in page
    assert page.count("</script>") == 2  # the data block's and the script's own
    assert page.count("<script") == 2


def test_embed_json_round_trips_and_hides_markup():
    value = {"a": "</script><!-- & \u2028\u2029 >", "<k>": [1, None]}
    text = embed_json(value)
    assert not set(text) & {"<", ">", "&", "\u2028", "\u2029"}
    assert orjson.loads(text) == value


# -- in a real browser ------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(tmp_path: Path, url: str, *args: str) -> str:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--run-all-compositor-stages-before-draw",
        "--window-size=1300,1000",
        *args,
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (Debian: apt-get install chromium); .ci/run installs it",
)
def test_the_page_steps_through_ticks_in_headless_chromium(hostile_world: Path, tmp_path: Path):
    out = tmp_path / "report.html"
    assert invoke("report", "--world", str(hostile_world), "--out", str(out)).exit_code == 0
    url = out.resolve().as_uri()
    shots = []
    for tick in (1, 3):
        shot = tmp_path / f"tick-{tick}.png"
        chromium(tmp_path, f"{url}#tick={tick}", f"--screenshot={shot}")
        assert shot.stat().st_size > 10_000
        shots.append(shot.read_bytes())
        dom = chromium(tmp_path, f"{url}#tick={tick}", "--dump-dom")
        label = re.search(r'id="tick-label"[^>]*>([^<]*)<', dom)
        assert label and label.group(1) == f"Tick {tick} of 1–3", label
        assert f'aria-valuetext="Tick {tick} of 1–3"' in dom  # the slider moved there
        assert f"<h2>Tick {tick}" in dom
        # the hostile name is text in the page, never an element
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
        assert HOSTILE not in dom and "<img" not in dom
    assert shots[0] != shots[1]  # the map and the tick shown changed


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_a_ticks_detail_appears_when_it_is_selected_in_headless_chromium(
    hostile_world: Path, tmp_path: Path
):
    """The page in the world, opened from disk: the tick picked by the URL loads its
    scenes from its side file (escaped like the rest), and a missing file says so."""
    world = tmp_path / "w"
    shutil.copytree(hostile_world, world)
    assert invoke("report", "--world", str(world)).exit_code == 0
    url = (world / "report.html").resolve().as_uri()
    narrative = read_log(log_path(world, 2)).phase_results("narrative")
    budget = "--virtual-time-budget=5000"  # the page's side file loads after the page
    dom = chromium(tmp_path, f"{url}#tick=2", budget, "--dump-dom")
    assert "<h2>Tick 2" in dom and 'class="scene"' in dom
    shown = re.findall(r'<p class="narrative">([^<]*)</p>', dom)
    assert shown and all(html.unescape(text) in narrative.values() for text in shown)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom  # in the scenes' rows too
    assert HOSTILE not in dom and "<img" not in dom
    (world / "report-ticks" / "tick-000003.js").unlink()
    dom = chromium(tmp_path, f"{url}#tick=3", budget, "--dump-dom")
    assert "<h2>Tick 3" in dom and 'class="scene"' not in dom
    assert "scenes are not available" in dom


def test_failures_fallbacks_and_prices_come_from_the_log(five_ticks: Path, tmp_path: Path):
    """Tick 2's log is edited as if a narrative call had failed and the model was priced
    (its header's ``[prices]``): the page prices every attempt at the tick's own prices."""
    world = tmp_path / "w"
    shutil.copytree(five_ticks, world)
    path = plain_log(world, 2)
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    price = {"input": 1.0, "cached_input": 0.5, "output": 4.0}  # $ per million tokens

    def cost(call: dict) -> float:
        total = 0.0
        for attempt in call["attempts"]:
            u = attempt["usage"]
            cached = u["cached_input_tokens"]
            total += (u["input_tokens"] - cached) * 1.0 + cached * 0.5 + u["output_tokens"] * 4.0
        return total / 1_000_000

    expected = {"tick": 0.0, "ada": 0.0}
    for record in records:
        if record["type"] == "header":
            record["config"]["prices"]["offline"] = price
        elif record["type"] == "call":
            expected["tick"] += cost(record)
            if record["entity_key"].endswith(":ada"):
                expected["ada"] += cost(record)
            if record["entity_key"] == "narrative:quay":
                record["error_code"], record["error"] = "timeout", "took too long"
        elif record["type"] == "phase" and record["name"] == "narrative":
            record["report"]["fallbacks"] = ["narrative:quay"]
            record["report"]["errors"] = {"narrative:quay": "timeout: took too long"}
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    out = tmp_path / "r.html"
    assert invoke("report", "--world", str(world), "--out", str(out)).exit_code == 0
    data = page_data(out.read_text())
    tick = data["ticks"][1]
    assert expected["tick"] > 0 and expected["ada"] > 0
    assert tick["failures"] == 1 and tick["cost"] == pytest.approx(expected["tick"])
    assert tick["fallbacks"] == ["narrative narrative:quay: timeout: took too long"]
    assert data["ticks"][0]["cost"] == 0.0 and data["ticks"][0]["fallbacks"] == []
    ada = next(c for c in data["chars"] if c["id"] == "ada")
    assert ada["cost"] == pytest.approx(expected["ada"])  # her calls in tick 2, every attempt


def test_a_character_whose_calls_used_an_unpriced_model_has_unknown_cost(
    five_ticks: Path, tmp_path: Path
):
    """Unknown stays unknown: the page never sums a known part and shows it as the cost."""
    world = tmp_path / "w"
    shutil.copytree(five_ticks, world)
    path = plain_log(world, 3)
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    for record in records:
        if record["type"] == "call" and record["entity_key"] == "intention:ada":
            for attempt in record["attempts"]:
                attempt["model"] = "a-model-without-a-price"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    out = tmp_path / "r.html"
    assert invoke("report", "--world", str(world), "--out", str(out)).exit_code == 0
    data = page_data(out.read_text())
    ada = next(c for c in data["chars"] if c["id"] == "ada")
    bram = next(c for c in data["chars"] if c["id"] == "bram")
    assert ada["cost"] is None and bram["cost"] == 0.0
    assert data["ticks"][2]["cost"] is None and data["ticks"][1]["cost"] == 0.0


def test_a_broken_world_file_still_gets_a_report_of_its_logs(five_ticks: Path, tmp_path: Path):
    world = tmp_path / "w"
    shutil.copytree(five_ticks, world)
    (world / "characters" / "ada.json").write_text("{not json")
    out = tmp_path / "r.html"
    assert invoke("report", "--world", str(world), "--out", str(out)).exit_code == 0
    data = page_data(out.read_text())
    assert [t["t"] for t in data["ticks"]] == [1, 2, 3, 4, 5]
    assert "Ada Strand" in {c["name"] for c in data["chars"]}  # from the logged states


# -- tick detail in side files ----------------------------------------------------------------


def test_a_page_in_the_world_loads_tick_detail_from_side_files(five_ticks: Path, tmp_path: Path):
    """The default page keeps each tick's scenes (and the memory summaries) in
    ``report-ticks/`` beside it, escaped, tied to the page by a token; a detail file of a
    tick no longer shown goes, other files stay."""
    world = tmp_path / "w"
    shutil.copytree(five_ticks, world)
    folder = world / "report-ticks"
    folder.mkdir()
    (folder / "tick-000099.js").write_text("stale")
    (folder / "notes.txt").write_text("mine")
    result = invoke("report", "--world", str(world))
    assert result.exit_code == 0
    assert f"(5 ticks; each tick's scenes in {world / 'report-ticks'}/" in result.output
    data = page_data((world / "report.html").read_text(encoding="utf-8"))
    full = collect(world)
    assert data["detail"]["dir"] == "report-ticks"
    token = data["detail"]["token"]
    assert all("scenes" not in t and t["d"] == 1 for t in data["ticks"])
    assert all("memory" not in c for c in data["chars"])
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["memory.js", "notes.txt", *(f"tick-{n:06d}.js" for n in range(1, 6))]
    for tick in full["ticks"]:
        got_token, number, detail = side_file(folder / f"tick-{tick['t']:06d}.js")
        assert (got_token, number) == (token, tick["t"])
        assert detail == {"scenes": tick["scenes"], "phases": tick["phases"]}
    got_token, number, memory = side_file(folder / "memory.js")
    assert got_token == token and number is None
    assert memory == [c["memory"] for c in full["chars"]]


def test_side_files_escape_hostile_text(hostile_world: Path, tmp_path: Path):
    world = tmp_path / "w"
    shutil.copytree(hostile_world, world)
    assert invoke("report", "--world", str(world)).exit_code == 0
    texts = [p.read_text(encoding="utf-8") for p in (world / "report-ticks").iterdir()]
    assert len(texts) == 4
    for text in texts:
        assert not set(text) & {"<", ">", "&", "\u2028", "\u2029"}
    details = [side_file(p)[2] for p in sorted((world / "report-ticks").glob("tick-*.js"))]
    narratives = [s["n"] for d in details for s in d["scenes"]]  # type: ignore[index]
    assert any("</script>" in n for n in narratives)  # the real text, once parsed


def test_a_page_outside_the_world_is_self_contained(five_ticks: Path, tmp_path: Path):
    out = tmp_path / "elsewhere" / "r.html"
    assert invoke("report", "--world", str(five_ticks), "--out", str(out)).exit_code == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["r.html"]
    assert not (five_ticks / "r-ticks").exists()
    data = page_data(out.read_text(encoding="utf-8"))
    assert "detail" not in data and all(t["scenes"] for t in data["ticks"])


def test_a_side_folder_that_is_a_link_out_of_the_world_is_refused(five_ticks: Path, tmp_path: Path):
    world = tmp_path / "w"
    shutil.copytree(five_ticks, world)
    outside = tmp_path / "outside"
    outside.mkdir()
    (world / "report-ticks").symlink_to(outside)
    result = CliRunner().invoke(main, ["report", "--world", str(world)])
    assert result.exit_code == 2, result.output
    assert "report-ticks" in result.output and "symlink" in result.output
    assert list(outside.iterdir()) == [] and not (world / "report.html").exists()


def test_old_summaries_without_places_give_the_same_report(five_ticks: Path, tmp_path: Path):
    """Summaries written before places were: characters are placed from the logs'
    snapshots instead, and the report is the same."""
    world = tmp_path / "w"
    shutil.copytree(five_ticks, world)
    with_places = collect(world)
    for tick, _ in list_logs(world):
        file = world / summary_rel(tick)
        summary = read_summary(file, places=True)
        assert summary.places is not None
        file.write_bytes(dump_summary(type(summary)(summary.head, summary.groups)))
    assert read_summary(world / summary_rel(1), places=True).places is None
    assert collect(world) == with_places
    assert any(t["moves"] for t in with_places["ticks"])


def test_the_page_stays_small_on_a_generated_history(tmp_path: Path):
    """A generated world of 120 characters over 4 ticks: the page in the world holds the
    numbers and places only, the scenes are in side files."""
    from bench.make_world import make_world

    world = tmp_path / "big"
    make_world(world, 120, 12, seed=3)
    run(world, 4)
    assert invoke("report", "--world", str(world)).exit_code == 0
    page = (world / "report.html").stat().st_size
    inline = tmp_path / "inline.html"
    assert invoke("report", "--world", str(world), "--out", str(inline)).exit_code == 0
    side = sum(p.stat().st_size for p in (world / "report-ticks").iterdir())
    # the places and moves of 120 characters over 4 ticks, their names, ids and numbers,
    # and the page's own code (~35 KB)
    assert page < 36_000 + 120 * 4 * 30 + 120 * 120, page
    assert page * 4 < inline.stat().st_size and side > inline.stat().st_size * 0.8


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_the_page_opens_at_the_latest_tick_with_labelled_distinct_dots_and_axes(
    five_ticks: Path, tmp_path: Path
):
    """What a new user saw was missing: the page opened at tick 1, the map's dots had no
    names, two of the demo's characters shared a hue, and the chart had no y values."""
    out = tmp_path / "r.html"
    assert invoke("report", "--world", str(five_ticks), "--out", str(out)).exit_code == 0
    dom = chromium(tmp_path, out.resolve().as_uri(), "--dump-dom")
    label = re.search(r'id="tick-label"[^>]*>([^<]*)<', dom)
    assert label and label.group(1) == "Tick 5 of 1–5"
    # every character on the map has its name beside its dot, in its dot's colour
    names = {html.unescape(n) for n in re.findall(r'class="dotlabel[^"]*"[^>]*>([^<]*)<', dom)}
    assert names == {
        "Ada Strand", "Bram Hollis", "Brother Elm", "Corin Penhallow", "Isolde Marr",
        "Nessa Quill", "Orla Penhallow", "Pell Dunmore", "Tam Kerrow", "Wren",
    }  # fmt: skip
    colours = re.findall(r'<circle[^>]*fill="hsl\((\d+),65%,(\d+)%\)"[^>]*class="dot', dom)
    assert len(colours) == 10
    for i, (hue, light) in enumerate(colours):
        for other, other_light in colours[i + 1 :]:
            apart = abs(int(hue) - int(other)) % 360
            apart = min(apart, 360 - apart)
            # distinct hues, and two of one lightness far apart on the wheel
            assert apart >= 30 and (light != other_light or apart >= 60), colours
    # the chart: a title, five values up its y axis, the axes named
    chart = dom[dom.index('id="chart"') :]
    chart = chart[: chart.index("</svg>")]
    assert ">Tokens per tick</text>" in chart
    assert len(re.findall(r'class="ylab"[^>]*>[\d,]+<', chart)) == 5
    assert ">tokens</text>" in chart and ">tick</text>" in chart
