"""Run every benchmark scenario and write bench/RESULTS.md (``make bench``).

Benchmarks are measurements, not tests: each figure is written with its target and the
ratio, on the machine it ran on. ``--smoke`` runs tiny sizes only (for CI).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from datetime import date
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"


def child(module: str, *args: str) -> dict[str, Any]:
    """Run ``python -m bench.<module> args`` in a fresh process; return its JSON line."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"bench.{module} {' '.join(args)} failed:\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def machine() -> list[str]:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = ", ".join(
        f"{name} {metadata.version(name)}" for name in ("sim", "pydantic", "orjson", "openai")
    )
    return [
        f"- Machine: {os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}",
        f"- Python {platform.python_version()}; {versions}",
        f"- Date: {date.today().isoformat()}",
    ]


def ratio(target: float, actual: float) -> str:
    return f"{target / actual:.2f}" if actual else "n/a"


def scenario_overhead(smoke: bool) -> list[str]:
    sizes = (100, 1000) if smoke else (1000, 10000)
    runs = {n: child("offline", "overhead", str(n)) for n in sizes}
    small, big = runs[sizes[0]], runs[sizes[1]]
    lines = [
        "## 1. Engine overhead, offline provider (one tick; locations = characters / 10)",
        "",
        "| characters | calls | wall | load | phases | of which offline model | commit "
        "| engine per call | peak RSS |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n, r in runs.items():
        lines.append(
            f"| {n:,} | {r['calls']:,} | {r['wall_s']:.2f} s | {r['load_s']:.2f} s "
            f"| {r['phases_s']:.2f} s | {r['model_s']:.2f} s | {r['commit_s']:.2f} s "
            f"| {r['engine_us_per_call']:.0f} µs | {r['peak_rss_mib']:.0f} MiB |"
        )
    scale = big["wall_s"] / small["wall_s"]
    lines += [
        "",
        f"- Target: {sizes[1]:,} characters in ≤ 10 s wall → {big['wall_s']:.2f} s "
        f"(ratio target/actual {ratio(10, big['wall_s'])}).",
        f"- Target: peak RSS ≤ 1024 MiB → {big['peak_rss_mib']:.0f} MiB "
        f"(ratio {ratio(1024, big['peak_rss_mib'])}).",
        f"- Target: 10× the characters costs ≤ 11× the time → {scale:.1f}× "
        f"(ratio {ratio(11, scale)}).",
        "",
    ]
    return lines


def scenario_depth(smoke: bool) -> list[str]:
    depths = (0, 2) if smoke else (0, 2, 4)
    rows = [child("offline", "depth", str(d)) for d in depths]
    lines = [
        "## 4. Chain depth: phase-1 input tokens per character-tick (offline, 5 ticks)",
        "",
        "| depth | input tokens per character-tick (mean of 5 ticks) | at tick 5 | vs depth 0 |",
        "| ---: | ---: | ---: | ---: |",
    ]
    base = rows[0]["input_tokens_per_character_tick"]
    for r in rows:
        lines.append(
            f"| {r['depth']} | {r['input_tokens_per_character_tick']:.0f} "
            f"| {r['last_tick_per_character']:.0f} "
            f"| {r['input_tokens_per_character_tick'] / base:.2f}× |"
        )
    lines += [
        "",
        "A window of depth d re-sends the last d exchanges (input and answer) with every "
        "call, so the cost of memory grows linearly in d once the chain is full.",
        "",
    ]
    return lines


SCENARIOS: dict[str, Callable[[bool], list[str]]] = {
    "overhead": scenario_overhead,
    "depth": scenario_depth,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; do not write RESULTS.md")
    parser.add_argument("--only", choices=sorted(SCENARIOS), action="append")
    args = parser.parse_args()
    lines = ["# Benchmark results", "", *machine(), ""]
    lines += [
        "Written by `make bench` (bench/run.py). Each figure is measured in a fresh process;",
        "ratios are target / actual (≥ 1 meets the target) or ideal / actual.",
        "",
    ]
    for name in args.only or list(SCENARIOS):
        print(f"running {name}...", file=sys.stderr)
        lines += SCENARIOS[name](args.smoke)
    text = "\n".join(lines)
    if args.smoke:
        print(text)
    else:
        RESULTS.write_text(text, encoding="utf-8")
        print(text)
        print(f"\nwritten to {RESULTS.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
