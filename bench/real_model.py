"""One tick of the demo world on a real model, at concurrency 1 and 2 (``make bench-model``,
or ``python -m bench.real_model`` from the repository root).

llama-cpp-python's server running Gemma 3 270M (``.venv-model``, as ``make test-model``)
on this machine; the ``chat`` provider with default settings except the model, the base
URL and ``structured_output = "auto"``. For each concurrency: calls, failures, tokens,
tick wall time, and how many calls needed schema feedback (an attempt rejected by
validation, then re-asked with the error). Writes the section between the markers in
bench/RESULTS.md (``make bench`` keeps it).
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

from sim.errors import LogError
from sim.testing.llama_server import MODEL, LlamaServer, model_python
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log
from sim.ticklog.records import CallRecord, record_data

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
START, END = "<!-- real-model:start -->", "<!-- real-model:end -->"


def tick(base_url: str, concurrency: int, scratch: Path) -> dict[str, Any]:
    world = Path(shutil.copytree(ROOT / "worlds" / "demo", scratch / f"demo-c{concurrency}"))
    shutil.rmtree(world / ".sim", ignore_errors=True)
    lines = [
        "[llm]",
        'provider = "chat"',
        f'base_url = "{base_url}"',
        'structured_output = "auto"',
        f"max_concurrency = {concurrency}",
    ]
    for phase in ("phase1", "phase2a", "phase2b", "phase4"):
        lines += [f"[{phase}]", f'model = "{MODEL}"']
    (world / "config.toml").write_text("\n".join(lines) + "\n")
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
    try:  # committed (compressed) or not (plain): the one reader takes both
        records = read_log(log_path(world, 1)).written_records()
    except LogError:  # the tick wrote no log
        records = []
    calls = [record_data(r) for r in records if isinstance(r, CallRecord)]
    feedback = [
        c
        for c in calls
        if any(a.get("error_code") == "schema_error" for a in c.get("attempts", [])[:-1])
        or (c["error_code"] == "schema_error")
    ]
    return {
        "concurrency": concurrency,
        "committed": proc.returncode == 0,
        "calls": len(calls),
        "failed": sum(c["error_code"] is not None for c in calls),
        "failures": sorted({c["error_code"] for c in calls if c["error_code"]}),
        "attempts": sum(len(c.get("attempts", [])) for c in calls),
        "input_tokens": sum(c["usage"]["input_tokens"] for c in calls),
        "output_tokens": sum(c["usage"]["output_tokens"] for c in calls),
        "schema_feedback": len(feedback),
        "wall": wall,
        "exit": proc.returncode,
        "stderr": proc.stderr[-500:] if proc.returncode else "",
    }


def section(rows: list[dict[str, Any]]) -> str:
    out = [
        START,
        "## Real model: one demo tick on llama-cpp-python + Gemma 3 270M (CPU)",
        "",
        f"Written by `make bench-model` (bench/real_model.py) on {platform.machine()}, "
        f"Python {platform.python_version()}, {_cores()} cores",
        "shared with other work. The `chat` provider, default settings except model, base URL and",
        '`structured_output = "auto"` (it switched to `json_object_schema` after one refused',
        "request), `max_concurrency` as shown; the server generates one request at a time.",
        "Schema feedback: calls with an answer rejected by validation and re-asked with the",
        "error (the grammar makes this rare; cut-short answers count as `incomplete`).",
        "Output tokens vary run to run (sampling at the phases' temperatures); one answer run",
        "to its cap (900 tokens for resolution) dominates a tick's wall time, so the two rows",
        "differ more by that than by the concurrency, which a one-slot server cannot use.",
        "",
        "| concurrency | committed | calls | failed | attempts | input tok | output tok "
        "| schema feedback | tick wall |",
        "| ---: | :---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        failed = f"{r['failed']} ({', '.join(r['failures'])})" if r["failed"] else "0"
        out.append(
            f"| {r['concurrency']} | {'yes' if r['committed'] else 'no'} | {r['calls']} "
            f"| {failed} | {r['attempts']} | {r['input_tokens']:,} | {r['output_tokens']:,} "
            f"| {r['schema_feedback']} of {r['calls']} | {r['wall']:.0f} s |"
        )
    out.append(END)
    return "\n".join(out)


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
        for concurrency in (1, 2):
            row = tick(url, concurrency, Path(scratch))
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
    text = section(rows)
    print(text)
    write(text)


if __name__ == "__main__":
    main()
