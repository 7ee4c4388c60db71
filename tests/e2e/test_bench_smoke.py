"""A tiny run of the offline benchmark code, so `make bench` cannot rot unnoticed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench.http import cpu_per_call, efficiency
from bench.make_world import make_world
from bench.offline import depth_cost, overhead
from bench.process import efficiency as process_efficiency
from bench.process import imports, scale
from bench.regression import PINNED, ROOT, ab, has_commit
from sim.storage import Storage


def test_synthetic_world_is_valid_and_reproducible(tmp_path: Path) -> None:
    make_world(tmp_path / "a", 50, 5, seed=3)
    make_world(tmp_path / "b", 50, 5, seed=3)
    world = Storage(tmp_path / "a").load()
    assert len(world.characters) == 50 and len(world.locations) == 5
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.json"))
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


def test_overhead_and_depth_scenarios_report_their_figures() -> None:
    result = overhead(60)
    assert result["calls"] >= 60 + 2 * 6  # intentions, resolution, narrative (+ memory)
    assert result["wall_s"] > 0 and result["peak_rss_mib"] > 0
    assert result["model_s"] < result["phases_s"]
    shallow, deep = depth_cost(0, characters=20, ticks=3), depth_cost(2, characters=20, ticks=3)
    assert deep["input_tokens_per_character_tick"] > shallow["input_tokens_per_character_tick"]


def test_http_scenarios_report_their_figures() -> None:
    """Scenarios 2 and 3 at tiny sizes: a stub server process, the openai provider, and the
    bare SDK loop all run end to end, over http and https (no timing asserts: benchmarks
    are not timed tests)."""
    before = os.environ.get("SSL_CERT_FILE")
    result = efficiency(20, 0.01, 8)
    assert result["calls"] == sum(p["calls"] for p in result["phases"]) >= 20 + 2 * 2
    assert result["served"] >= result["calls"]
    assert result["ideal_s"] > 0 and result["efficiency"] > 0
    by_scheme = cpu_per_call(20, 0.01, 8, repeats=1)
    assert set(by_scheme) == {"http", "https"}
    for scheme, cpu in by_scheme.items():
        assert cpu["scheme"] == scheme and cpu["calls"] == result["calls"]
        assert {"engine", "engine_sdk", "bare_default"} <= set(cpu["us_per_call"])
        assert all(value > 0 for value in cpu["us_per_call"].values())
        assert cpu["ratio"]["bare_default"] == 1.0 and cpu["ratio"]["engine"] > 0
    assert os.environ.get("SSL_CERT_FILE") == before  # the https run's setting is undone


def test_history_scenario_reports_its_figures(tmp_path: Path) -> None:
    """Scenario 8 at a tiny size: build, measure each command in its own process, repeat."""
    from bench.history import build, copies, measure

    world = tmp_path / "w"
    assert build(world, 12, 2)["ticks"] == 2
    result = measure(world, ["log --tick all", "usage --by entity"])
    assert result["kb_per_character_tick"] > 0 and result["summary_bytes"] > 0
    assert set(result["commands"]) == {"log --tick all", "usage --by entity"}
    assert all(m["peak_rss_mib"] > 0 for m in result["commands"].values())
    assert copies(world, tmp_path / "longer", 3) == {"ticks": 6}
    assert measure(tmp_path / "longer", ["check"])["ticks"] == 6


def test_whole_process_scenarios_report_their_figures() -> None:
    """Scenarios 5 and 6 at tiny sizes: ``sim tick`` child processes, offline and against
    a stub server process (no timing asserts)."""
    run = scale(40)
    assert run["calls"] >= 40 + 2 * 4
    assert run["wall_s"] > 0 and run["cpu_s"] > 0 and run["peak_rss_mib"] > 0
    assert {"load", "commit"} <= set(run["timings"])
    found = imports(runs=1)["import_cpu_s"]
    assert set(found) == {"cli", "offline tick", "openai tick", "sim --help, beyond import click"}
    assert all(seconds >= 0 for seconds in found.values())
    whole = process_efficiency(20, 0.01, 8)
    assert whole["calls"] >= 20 + 2 * 2 and whole["ideal_s"] > 0
    assert whole["process_wall_s"] >= whole["tick_wall_s"] > 0
    assert 0 < whole["process_efficiency"] <= whole["tick_efficiency"]


def test_workers_scenario_reports_its_figures(tmp_path: Path) -> None:
    """Scenario 12 at a tiny size: ``sim tick --workers 1`` and ``2`` child processes on
    copies of one world, all made before the first run and left in the scratch folder for
    the caller, which must end the same (no timing asserts)."""
    from bench.process import workers

    run = workers(60, 1, tmp_path)
    assert sorted(p.name for p in (tmp_path / "60").iterdir()) == ["base", "w1-0", "w2-0"]
    assert run["identical"] is True
    assert [len(run["runs"][n]) for n in ("1", "2")] == [1, 1]
    assert all(r["wall_s"] > 0 and r["peak_rss_mib"] > 0 for n in "12" for r in run["runs"][n])
    # the bare flush baseline wrote every entity file of the world (60 characters, 6 places)
    assert run["floor"]["files"] == 66 and run["floor"]["wall_s"] > 0
    # the row whose tick holds conversations, chosen over the world by `sim tick`
    talked = workers(60, 1, tmp_path, "conversation")
    assert (tmp_path / "60-conversation" / "w2-0").is_dir() and talked["identical"] is True
    timings = talked["runs"]["2"][0]["timings"]
    assert "conversation" in timings
    # the row whose tick holds a phase the world declares, sharded too
    voted = workers(60, 1, tmp_path, "declared")
    assert voted["identical"] is True and "vote" in voted["runs"]["2"][0]["timings"]
    assert not any("one process" in note for note in voted["runs"]["2"][0]["notes"])
    # the row whose characters message their ties, delivered across shards
    sent = workers(60, 1, tmp_path, "messages")
    assert sent["identical"] is True
    assert not any("one process" in note for note in sent["runs"]["2"][0]["notes"])
    # the row with a package's phase over the whole world, run by `sim tick` alone
    counted = workers(60, 1, tmp_path, "package")
    assert counted["identical"] is True and "census" in counted["runs"]["2"][0]["timings"]
    assert not any("one process" in note for note in counted["runs"]["2"][0]["notes"])


def test_pack_scenario_reports_its_figures(tmp_path: Path) -> None:
    """Scenario 15 at a tiny size: the same world in folders and packed, each ticked by
    ``sim tick --workers 1`` and ``2``, every copy made first and ending the same (the
    packed ones unpacked to compare; no timing asserts)."""
    from bench.process import packed

    run = packed(60, 1, tmp_path)
    made = sorted(p.name for p in (tmp_path / "60-packed").iterdir())
    assert made == ["base", "base-pack", "w1-folders-0", "w1-pack-0", "w2-folders-0", "w2-pack-0"]
    assert (tmp_path / "60-packed" / "base-pack" / "world.pack").is_file()
    assert run["identical"] is True and run["pack_bytes"] > 0
    assert sorted(run["runs"]) == ["folders-1", "folders-2", "pack-1", "pack-2"]
    for runs in run["runs"].values():
        assert len(runs) == 1 and runs[0]["wall_s"] > 0 and "commit" in runs[0]["timings"]


def test_mind_scenario_reports_its_figures() -> None:
    from bench.mind import cache_memory, retrieval_cpu, token_cost

    cpu = retrieval_cpu(cells=60, characters=3)
    assert cpu["lexical"]["next_ms"] > 0 and cpu["embeddings"]["next_ms"] > 0
    cost = token_cost(characters=10, ticks=2)
    assert cost["window"]["input_tokens_per_character_tick"] > 0
    assert cost["retrieve"]["input_tokens_per_character_tick"] > 0
    cache = cache_memory(0.2, dimensions=64)
    assert cache["vectors"] > 0 and cache["peak_mib"] >= cache["loaded_mib"] > 0


def test_a_partial_run_drops_the_notes_of_runs_whose_figures_it_replaces() -> None:
    """RESULTS.md's header keeps a note per partial run only while a figure it describes
    is still in the file."""
    from bench.run import _without_notes_for

    def note(numbers: str, day: str) -> list[str]:
        return [f"- Section {numbers} (names) re-run alone on {day}: Machine: m.", "  Load.", ""]

    head = [
        "# Benchmark results",
        "",
        *note("3, 2, 6", "d1"),
        *note("2, 6", "d2"),
        *note("10", "d3"),
        *note("3", "d4"),
    ]
    kept = _without_notes_for(head, {"10"})
    days = [line.rsplit(" on ", 1)[1].split(":")[0] for line in kept if line.startswith("- ")]
    # d1: 3 re-run by d4, 2 and 6 by d2; d3: by this run; d2 and d4 still hold figures
    assert days == ["d2", "d4"]
    assert "  Load." in kept and "" in kept and "\n".join(kept).count("\n\n\n") == 0
    assert _without_notes_for(head, {"2", "3", "6", "10"})[:2] == ["# Benchmark results", ""]


def _bench_serve(tmp_path: Path, *args: str) -> dict[str, Any]:
    """``python -m bench.serve ARGS`` in ``tmp_path``: its JSON result."""
    import json
    import sys

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "bench.serve", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_serve_benchmark_reports_its_figures(tmp_path: Path) -> None:
    """bench/serve.py on a tiny world: every figure is there and positive."""
    result = _bench_serve(tmp_path, "--characters", "20", "--ticks", "2")
    assert result["ticks"] == 2 and result["tick_bytes"] > 0
    assert all(v > 0 for v in result["cold"].values())
    assert 0 < result["event_latency_s"] < 30


def test_the_serve_benchmark_times_a_worlds_opening(tmp_path: Path) -> None:
    """``bench/serve.py --open-only`` on a tiny world: the address, the first ``/api/world``
    answer and its first 200, in that order, and the server's peak memory."""
    result = _bench_serve(tmp_path, "--open-only", "--characters", "30", "--places", "4")
    assert result["characters"] == 30 and result["places"] == 4
    assert 0 < result["startup_s"] <= result["first_world_answer_s"] <= result["world_loaded_s"]
    assert result["world_bytes"] > 0 and result["server_peak_rss_mib"] > 0


def test_regression_scenario_runs_the_pinned_commit_and_this_tree() -> None:
    """Scenario 12 at a tiny size: the pinned commit checked out by ``git worktree add``,
    each tree's own ``sim`` imported by its child, the worktree removed afterwards."""
    if not has_commit(PINNED):
        pytest.skip(f"needs a git checkout of sim holding {PINNED} (scenario 13 checks it out)")
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True, check=True
    )
    result = ab(30, 1)
    assert result["commit"].startswith(PINNED) and result["against"] == "this tree"
    assert result["calls"]["pinned"] == result["calls"]["current"] > 30
    assert all(len(result[k][tree]) == 1 for k in ("wall_s", "cpu_s") for tree in result["calls"])
    assert result["cpu_ratio"] > 0 and result["wall_ratio"] > 0
    after = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True, check=True
    )
    assert after.stdout == listed.stdout  # the temporary worktree is gone
