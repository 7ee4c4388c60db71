"""``sim serve`` on a 1,000-character world with 20 logged ticks (issue #38's figures).

    python -m bench.serve [--characters 1000] [--ticks 20]
    python -m bench.serve --open-only --characters 100000 [--places 500] [--world DIR]

``--open-only`` times a big world's opening: the address line, the first ``/api/world``
answer (503 "loading" while the world loads in the background), its first 200 from the
first look (``?preview=1``) and its first 200 from the validated world, the page's
requests, chromium until the page shows the world, and the server's peak memory; then,
with chromium, the whole opening on a second server: from its spawn until the page shows
the views (a browser launched first, the page opened as soon as the address is printed).

Builds the world offline (``bench/history.py build``), starts ``sim serve --read-only`` as
its own process, and measures over HTTP on 127.0.0.1 (a fresh connection per request, as
a browser opening the page): the page and its two files, ``/api/world`` and
``/api/ticks/N``, the first time (the server's cold caches) and the median of 5 after;
then the time from a ``sim tick`` commit (``world.json``'s mtime) to the ``world`` event
on ``/api/events``; with Playwright and chromium, the time until the page in the browser
shows the latest tick's scenes; and what serving costs a tick: on two copies of the
world, in turn, a tick by ``sim tick --json`` and one run from the API (``POST
/api/step``, an event listener connected), each tick's own wall time as the runner
measured it (``elapsed``). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.history import build

ROOT = Path(__file__).resolve().parents[1]


def _get(url: str, headers: dict[str, str]) -> tuple[float, int]:
    started = time.perf_counter()
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=120) as answer:
        size = len(answer.read())
    return time.perf_counter() - started, size


def _open_page(base: str, headers: dict[str, str], ticks: int) -> dict[str, float]:
    """What opening the page fetches before it shows the latest tick, each timed."""
    out: dict[str, float] = {}
    for name, path in [
        ("page", "/"),
        ("page.js", "/static/page.js"),
        ("page.css", "/static/page.css"),
        ("world", "/api/world"),
        ("tick", f"/api/ticks/{ticks}"),
    ]:
        out[name], _ = _get(base + path, headers)
    out["total"] = sum(out.values())
    return out


def _event_latency(base: str, token: str, world: Path) -> float:
    """From a ``sim tick`` commit (world.json's mtime) to the ``world`` event arriving."""
    arrived: list[float] = []
    ready = threading.Event()

    def listen() -> None:
        request = urllib.request.Request(
            base + "/api/events", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=600) as stream:
            kind = ""
            for raw in stream:
                line = raw.decode()
                if line.startswith("event: "):
                    kind = line[7:].strip()
                    if kind == "hello":
                        ready.set()
                if line.startswith("data: ") and kind == "world":
                    arrived.append(time.time())
                    return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    ready.wait(30)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-m", "sim", "tick", "--world", str(world)],
        check=True,
        capture_output=True,
        env=env,
    )
    thread.join(60)
    return arrived[0] - (world / "world.json").stat().st_mtime


def _serve(world: Path, cwd: str) -> tuple[subprocess.Popen[str], str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "sim", "serve", "--world", str(world)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=cwd,
    )
    assert server.stdout is not None
    return server, server.stdout.readline().strip()


def _tick_cost(world: Path, tmp: str, rounds: int) -> dict[str, Any]:
    """A tick's own wall time by ``sim tick`` and run from the API, ``rounds`` of each,
    alternating, on two copies of ``world`` (the same ticks)."""
    plain, served = Path(tmp) / "plain", Path(tmp) / "served"
    shutil.copytree(world, plain, symlinks=True)
    shutil.copytree(world, served, symlinks=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server, url = _serve(served, tmp)
    base, _, token = url.partition("/?token=")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    by_cli: list[float] = []
    by_api: list[float] = []
    try:
        events = urllib.request.urlopen(
            urllib.request.Request(base + "/api/events", headers=headers), timeout=600
        )
        for _ in range(rounds):
            done = subprocess.run(
                [sys.executable, "-m", "sim", "tick", "--world", str(plain), "--json"],
                check=True,
                capture_output=True,
                text=True,
                env=env,
                cwd=tmp,
            )
            by_cli.append(json.loads(done.stdout.splitlines()[-1])["elapsed"])
            step = urllib.request.Request(
                base + "/api/step", data=b"{}", headers=headers, method="POST"
            )
            urllib.request.urlopen(step, timeout=60).read()
            kind = ""
            for raw in events:
                line = raw.decode()
                if line.startswith("event: "):
                    kind = line[7:].strip()
                elif line.startswith("data: ") and kind == "tick":
                    by_api.append(json.loads(line[6:])["elapsed"])
                    break
        events.close()
    finally:
        server.terminate()
        server.wait(timeout=120)
    cli, api = statistics.median(by_cli), statistics.median(by_api)
    return {"sim_tick_s": by_cli, "api_s": by_api, "ratio": api / cli}


def _timed_page(
    url: str | Callable[[], str], selectors: tuple[str, ...], count_nodes: bool = False
) -> float | None:
    """Seconds from chromium's ``goto(url)`` until every one of ``selectors`` shows
    (``None``: no browser); ``url`` a function: from calling it, the browser launched
    before, to the same (it starts the server and returns the page's address);
    ``count_nodes``: the page's element count is kept (``_DOM_NODES``)."""
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if chromium is None:
        return None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-gpu", "--no-first-run"]
        )
        page = browser.new_page()
        page.goto("about:blank")
        started = time.perf_counter()
        page.goto(url if isinstance(url, str) else url())
        # selectors, not a predicate: the page's Content-Security-Policy forbids eval
        for selector in selectors:
            page.wait_for_selector(selector, timeout=120_000)
        took = time.perf_counter() - started
        if count_nodes:
            _DOM_NODES.append(int(page.evaluate("document.getElementsByTagName('*').length")))
        browser.close()
    return took


def _browser(url: str, ticks: int) -> float | None:
    """Seconds until chromium shows the latest tick's scenes (``None``: no browser)."""
    return _timed_page(url, ("#scenes .scene", f"#tick-label:text-matches('^Tick {ticks} ')"))


def _until_loaded(url: str, headers: dict[str, str], validated: bool = True) -> tuple[float, int]:
    """Ask ``url`` until it answers 200 (it answers 503 while the world loads; with
    ``validated``, until the 200 is not a first look): the time of the first answer of
    any kind, and the answers before the last."""
    first: float | None = None
    loading = 0
    while True:
        request = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=300) as answer:
                look = json.loads(answer.read()).get("preview", False)
                first = time.perf_counter() if first is None else first
                if not (validated and look):
                    return first, loading
                time.sleep(0.05)
        except urllib.error.HTTPError as exc:
            if exc.code != 503:
                raise
            first = time.perf_counter() if first is None else first
        loading += 1


def _peak_rss_mib(pid: int) -> float | None:
    """A process's peak resident memory (``VmHWM``), MiB; ``None`` off Linux."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _opening(characters: int, places: int, world_dir: Path | None) -> dict[str, Any]:
    """``--open-only``: a big world (no tick run) served: from the process's start to its
    address printed (before the world is loaded), to the first answer of
    ``/api/world`` (a 503 "loading" while the world loads, every file validated) and to
    its first 200; then each request the page makes on opening, then chromium from
    ``goto`` until the character count shows, and the server's peak memory."""
    from bench.make_world import make_world

    with tempfile.TemporaryDirectory(prefix="sim-bench-serve-") as tmp:
        world = world_dir or Path(tmp) / "world"
        if world_dir is None:
            make_world(world, characters, places, seed=1)
        load_before = os.getloadavg()
        started = time.perf_counter()
        server, url = _serve(world, tmp)
        startup = time.perf_counter() - started
        out: dict[str, Any] = {
            "characters": characters,
            "places": len(list((world / "locations").glob("*.json"))),
            "startup_s": startup,
        }
        try:
            base, _, token = url.partition("/?token=")
            headers = {"Authorization": f"Bearer {token}"}
            first, loading = _until_loaded(base + "/api/world?preview=1", headers, False)
            out["first_world_answer_s"] = first - started
            out["views_answered_s"] = time.perf_counter() - started
            out["loading_answers"] = loading
            _until_loaded(base + "/api/world", headers)
            out["world_loaded_s"] = time.perf_counter() - started
            for name, path in [
                ("page", "/"),
                ("world", "/api/world"),
                ("network", "/api/network"),
                ("history", "/api/history"),
                ("runs", "/api/runs"),
            ]:
                out[f"{name}_s"], out[f"{name}_bytes"] = _get(base + path, headers)
            out["requests_s"] = sum(out[f"{name}_s"] for name in OPENING)
            out["browser_s"] = _browser_count(url, characters)
            out["dom_nodes"] = _DOM_NODES[-1] if _DOM_NODES else None
            out["server_peak_rss_mib"] = _peak_rss_mib(server.pid)
        finally:
            server.terminate()
            server.wait(timeout=60)
        out["whole_opening_s"] = _whole_opening(world, tmp, characters)
    out["load_average_before"] = load_before
    out["load_average"] = os.getloadavg()
    return out


#: what the page asks for on opening (after ``/api/world`` answers 200)
OPENING = ("page", "world", "network", "history", "runs")
#: the page's DOM node count, once it showed the character count (``_browser_count``)
_DOM_NODES: list[int] = []


def _browser_count(url: str, characters: int) -> float | None:
    """Seconds until chromium shows the world's character count (``None``: no browser)."""
    return _timed_page(
        url,
        (f"#people-count:text-is('{characters}')", "#network-note:not(:empty)"),
        count_nodes=True,
    )


def _whole_opening(world: Path, cwd: str, characters: int) -> float | None:
    """Seconds from ``sim serve``'s spawn until chromium shows the world's character
    count and its network (``None``: no browser): the browser is launched first, and the
    page opened as soon as the address is printed (it shows the first look of a big
    world while it loads)."""
    spawned: list[subprocess.Popen[str]] = []

    def spawn() -> str:
        server, url = _serve(world, cwd)
        spawned.append(server)
        return url

    try:
        return _timed_page(
            spawn, (f"#people-count:text-is('{characters}')", "#network-note:not(:empty)")
        )
    finally:
        for server in spawned:
            server.terminate()
            server.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--characters", type=int, default=1000)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="ticks timed each way")
    parser.add_argument(
        "--open-only",
        action="store_true",
        help="only how long a big world (no tick run) takes to open (bench/make_world.py)",
    )
    parser.add_argument("--places", type=int, default=500, help="with --open-only")
    parser.add_argument(
        "--world", type=Path, default=None, help="with --open-only: a world already made"
    )
    args = parser.parse_args()
    if args.open_only:
        print(json.dumps(_opening(args.characters, args.places, args.world), indent=1))
        return
    with tempfile.TemporaryDirectory(prefix="sim-bench-serve-") as tmp:
        world = Path(tmp) / "world"
        built = build(world, args.characters, args.ticks)
        server, url = _serve(world, tmp)
        try:
            base, _, token = url.partition("/?token=")
            headers = {"Authorization": f"Bearer {token}"}
            cold = _open_page(base, headers, args.ticks)
            warm = [_open_page(base, headers, args.ticks) for _ in range(5)]
            _, world_bytes = _get(base + "/api/world", headers)
            _, tick_bytes = _get(base + f"/api/ticks/{args.ticks}", headers)
            browser = _browser(url, args.ticks)
            event = _event_latency(base, token, world)
        finally:
            server.terminate()
            server.wait(timeout=60)
        cost = _tick_cost(world, tmp, args.rounds)
    result: dict[str, Any] = {
        **built,
        "cold": cold,
        "warm_median": {k: statistics.median(w[k] for w in warm) for k in cold},
        "world_bytes": world_bytes,
        "tick_bytes": tick_bytes,
        "browser_s": browser,
        "event_latency_s": event,
        "tick_cost": cost,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
