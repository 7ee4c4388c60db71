"""Three ticks of the demo world on a real model (``make bench-model``, or
``python -m bench.real_model`` from the repository root).

llama-cpp-python's server running Gemma 3 270M (``.venv-model``, as ``make test-model``)
on this machine; the ``chat`` provider with default settings except the model and the
base URL (``structured_output`` ``auto`` and ``max_concurrency`` as they come: the engine
finds the form and the capacity the server takes). Each tick is one ``sim tick``, timed
from the outside; the world is read before and after. Per tick (``bench/references.py``
says what a reference is):

- valid references: the share of every id in every answer the model gave (re-asked ones
  included), and of those in the answers the tick used;
- characters present at a resolved location who got an outcome;
- moves; re-asks (attempts re-asked after a schema error) and answers cut at their cap;
- tokens and the tick's wall time.

Writes the section between the markers in bench/RESULTS.md (``make bench`` keeps it).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.references import Snapshot, applied, every_answer, moves, outcomes_given
from sim.errors import LogError
from sim.testing.llama_server import MODEL, LlamaServer, model_python
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log
from sim.ticklog.records import CallRecord, record_data

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
START, END = "<!-- real-model:start -->", "<!-- real-model:end -->"
TICKS = 3


def prepare(base_url: str, scratch: Path) -> Path:
    """A scratch copy of the demo world configured for the local server."""
    world = Path(shutil.copytree(ROOT / "worlds" / "demo", scratch / "demo"))
    shutil.rmtree(world / ".sim", ignore_errors=True)
    lines = ["[llm]", 'provider = "chat"', f'base_url = "{base_url}"']
    for phase in ("phase1", "phase2a", "phase2b", "phase4"):
        lines += [f"[{phase}]", f'model = "{MODEL}"']
    (world / "config.toml").write_text("\n".join(lines) + "\n")
    return world


def calls_of(world: Path, number: int) -> list[dict[str, Any]]:
    try:  # committed (compressed) or not (plain): the one reader takes both
        records = read_log(log_path(world, number)).written_records()
    except LogError:  # the tick wrote no log
        return []
    return [record_data(r) for r in records if isinstance(r, CallRecord)]


def tick(world: Path, number: int) -> dict[str, Any]:
    """Run tick ``number`` and measure it."""
    before = Snapshot.read(world)
    started = time.perf_counter()
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "sim", "tick", "--world", str(world)),
            "--trust-world-config",  # its config routes to the local model server
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    after = Snapshot.read(world)
    calls = calls_of(world, number)
    every = every_answer(calls, before)
    used = applied(calls, before)
    got, present = outcomes_given(calls, before)
    attempts = [a for c in calls for a in c.get("attempts") or ()]
    reasked = sum(
        1
        for c in calls
        for a in (c.get("attempts") or ())[:-1]
        if a.get("error_code") == "schema_error"
    )
    return {
        "tick": number,
        "committed": proc.returncode == 0,
        "calls": len(calls),
        "failed": sum(c["error_code"] is not None for c in calls),
        "failures": sorted({c["error_code"] for c in calls if c["error_code"]}),
        "refs_valid": every.valid,
        "refs_total": every.total,
        "applied_valid": used.valid,
        "applied_total": used.total,
        "invalid_sample": every.invalid[:8],
        "outcomes_got": got,
        "present": present,
        "moves": moves(before, after),
        "reasked": reasked,
        "cut": sum(a.get("error_code") == "incomplete" for a in attempts),
        "input_tokens": sum(c["usage"]["input_tokens"] for c in calls),
        "output_tokens": sum(c["usage"]["output_tokens"] for c in calls),
        "wall": wall,
        "exit": proc.returncode,
        "notes": [line for line in proc.stdout.splitlines() if line.startswith("note:")],
        "stderr": proc.stderr[-500:] if proc.returncode else "",
    }


def _share(valid: int, total: int) -> str:
    return f"{valid}/{total} ({100 * valid / total:.0f}%)" if total else "none"


def section(rows: list[dict[str, Any]], load: str) -> str:
    notes = sorted({note for r in rows for note in r["notes"]})
    out = [
        START,
        "## Real model: three demo ticks on llama-cpp-python + Gemma 3 270M (CPU)",
        "",
        f"Written by `make bench-model` (bench/real_model.py) on {platform.machine()}, "
        f"Python {platform.python_version()}, {_cores()} cores",
        f"shared with other work ({load}). The `chat` provider, default settings except model",
        "and base URL; one `sim tick` per row, timed from outside (process start included).",
        "Valid references: ids that name what the request offered (bench/references.py), in",
        "every answer the model gave (re-asked ones included) and in the answers the tick used.",
        "Outcomes: characters present at a resolved location that the game master gave one.",
        "Re-asks: attempts re-asked after a schema error; cut: answers that ran to their cap.",
        "",
        "| tick | committed | calls | failed | valid refs (every answer) | valid refs (used) "
        "| present given an outcome | moves | re-asks | cut at cap | input tok | output tok "
        "| tick wall |",
        "| ---: | :---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: |",
    ]
    for r in rows:
        failed = f"{r['failed']} ({', '.join(r['failures'])})" if r["failed"] else "0"
        out.append(
            f"| {r['tick']} | {'yes' if r['committed'] else 'no'} | {r['calls']} | {failed} "
            f"| {_share(r['refs_valid'], r['refs_total'])} "
            f"| {_share(r['applied_valid'], r['applied_total'])} "
            f"| {r['outcomes_got']} of {r['present']} | {r['moves']} | {r['reasked']} "
            f"| {r['cut']} | {r['input_tokens']:,} | {r['output_tokens']:,} | {r['wall']:.0f} s |"
        )
    if notes:
        out += ["", "The engine's notes on the server:", ""]
        out += [f"- `{note}`" for note in notes]
    invalid = [f"{field} = {value}" for r in rows for field, value in r["invalid_sample"]]
    if invalid:
        out += ["", "Some invalid references: " + "; ".join(invalid[:10]) + "."]
    out.append(END)
    return "\n".join(out)


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} at the end, {five:.1f} over 5 min"


def _cores() -> int:
    return os.cpu_count() or 0


def write(text: str) -> None:
    current = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else ""
    if START in current and END in current:
        head, _, rest = current.partition(START)
        _, _, tail = rest.partition(END)
        current = head + text + tail
    else:
        current = current.rstrip("\n") + "\n\n" + text + "\n"
    RESULTS.write_text(current, encoding="utf-8")


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as scratch, LlamaServer(model_python(ROOT)) as url:
        world = prepare(url, Path(scratch))
        for number in range(1, TICKS + 1):
            row = tick(world, number)
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
            write(section(rows, _load()))  # after each tick: a cut-short run keeps its rows
            if not row["committed"]:  # the next run would resume this tick
                break
    print(section(rows, _load()))


if __name__ == "__main__":
    main()
