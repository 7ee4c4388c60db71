"""``sim serve``'s page in a real browser: Playwright driving Debian's chromium (never
Playwright's own download). The page runs, pauses, steps, injects and scrubs as a person
would, and what a person sees is checked: text, labels, and that no script ran from a
world's names. Skips, saying why, where chromium or Playwright is missing (.ci/run
installs chromium)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest

from tests.conftest import WORLDS, copy_demo

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.sync_api import Browser, Page, expect, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None  # type: ignore[assignment]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="chromium is not installed (Debian: apt-get install chromium); .ci/run installs it",
    ),
    pytest.mark.skipif(sync_playwright is None, reason="playwright is not installed (dev extra)"),
]

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
IMG = "<img src=x onerror=\"window.__pwned='img'\">"
SCRIPT = "<script>window.__pwned='script'</script>"
REPO = Path(__file__).resolve().parents[2]


def launch(playwright: Any) -> Browser:
    return playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        opened = launch(playwright)
        yield opened
        opened.close()


@pytest.fixture(autouse=True)
def _pages_closed(browser: Browser) -> Iterator[None]:
    """Each test's pages close when it ends: left open, a page went on asking its stopped
    server (a study's every second, an event stream every 3 s) for the rest of the module."""
    yield
    for context in browser.contexts:
        context.close()


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def sim(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sim", *args], capture_output=True, env=_env(), check=False
    )
    assert done.returncode == 0, done.stderr


class Served:
    def __init__(self, world: Path, *args: str, sim: list[str] | None = None) -> None:
        self.process = subprocess.Popen(
            [*(sim or [sys.executable, "-m", "sim"]), "serve", "--world", str(world), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().strip()
        assert "/?token=" in self.url, self.process.stderr.read() if self.process.stderr else ""

    def stop(self) -> str:
        """SIGTERM the server; its stderr once it ended (within 60 s, or the test fails
        saying so, the server killed rather than left running)."""
        self.process.terminate()
        try:
            _, err = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, err = self.process.communicate()
            pytest.fail(f"sim serve did not stop within 60 s of SIGTERM; its stderr:\n{err}")
        return err


class Heard:
    """The server's event stream, read on a thread of its own as a second client (with
    the token): ``wait`` returns once an event of a kind with some data was heard."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        token = parse_qs(parts.query)["token"][0]
        self.connection = HTTPConnection(parts.hostname or "", parts.port, timeout=60)
        self.connection.request("GET", "/api/events", headers={"Authorization": f"Bearer {token}"})
        self.stream = self.connection.getresponse()
        assert self.stream.status == 200
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        kind = ""
        for raw in self.stream:  # ends when the server stops (its streams end)
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                with self.changed:
                    self.events.append((kind, orjson.loads(line[6:])))
                    self.changed.notify_all()

    def wait(self, kind: str, **data: Any) -> None:
        def heard() -> bool:
            return any(
                k == kind and all(d.get(key) == value for key, value in data.items())
                for k, d in self.events
            )

        with self.changed:
            assert self.changed.wait_for(heard, timeout=60), (kind, data, self.events)

    def join(self) -> None:
        """Wait for the stream's end (the server stopped), then close the connection."""
        self.thread.join(60)
        self.connection.close()


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    """The demo with two characters named as markup that would run script."""
    world = copy_demo(tmp_path / "demo")
    for cid, name in (("ada", IMG), ("bram", SCRIPT)):
        path = world / "characters" / f"{cid}.json"
        data = orjson.loads(path.read_bytes())
        data["identity"]["name"] = name
        path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    return world


def _page(browser: Browser, *scripts: str) -> Page:
    """A new page of the size the tests look at, running ``scripts`` before the page's."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    for script in scripts:
        page.add_init_script(script)
    return page


def _open(browser: Browser, url: str) -> tuple[Page, list[str]]:
    page = _page(browser)
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on(
        "dialog", lambda dialog: (problems.append(f"dialog {dialog.message}"), dialog.dismiss())
    )
    page.goto(url)
    expect(page.locator("#world-name")).to_have_text("Saltglass Isle: The Lantern Tide")
    return page, problems


def _no_script_ran(page: Page, problems: list[str]) -> None:
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#people img, #map img, #scenes img, #inspector img").count() == 0
    assert page.locator("body script").count() == 0
    assert not problems, problems


def test_run_pause_step_and_scrub(browser: Browser, hostile: Path, tmp_path: Path):
    served = Served(hostile)
    try:
        page, problems = _open(browser, served.url)
        assert "token=" not in page.url  # the token left the address bar for a cookie
        expect(page.locator("#tick-label")).to_have_text("no tick logged yet")
        expect(page.locator("#people-count")).to_have_text("10")
        # the names are on the map and in the list, as text
        expect(page.locator("#map text.who", has_text=IMG)).to_have_count(1)
        expect(page.locator("#people button", has_text=SCRIPT)).to_have_count(1)
        expect(page.locator("#map .place-name", has_text="Herring Quay")).to_have_count(1)
        page.fill("#run-ticks", "2")
        page.click("#run")
        expect(page.locator("#tick-label")).to_have_text("Tick 2 of 1–2", timeout=60_000)
        expect(page.locator("#world-tick")).to_have_text("tick 2")
        expect(page.locator("#status")).to_have_text(re.compile(r"idle \(ran 2 of 2\)"))
        expect(page.locator("#scenes .scene h3").first).to_be_visible()
        expect(page.locator("#charts svg[aria-label='Tokens per tick']")).to_have_count(1)
        # a long run, paused: it stops after the tick running, every tick committed
        page.fill("#run-ticks", "200")
        page.click("#run")
        expect(page.locator("#pause")).to_be_enabled()
        page.click("#pause")
        expect(page.locator("#status")).to_have_text(
            re.compile(r"idle \(ran \d+ of 200\)"), timeout=60_000
        )
        ran = int(re.findall(r"ran (\d+) of 200", page.locator("#status").inner_text())[0])
        shown = orjson.loads((hostile / "world.json").read_bytes())["tick"]
        assert shown == 2 + ran < 202  # every tick committed whole, and the run stopped
        expect(page.locator("#world-tick")).to_have_text(f"tick {shown}")
        page.click("#step")
        expect(page.locator("#world-tick")).to_have_text(f"tick {shown + 1}", timeout=60_000)
        # scrub back: the slider to the first tick shows its scenes
        page.locator("#scrub").fill("0")
        expect(page.locator("#tick-label")).to_have_text(f"Tick 1 of 1–{shown + 1}")
        expect(page.locator("#follow")).not_to_be_checked()
        expect(page.locator("#scenes .scene").first).to_be_visible()
        page.click("#next")
        expect(page.locator("#tick-label")).to_have_text(f"Tick 2 of 1–{shown + 1}")
        # the inspector shows a hostile name as text
        page.locator("#people button", has_text=IMG).click()
        expect(page.locator("#inspector h3")).to_have_text(IMG)
        expect(page.locator("#inspector dd", has_text="quay").first).to_be_visible()
        expect(page.locator("#inspector dd", has_text="calls for them")).to_be_visible()
        page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
        assert (tmp_path / "page.png").stat().st_size > 20_000
        _no_script_ran(page, problems)
    finally:
        err = served.stop()
    assert "Traceback" not in err


def test_inject_set_ask_and_a_tick_run_elsewhere(browser: Browser, tmp_path: Path):
    world = copy_demo(tmp_path / "demo")
    served = Served(world)
    try:
        page, problems = _open(browser, served.url)
        page.select_option("#inject-at", label="Herring Quay")
        page.fill("#inject-text", "A gull drops a silver key on the quay.")
        page.click("#inject-form button")
        expect(page.locator("#steer-result")).to_have_text(
            re.compile(r"recorded: .*silver key.*applies at tick 1")
        )
        page.fill("#set-assignment", 'ada.state.mood="furious"')
        page.click("#set-form button")
        expect(page.locator("#steer-result")).to_have_text(re.compile("recorded: "))
        page.fill("#set-assignment", "ada.state.mood=furious")  # not JSON: the error shows
        page.click("#set-form button")
        expect(page.locator("#steer-result")).to_have_text(re.compile("JSON"))
        expect(page.locator("#steer-result")).to_have_class(re.compile("error"))
        page.select_option("#ask-who", label="Orla Penhallow")
        page.fill("#ask-question", "Who will you name?")
        page.click("#ask-form button")
        expect(page.locator("#steer-result")).to_have_text(re.compile("^Orla Penhallow: ."))
        page.click("#step")
        expect(page.locator("#tick-label")).to_have_text("Tick 1 of 1–1", timeout=60_000)
        expect(page.locator("#scenes")).to_contain_text("silver key")
        # a tick committed by a `sim tick` in another process reaches the page
        sim("tick", "--world", str(world))
        expect(page.locator("#tick-label")).to_have_text("Tick 2 of 1–2", timeout=10_000)
        _no_script_ran(page, problems)
    finally:
        served.stop()


def test_a_tick_committed_before_the_page_listens_still_shows(browser: Browser, tmp_path: Path):
    """A tick committed elsewhere after the page read the world but before its event
    stream connected: the server's ``world`` event went to no listener of the page, and
    the stream's ``hello`` names the new tick; the page reads the world again (it stayed
    on the old view, for good, when the last tick of a run came in that gap)."""
    world = copy_demo(tmp_path / "demo")
    served = Served(world)
    heard = Heard(served.url)
    try:
        heard.wait("hello", tick=0)
        page = _page(browser)

        def late(route: Any) -> None:  # the page's stream, held until the tick is heard
            sim("tick", "--world", str(world))
            heard.wait("world", tick=1)  # published while the page had no stream
            route.continue_()

        page.route("**/api/events", late)
        page.goto(served.url)
        expect(page.locator("#tick-label")).to_have_text("Tick 1 of 1–1", timeout=30_000)
        expect(page.locator("#world-tick")).to_have_text("tick 1")
    finally:
        served.stop()
        heard.join()


#: counts, in ``window.__read[KIND]``, the page's answers to ``GET /api/KIND...`` it has
#: read and acted on (a task after the answer's, so after what the page does with it)
COUNT_ANSWERS = """
window.__read = {};
const fetched = window.fetch;
window.fetch = async (...args) => {
  const response = await fetched(...args);
  const kind = String(args[0]).split(/[/?]/)[2];
  const json = response.json.bind(response);
  response.json = () => json().finally(() => setTimeout(() => {
    window.__read[kind] = (window.__read[kind] || 0) + 1;
  }));
  return response;
};
"""


def test_an_answer_older_than_the_view_shown_is_dropped(browser: Browser, tmp_path: Path):
    """The page asks for the world again at each tick; an answer that comes back after a
    later one (the server reads each on a thread of its own) is older than the view
    shown, and is dropped: the page showed it, and stayed on the old tick for good."""
    world = copy_demo(tmp_path / "demo")
    served = Served(world)
    try:
        page = _page(browser, COUNT_ANSWERS)
        page.goto(served.url)
        expect(page.locator("#world-tick")).to_have_text("tick 0")  # the world read
        expect(page.locator("#tick-label")).to_have_text("no tick logged yet")
        held: list[tuple[Any, Any]] = []

        def late(route: Any) -> None:  # the ask for tick 1 is answered after tick 2's
            if held:
                route.continue_()
                return
            held.append((route, route.fetch()))  # the world at tick 1
            sim("tick", "--world", str(world))  # tick 2: the page asks again

        page.route("**/api/world?*", late)
        sim("tick", "--world", str(world))
        expect(page.locator("#world-tick")).to_have_text("tick 2", timeout=30_000)
        expect(page.locator("#tick-label")).to_have_text("Tick 2 of 1–2")
        route, answer = held[0]
        assert orjson.loads(answer.body())["tick"] == 1
        route.fulfill(response=answer)
        # read: the first, tick 2's, tick 1's (a function: the page's CSP forbids eval)
        page.wait_for_function("() => window.__read.world >= 3")
        expect(page.locator("#world-tick")).to_have_text("tick 2")
        expect(page.locator("#tick-label")).to_have_text("Tick 2 of 1–2")
    finally:
        served.stop()


def test_the_inspector_shows_the_character_chosen_last(browser: Browser, tmp_path: Path):
    """Two characters chosen one after the other: the first's answer, come back last,
    is dropped; the inspector showed whoever answered last, not whoever was chosen."""
    world = copy_demo(tmp_path / "demo")
    served = Served(world)
    try:
        page = _page(browser, COUNT_ANSWERS)
        page.goto(served.url)
        expect(page.locator("#people-count")).to_have_text("10")
        held: list[Any] = []

        def late(route: Any) -> None:  # the first character asked for answers last
            if route.request.url.endswith("/api/characters/ada"):
                held.append(route)
            else:
                route.continue_()

        page.route("**/api/characters/*", late)
        page.locator("#people button", has_text="Ada Strand").click()
        page.locator("#people button", has_text="Bram Hollis").click()
        expect(page.locator("#inspector h3")).to_have_text("Bram Hollis")
        assert len(held) == 1
        held[0].continue_()
        page.wait_for_function("() => window.__read.characters >= 2")
        expect(page.locator("#inspector h3")).to_have_text("Bram Hollis")
    finally:
        served.stop()


def test_rewind_and_fork_from_the_timeline(browser: Browser, tmp_path: Path):
    """The timeline's "fork from this tick" makes a new world beside this one (a hostile
    name is refused, the server's reason shown); "rewind to this tick" puts the world back
    to the start of the tick shown, and the page follows."""
    world = copy_demo(tmp_path / "demo")
    sim("tick", "--world", str(world), "--ticks", "2")
    served = Served(world)
    try:
        page, problems = _open(browser, served.url)
        expect(page.locator("#tick-label")).to_have_text("Tick 2 of 1–2")
        page.fill("#fork-to", "../escaped")
        page.click("#fork")
        expect(page.locator("#history-result")).to_have_text(re.compile("to: expected"))
        expect(page.locator("#history-result")).to_have_class(re.compile("error"))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]
        page.fill("#fork-to", "branch")
        page.click("#fork")
        expect(page.locator("#history-result")).to_have_text(
            "forked: branch is at tick 1, ready to run tick 2"
        )
        assert orjson.loads((tmp_path / "branch" / "world.json").read_bytes())["tick"] == 1
        page.click("#rewind")
        expect(page.locator("#history-result")).to_have_text(
            re.compile(r"^rewound: the world is at tick 1, ready to run tick 2")
        )
        expect(page.locator("#world-tick")).to_have_text("tick 1")
        expect(page.locator("#tick-label")).to_have_text("Tick 1 of 1–1")
        assert orjson.loads((world / "world.json").read_bytes())["tick"] == 1
        page.click("#rewind")  # to the start of tick 1: no tick is logged any more
        expect(page.locator("#tick-label")).to_have_text("no tick logged yet")
        expect(page.locator("#world-tick")).to_have_text("tick 0")
        expect(page.locator("#rewind")).to_be_disabled()
        _no_script_ran(page, problems)
    finally:
        served.stop()


def test_the_network_draws_a_known_tie_between_the_two_named(browser: Browser, hostile: Path):
    """A tie in the world's relationships is a line from one named dot to the other; the
    names (markup, in this world) are text."""
    for cid, other, kind in (("ada", "orla", "friend"), ("orla", "ada", "friend")):
        path = hostile / "characters" / f"{cid}.json"
        data = orjson.loads(path.read_bytes())
        data["relationships"] = {other: {"kind": kind, "trust": 0.8}}
        path.write_bytes(orjson.dumps(data))
    served = Served(hostile)
    try:
        page, problems = _open(browser, served.url)
        expect(page.locator("#network-note")).to_have_text("1 tie among 10 characters")
        line = page.locator("#network line.tie")
        expect(line).to_have_count(1)
        expect(line.locator("title")).to_have_text(f"{IMG} — Orla Penhallow: friend, trust 0.8")

        def dot(name: str) -> tuple[float, float]:
            node = page.locator("#network g.network-node", has=page.locator("text", has_text=name))
            expect(node).to_have_count(1)
            circle = node.locator("circle")
            return float(circle.get_attribute("cx") or "nan"), float(
                circle.get_attribute("cy") or "nan"
            )

        ends = {
            (float(line.get_attribute("x1") or "nan"), float(line.get_attribute("y1") or "nan")),
            (float(line.get_attribute("x2") or "nan"), float(line.get_attribute("y2") or "nan")),
        }
        assert ends == {dot(IMG), dot("Orla Penhallow")}
        expect(page.locator("#network text.label", has_text=SCRIPT)).to_have_count(1)
        _no_script_ran(page, problems)
        assert page.locator("#network img, #network script").count() == 0
    finally:
        served.stop()


def test_a_study_folder_shows_its_arms_as_they_go(browser: Browser, tmp_path: Path):
    """Served, a study's folder is a table of its arms with their tick and status; an arm
    put back a tick (elsewhere) shows it within a second or two, and again when it ends."""
    study = 'world = "w"\nseeds = "1"\nticks = 2\n[conditions.control]\n[conditions.announce]\n'
    (tmp_path / "study.toml").write_text(study)
    for args in (("init", "w"), ("study", "run", "study.toml", "--out", "out")):
        done = subprocess.run(
            [sys.executable, "-m", "sim", *args],
            capture_output=True,
            env=_env(),
            cwd=tmp_path,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    served = Served(tmp_path / "out")
    try:
        page = _page(browser)
        page.goto(served.url)
        expect(page.locator("#world-name")).to_have_text("Study")
        expect(page.locator("#runs-note")).to_have_text(
            "study: 2 of 2 finished, 0 in progress, 2 ticks each"
        )
        expect(page.locator("main")).to_be_hidden()
        row = page.locator("#runs tbody tr", has_text="announce")
        expect(row.locator("td.tick")).to_have_text("2 of 2")
        sim("rewind", "--world", str(tmp_path / "out" / "announce" / "seed-1"), "--tick", "2")
        expect(row.locator("td.tick")).to_have_text("1 of 2", timeout=5_000)
        expect(row).to_contain_text("waiting")
        sim("tick", "--world", str(tmp_path / "out" / "announce" / "seed-1"))
        expect(row.locator("td.tick")).to_have_text("2 of 2", timeout=5_000)
        expect(row).to_contain_text("finished")
    finally:
        served.stop()


def test_the_inspector_shows_what_retrieval_chose(browser: Browser, tmp_path: Path):
    world = tmp_path / "minds"
    shutil.copytree(WORLDS / "minds", world, ignore=shutil.ignore_patterns(".sim"))
    sim("tick", "--world", str(world), "--ticks", "2")
    served = Served(world)
    try:
        page, problems = _open(browser, served.url)
        page.locator("#people button", has_text="Ada Strand").click()
        expect(page.locator("#inspector h3")).to_have_text("Ada Strand")
        chose = page.locator("#inspector dt", has_text="retrieval chose")
        expect(chose).to_have_count(1)
        box = page.locator("#inspector .recalled")
        expect(box).to_contain_text("for tick 2's intention")
        expect(box.locator("li").first).to_have_text(re.compile(r"^tick \d+: ."))
        assert not problems, problems
    finally:
        served.stop()


def test_read_only_disables_the_controls(browser: Browser, tmp_path: Path):
    world = copy_demo(tmp_path / "demo")
    served = Served(world, "--read-only")
    try:
        page, problems = _open(browser, served.url)
        expect(page.locator("#mode")).to_have_text("read-only")
        for control in (
            "#run",
            "#step",
            "#inject-form button",
            "#ask-form button",
            "#rewind",
            "#fork",
        ):
            expect(page.locator(control)).to_be_disabled()
        assert not problems
    finally:
        served.stop()


def test_a_big_world_is_aggregated_not_one_node_per_character(browser: Browser, tmp_path: Path):
    sys.path.insert(0, str(REPO))
    from bench.make_world import make_world

    world = tmp_path / "big"
    make_world(world, 5000, 40)
    served = Served(world)
    try:
        page = _page(browser)
        page.goto(served.url)
        expect(page.locator("#people-count")).to_have_text("5000", timeout=30_000)
        expect(page.locator("#people-page")).to_have_text("1–200 of 5000")
        # 40 places: each name along its radius, its count inward, both in the node's title
        expect(page.locator("#map .count").first).to_have_text(re.compile(r"^\d+$"))
        titled = page.locator("#map circle.place title").first.text_content() or ""
        assert re.search(r": \d+ characters?$", titled), titled
        # the network, drawn by place, comes after the map: counted once it is there
        expect(page.locator("#network g.network-node")).to_have_count(40)
        nodes = page.evaluate("document.getElementsByTagName('*').length")
        assert nodes < 3000, nodes
        page.click("#people-next")
        expect(page.locator("#people-page")).to_have_text("201–400 of 5000")
    finally:
        served.stop()


def test_a_world_of_many_places_maps_its_busiest(browser: Browser, tmp_path: Path):
    """Past ``MAP_PLACES`` places, the map draws the busiest and says so: not a node per
    place of a big world; the network, drawn by place, draws the same."""
    sys.path.insert(0, str(REPO))
    from bench.make_world import make_world
    from sim.serve.views import MAP_PLACES

    world = tmp_path / "many-places"
    # more characters than the network draws one by one, fewer than a page of the list
    # takes to matter: the places are what is tested (5000 characters: the test above)
    make_world(world, 1000, MAP_PLACES + 100)
    counts = Counter(
        orjson.loads(path.read_bytes())["state"]["location"]
        for path in (world / "characters").glob("*.json")
    )
    names = {
        path.stem: orjson.loads(path.read_bytes())["identity"]["name"]
        for path in (world / "locations").glob("*.json")
    }
    busiest = sorted(names, key=lambda lid: (-counts[lid], lid))[:MAP_PLACES]
    assert counts[busiest[-1]] > min(counts[lid] for lid in names)  # some are left out
    served = Served(world)
    try:
        page = _page(browser)
        page.goto(served.url)
        expect(page.locator("#people-count")).to_have_text("1000", timeout=30_000)
        expect(page.locator("#map-note")).to_contain_text(
            f"the {MAP_PLACES} busiest of {MAP_PLACES + 100} places"
        )
        expect(page.locator("#map g.loc")).to_have_count(MAP_PLACES)
        mapped = page.locator("#map .place-name").all_text_contents()
        assert sorted(mapped) == sorted(names[lid] for lid in busiest)
        # the network, drawn by place (past ``NETWORK_CHARACTERS``): the same busiest
        expect(page.locator("#network g.network-node")).to_have_count(MAP_PLACES)
        assert sorted(mapped) == sorted(page.locator("#network .place-name").all_text_contents())
        # every name and count readable: none over another, none cut off by the edge
        for drawing in ("#map", "#network"):
            assert page.evaluate(LABELS_CLASH, drawing) == [0, 0], drawing
    finally:
        served.stop()


#: ``[overlapping pairs, labels past the edge]`` of a drawing's place names and counts,
#: each the rectangle its text takes on the screen, turned as it is drawn (separating
#: axes)
LABELS_CLASH = """(drawing) => {
  const texts = document.querySelectorAll(`${drawing} .place-name, ${drawing} .count`);
  const quads = [...texts].map((t) => {
    const b = t.getBBox(), m = t.getScreenCTM();
    const right = b.x + b.width, bottom = b.y + b.height;
    return [[b.x, b.y], [right, b.y], [right, bottom], [b.x, bottom]]
      .map(([x, y]) => [m.a * x + m.c * y + m.e, m.b * x + m.d * y + m.f]);
  });
  const axes = (q) => q.map((p, i) => [q[(i + 1) % 4][1] - p[1], p[0] - q[(i + 1) % 4][0]]);
  const apart = (a, b) => [...axes(a), ...axes(b)].some(([ax, ay]) => {
    const pa = a.map(([x, y]) => x * ax + y * ay), pb = b.map(([x, y]) => x * ax + y * ay);
    const slack = 0.5 * Math.hypot(ax, ay);
    return Math.max(...pa) <= Math.min(...pb) + slack || Math.max(...pb) <= Math.min(...pa) + slack;
  });
  let overlaps = 0;
  for (let i = 0; i < quads.length; i++) {
    for (let j = i + 1; j < quads.length; j++) if (!apart(quads[i], quads[j])) overlaps++;
  }
  const box = document.querySelector(drawing).getBoundingClientRect();
  const outside = quads.filter((q) => q.some(([x, y]) =>
    x < box.left - 1 || x > box.right + 1 || y < box.top - 1 || y > box.bottom + 1)).length;
  return [overlaps, outside];
}"""


def test_the_page_says_loading_until_the_world_has_loaded(browser: Browser, tmp_path: Path):
    """The page opens while the world is still loading, says so, and shows the world when
    the ``loaded`` event comes."""
    from tests.e2e.serve_client import held_load

    world = copy_demo(tmp_path / "demo")
    gate = tmp_path / "gate"
    served = Served(world, sim=held_load(gate))
    try:
        page = _page(browser)
        problems: list[str] = []
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.goto(served.url)
        files = len([*world.glob("characters/*.json"), *world.glob("locations/*.json")])
        expect(page.locator("#load-text")).to_have_text(
            re.compile(rf"^Loading the world .*: 0 of {files} files checked")
        )
        expect(page.locator("main")).to_be_hidden()
        # world.json is validated on its own first: its name and tick show while loading
        expect(page.locator("#world-name")).to_have_text("Saltglass Isle: The Lantern Tide")
        expect(page.locator("#world-tick")).to_have_text("tick 0")
        gate.touch()
        expect(page.locator("#people-count")).to_have_text("10", timeout=30_000)
        expect(page.locator("#load")).to_be_hidden()
        expect(page.locator("#world-name")).to_have_text("Saltglass Isle: The Lantern Tide")
        assert not problems, problems
    finally:
        gate.touch()
        served.stop()


def test_a_world_that_does_not_validate_shows_its_problems(browser: Browser, tmp_path: Path):
    """A bad entity file: the page names the file, the field and what was expected, as
    text (the bad value is a markup that would run script), and shows nothing else."""
    world = copy_demo(tmp_path / "demo")
    path = world / "characters" / "ada.json"
    data = orjson.loads(path.read_bytes())
    data["state"]["location"] = IMG
    path.write_bytes(orjson.dumps(data))
    served = Served(world)
    try:
        page = _page(browser)
        problems: list[str] = []
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.goto(served.url)
        expect(page.locator("#load-text")).to_contain_text("could not be loaded")
        item = page.locator("#load-problems li").first
        expect(item).to_contain_text("characters/ada.json field state.location")
        expect(item).to_contain_text("expected an id matching")
        expect(page.locator("main")).to_be_hidden()
        assert page.evaluate("window.__pwned") is None
        assert page.locator("#load img").count() == 0
        assert not problems, problems
    finally:
        err = served.stop()
    assert "characters/ada.json: field 'state.location'" in err and "Traceback" not in err
    assert served.process.returncode == 2


def test_scenes_show_as_they_are_written_with_a_streaming_provider(
    browser: Browser, tmp_path: Path
):
    """With ``[llm] stream`` on a real HTTP provider (the loopback stub), each place's
    narrative shows on the page while its tick runs, then the committed tick's scenes."""
    from sim.testing.stub_server import ServerThread, StubOptions, StubServer

    world = copy_demo(tmp_path / "demo")
    with ServerThread(StubServer(StubOptions(stream_chunk_delay=0.03))) as stub:
        config = tmp_path / "config.toml"
        config.write_text(
            f'[llm]\nprovider = "chat"\nbase_url = "{stub.base_url}"\nstream = true\n'
        )
        served = Served(world, "--config", str(config))
        try:
            page, problems = _open(browser, served.url)
            page.click("#step")
            writing = page.locator("#live-scenes")
            expect(writing).to_be_visible(timeout=60_000)
            expect(writing.locator("p.narrative").first).not_to_be_empty()
            expect(writing).to_contain_text("being written")
            expect(page.locator("#tick-label")).to_have_text("Tick 1 of 1–1", timeout=120_000)
            expect(writing).to_be_hidden()
            expect(page.locator("#scenes .scene").first).to_be_visible()
            _no_script_ran(page, problems)
        finally:
            served.stop()


def test_the_page_shows_a_big_worlds_first_look_then_the_world(browser: Browser, tmp_path: Path):
    """While the load runs, the page shows the first look: the counts, the map and the
    list, names as text (one is markup that would run script), and says the full load
    continues; when it ends, the page shows the validated world."""
    from tests.e2e.serve_client import held_load

    world = copy_demo(tmp_path / "demo")
    path = world / "characters" / "ada.json"
    data = orjson.loads(path.read_bytes())
    data["identity"]["name"] = IMG
    path.write_bytes(orjson.dumps(data))
    gate = tmp_path / "gate"
    served = Served(world, sim=held_load(gate, first_look=True))
    try:
        page = _page(browser)
        problems: list[str] = []
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.goto(served.url)
        expect(page.locator("#people-count")).to_have_text("10", timeout=30_000)
        expect(page.locator("#load-text")).to_contain_text("A first look")
        expect(page.locator("main")).to_be_visible()
        expect(page.locator("#people")).to_contain_text(IMG)
        expect(page.locator("#network-note")).not_to_be_empty()
        expect(page.locator("#tick-label")).to_have_text(
            "the logged ticks show once the world is loaded"
        )
        assert page.locator("#map g.loc").count() == 9
        gate.touch()
        expect(page.locator("#load")).to_be_hidden(timeout=30_000)
        expect(page.locator("#people-count")).to_have_text("10")
        expect(page.locator("#tick-label")).to_have_text("no tick logged yet")
        assert page.evaluate("window.__pwned") is None
        assert not problems, problems
    finally:
        gate.touch()
        served.stop()


def test_a_first_look_at_a_world_that_does_not_validate_ends_in_its_problems(
    browser: Browser, tmp_path: Path
):
    """A file that passes the first look's checks but not the load's: the look shows,
    then the page names the file and field, and shows nothing else."""
    from tests.e2e.serve_client import held_load

    world = copy_demo(tmp_path / "demo")
    path = world / "characters" / "ada.json"
    data = orjson.loads(path.read_bytes())
    data["state"]["location"] = "atlantis"
    path.write_bytes(orjson.dumps(data))
    gate = tmp_path / "gate"
    served = Served(world, sim=held_load(gate, first_look=True))
    try:
        page = _page(browser)
        page.goto(served.url)
        expect(page.locator("#load-text")).to_contain_text("A first look", timeout=30_000)
        expect(page.locator("#people-count")).to_have_text("10")
        gate.touch()
        expect(page.locator("#load-problems")).to_contain_text(
            "characters/ada.json", timeout=30_000
        )
        expect(page.locator("#load-problems")).to_contain_text("state.location")
        expect(page.locator("main")).to_be_hidden()
    finally:
        gate.touch()
        served.stop()
