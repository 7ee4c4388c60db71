"""`sim report`: interventions on the timeline and the world's own state fields charted over
ticks (issue 27), through the CLI and in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from conftest import HARVEST

from sim.cli import main
from sim.ticklog.format import log_path, unpack_state
from sim.ticklog.reader import read_log

DATA_RE = re.compile(r'<script type="application/json" id="report-data">(.*?)</script>', re.DOTALL)
HOSTILE = "<script>alert(1)</script>"


def invoke(*args: str) -> Any:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def page_data(page: Path) -> dict[str, Any]:
    match = DATA_RE.search(page.read_text(encoding="utf-8"))
    assert match
    return dict(orjson.loads(match.group(1)))


def _edit(path: Path, change: Any) -> None:
    data = orjson.loads(path.read_bytes())
    change(data)
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The harvest-vote world (its vote phase writes state.stance) with a number and a
    nested number of its own, an injection before tick 2 and a set before tick 3."""
    root = tmp_path_factory.mktemp("fields") / "vote"
    shutil.copytree(HARVEST, root)
    shutil.rmtree(root / ".sim", ignore_errors=True)
    for n, path in enumerate(sorted((root / "characters").glob("*.json"))):
        _edit(path, lambda d, n=n: d["state"].update(savings=100 * n, farm={"acres": n}))
    invoke("tick", "--world", str(root))
    invoke("inject", "--world", str(root), "--everywhere", f"Rain at last {HOSTILE}")
    invoke("tick", "--world", str(root))
    invoke("set", "--world", str(root), "ana.state.savings=5000")
    invoke("inject", "--world", str(root), "--at", "grange-hall", "The lord pays half")
    invoke("tick", "--world", str(root), "--ticks", "2")
    return root


def state_after(world: Path, tick: int) -> dict[str, dict[str, Any]]:
    """Each character's state after ``tick`` (the next log's snapshot, else the world)."""
    nxt = log_path(world, tick + 1)
    if nxt.exists() or Path(f"{nxt}.zst").exists():
        files = unpack_state(read_log(nxt).state_before)  # type: ignore[arg-type]
    else:
        files = {
            f"characters/{p.name}": p.read_bytes() for p in (world / "characters").glob("*.json")
        }
    return {rel: orjson.loads(raw)["state"] for rel, raw in files.items() if rel.startswith("char")}


def test_the_report_charts_own_fields_and_marks_interventions(world: Path, tmp_path: Path):
    out = tmp_path / "report.html"
    invoke("report", "--world", str(world), "--out", str(out))
    data = page_data(out)
    ivs = {t["t"]: t["iv"] for t in data["ticks"]}
    assert ivs[1] == [] and ivs[4] == []
    assert ivs[2] == [["inject", None, f"Rain at last {HOSTILE}"]]
    assert ivs[3] == [
        ["set", "characters/ana state.savings", "0 → 5000"],
        ["inject", "grange-hall", "The lord pays half"],
    ]
    fields = {f["f"]: f for f in data["fields"]}
    assert sorted(fields) == ["farm.acres", "savings", "stance"]  # no mood, inventory
    savings = fields["savings"]
    assert savings["kind"] == "num" and savings["t"] == [0, 1, 2, 3, 4]
    for k, tick in enumerate(savings["t"]):
        after = state_after(world, tick)
        if tick == 2:  # the set before tick 3 is in its starting state, not tick 2's end
            after["characters/ana.json"]["savings"] = 0
        values = [s["savings"] for s in after.values()]
        assert savings["mean"][k] == pytest.approx(sum(values) / len(values))
        assert (savings["min"][k], savings["max"][k]) == (min(values), max(values))
    # the set before tick 3 shows from tick 3 on
    assert savings["max"][2] == 500 and savings["max"][3] == 5000
    stance = fields["stance"]
    assert stance["kind"] == "cat" and stance["t"] == [0, 1, 2, 3, 4]
    for k, tick in enumerate(stance["t"]):
        held = [s["stance"] for s in state_after(world, tick).values()]
        assert dict(zip(stance["cats"], stance["counts"][k], strict=True)) == {
            c: held.count(c) for c in stance["cats"]
        }
    assert stance["counts"][0] == [6] + [0] * (len(stance["cats"]) - 1)  # all undecided


def test_a_world_without_own_fields_gets_no_charts(tmp_path: Path):
    root = tmp_path / "w"
    invoke("init", str(root))
    invoke("tick", "--world", str(root))
    invoke("report", "--world", str(root))
    data = page_data(root / "report.html")
    assert data["fields"] == [] and data["ticks"][0]["iv"] == []


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
        "--window-size=1300,2600",
        "--virtual-time-budget=5000",
        *args,
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_the_charts_and_marks_render_in_headless_chromium(world: Path, tmp_path: Path):
    page = tmp_path / "w" / "report.html"
    shutil.copytree(world, page.parent)
    invoke("report", "--world", str(page.parent))
    url = page.resolve().as_uri()
    dom = chromium(tmp_path, f"{url}#tick=3", "--dump-dom")
    assert 'id="fields"' in dom and 'id="fields" class="card" hidden' not in dom
    assert dom.count('class="fieldchart"') == 3
    assert dom.count('class="meanline"') == 2  # savings, farm.acres
    assert dom.count('class="band"') == 2
    assert "undecided" in dom  # the stance legend
    # interventions: a mark before ticks 2 and 3 in each of the 3 charts and the tokens chart
    assert dom.count('class="ivline"') == 2 * 4
    assert dom.count('class="cell iv') == 2
    assert "intervention before this tick: set characters/ana state.savings: 0 → 5000" in dom
    assert "intervention before this tick: inject at " in dom
    assert HOSTILE not in dom and "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    shot = tmp_path / "fields.png"
    chromium(tmp_path, f"{url}#tick=3", f"--screenshot={shot}")
    assert shot.stat().st_size > 20_000
