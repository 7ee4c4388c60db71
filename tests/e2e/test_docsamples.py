"""Every sample of real output in the README and docs/*.md is generated
(`python -m tools.docsamples`, `make docs`), and a sample that drifted from what the code
prints now fails here: the export sample, docs/tuning.md's tables and docs/cli-json.md
had gone stale although the offline model is deterministic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from tools.docsamples import MARK, block, doc_files, drifted, mask_wall, rewrite, used


@pytest.mark.slow
def test_every_sample_in_the_docs_is_what_the_code_prints_now() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tools.docsamples", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_docs_mark_their_samples() -> None:
    names = {name for found in used(doc_files()).values() for name in found}
    assert {"readme-demo", "readme-export", "analysis-export", "cli-json"} <= names
    assert {"tune-resolution", "tune-intentions", "tune-stub", "tune-estimate"} <= names


def test_a_drifted_sample_is_named_with_a_diff_and_rewritten(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "Intro.\n\n<!-- sample:a -->\n```\nold output\n```\n<!-- /sample -->\n\n"
        "Inline <!-- sample:b -->$0.10<!-- /sample --> here.\n"
    )
    fresh = {"a": block("new output   \n"), "b": "$0.20"}
    stale = drifted([doc], fresh)
    assert list(stale) == [doc]
    assert "-old output\n+new output\n" in stale[doc] and "+Inline" in stale[doc]
    doc.write_text(rewrite(doc.read_text(), fresh, str(doc)))
    assert drifted([doc], fresh) == {}
    assert [m["name"] for m in MARK.finditer(doc.read_text())] == ["a", "b"]
    with pytest.raises(KeyError, match="no scenario gives the sample 'b'"):
        rewrite(doc.read_text(), {"a": fresh["a"]}, str(doc))


def test_wall_times_are_masked_keeping_the_columns() -> None:
    row = "    0       121       0      84632    $0.0000    0.47s         20746        0.00"
    assert mask_wall(row) == (
        "    0       121       0      84632    $0.0000    #.##s         20746        0.00"
    )
    assert mask_wall("total  18   wall 12.09s") == "total  18   wall #.##s"
    assert (
        mask_wall("     5     24    $0.0000     0.24s\n") == "     5     24    $0.0000     #.##s\n"
    )
