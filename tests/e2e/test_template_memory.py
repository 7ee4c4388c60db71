"""A world's template cannot exhaust memory: `sim check` refuses it fast, naming the file.

Each template asked one operation for gigabytes (a join, a format, a repeated `~`) before
its size was estimated first: `sim check` grew to 3 GB and more, then printed an empty error.
The child's peak memory is measured by a small parent of its own, so that other tests'
children do not count.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import copy_demo

#: a child that runs `sim check` and prints its exit code and its peak memory (KiB)
MEASURE = """
import resource, subprocess, sys
done = subprocess.run([sys.executable, "-m", "sim", *sys.argv[1:]], capture_output=True)
sys.stderr.buffer.write(done.stderr)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(done.returncode, peak)
"""

#: far below what each payload asked for (1.5 GB to 300 GB), far above sim's own ~60 MB
MAX_PEAK_KIB = 300 * 1024


@pytest.mark.parametrize(
    "source",
    [
        "{{ range(5000)|join('x'*300000)|length }}",
        "{{ 'x'*10**9 }}",
        "{{ ('%s'*1000)|format(*(('x'*300000,)*1000))|length }}",
        "{{ range(300)|join(range(300)|join('x'*1000))|length }}",
        "{% set x = 'x'*300000 %}" + "{% set x = x ~ x %}" * 12 + "{{ x|length }}",
    ],
)
def test_sim_check_refuses_a_template_that_asks_for_gigabytes(tmp_path: Path, source: str) -> None:
    world = copy_demo(tmp_path / "w")
    (world / "prompts").mkdir()
    (world / "prompts" / "intentions.md").write_text(source + "\n")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, "check", "--world", str(world)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    code, peak = (int(n) for n in done.stdout.split())
    assert code == 2, done.stderr
    assert peak < MAX_PEAK_KIB, f"sim check peaked at {peak // 1024} MB"
    assert time.monotonic() - started < 60
    message = done.stderr.strip().splitlines()[-1]
    assert "prompts/intentions.md:1: error: " in message
    assert "over the template limit of 400,000" in message, message
    assert "Traceback" not in done.stderr
