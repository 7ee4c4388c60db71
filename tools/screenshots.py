"""The docs' screenshots, taken in Debian's chromium driven by Playwright (``make docs``).

    python -m tools.screenshots            # docs/serve.png and docs/report.png

Each is of the demo world after a few offline ticks, on a scratch copy: ``sim serve``'s
page (docs/serve.md) and ``sim report``'s (docs/report.md). Without chromium or Playwright
it says so and writes nothing (exit 0: the text samples do not need it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


def _sim(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "sim", *args], check=True, env=env, capture_output=True)


def main() -> int:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("screenshots: playwright is not installed (the dev extra); skipped")
        return 0
    if chromium is None:
        print("screenshots: chromium is not installed (apt-get install chromium); skipped")
        return 0
    with tempfile.TemporaryDirectory(prefix="sim-shots-") as tmp:
        world = Path(tmp) / "demo"
        shutil.copytree(REPO / "worlds" / "demo", world, ignore=shutil.ignore_patterns(".sim"))
        _sim("tick", "--world", str(world), "--ticks", "8")
        _sim("report", "--world", str(world), "--out", str(Path(tmp) / "report.html"))
        server = subprocess.Popen(
            [sys.executable, "-m", "sim", "serve", "--world", str(world), "--read-only"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:
            assert server.stdout is not None
            url = server.stdout.readline().strip()
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium, args=ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(url)
                page.wait_for_selector("#scenes .scene")
                page.wait_for_selector("#charts svg")
                page.locator("#people button").first.click()
                page.wait_for_selector("#inspector dl")
                page.screenshot(path=str(REPO / "docs" / "serve.png"))
                page.goto((Path(tmp) / "report.html").as_uri())
                page.wait_for_selector("#map")
                page.screenshot(path=str(REPO / "docs" / "report.png"))
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=60)
    print("screenshots: wrote docs/serve.png and docs/report.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
