"""Whole-process benchmarks: ``sim tick`` as a user runs it, start-up included.

``python -m bench.process scale N`` — one offline tick of a fresh N-character world
(``bench/make_world.py``, locations = N / 10) by a ``sim tick`` child process: its wall
time from spawn to exit, its CPU and its peak RSS (``wait4``), and the tick's own timings.

``python -m bench.process workers N REPEATS`` — the same, by ``sim tick --workers 1`` and
``--workers 2`` alternating, REPEATS pairs, each on a copy of one world (the files compared).

``python -m bench.process imports`` — CPU seconds a fresh Python spends importing what
``sim tick`` needs (the best of several runs, less a bare interpreter's start-up).

``python -m bench.process efficiency N LATENCY CONCURRENCY`` — one tick of N characters by a
``sim tick`` child process with provider ``openai`` against ``sim stub-server`` at LATENCY:
ideal (Σ over phases ⌈calls / concurrency⌉ × latency) / the whole process's wall time.

Each prints one JSON object.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.make_world import make_world

ROOT = Path(__file__).resolve().parents[1]
KEY_ENV = "SIM_BENCH_STUB_KEY"


def run_child(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``args``; its wall time (spawn to exit), CPU and peak RSS from ``wait4``."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=env or dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{err.decode()[-3000:]}")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,
        "stdout": out.decode(),
    }


def sim_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "sim", *args]


def child_env() -> dict[str, str]:
    """The children's environment: sim importable, the stub's key, and bytecode caches
    on as for any installed program (``PYTHONDONTWRITEBYTECODE`` would make every start
    compile sim's modules from source again, ~0.2 s)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{KEY_ENV: "sk-stub"})
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def compile_sim() -> None:
    """Write sim's bytecode caches once, so that no measured start-up compiles them."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(ROOT / "sim")],
        check=True,
        env=child_env(),
        stdout=subprocess.DEVNULL,
    )


def tick_document(stdout: str) -> dict[str, Any]:
    """The ``--json`` document of the (one) tick."""
    doc: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return doc


def scale(characters: int) -> dict[str, Any]:
    """One offline tick of a fresh world by a ``sim tick`` process."""
    with tempfile.TemporaryDirectory(prefix="sim-bench-") as tmp:
        world = Path(tmp) / "world"
        make_world(world, characters, max(1, characters // 10), seed=1)
        os.sync()  # the generated world on disk first: the tick does not pay for it
        run = run_child(
            sim_command("tick", "--world", str(world), "--json"), Path(tmp), child_env()
        )
    doc = tick_document(run.pop("stdout"))
    return {"characters": characters, "calls": doc["calls"], "timings": doc["timings"], **run}


#: ``workers(..., variant="conversation")``: the tick with the ``conversation`` phase, whose
#: conversations (up to a thousand) the coordinator chooses over the world at a barrier
CONVERSATION = (
    "--set",
    'tick.phases=["intentions","conversation","resolution","narrative","apply","memory"]',
    "--set",
    "conversation.max_conversations_per_tick=1000",
)


#: ``workers(..., variant="declared")``: a phase the world declares per character after
#: the moves (``[phases.vote]``), whose input names whoever is present with what they
#: last remember: before it the shards exchange those who share a place across them
DECLARED = {
    "prompts/vote.md": "You are {{ character.identity.name }}. Say how you will vote.\n",
    "prompts/vote.input.md": (
        "{{ character.identity.name }} at {{ location.identity.name }}, with "
        "{% for p in present %}{{ p.identity.name }} ("
        "{{ p.memory.cells[-1].text if p.memory.cells else '' }}) {% endfor %}\n"
    ),
    "schemas/vote.json": json.dumps(
        {
            "title": "Vote",
            "type": "object",
            "properties": {"stance": {"type": "string", "enum": ["sell", "keep", "undecided"]}},
            "required": ["stance"],
            "additionalProperties": False,
        }
    ),
    "config.toml": (
        '[tick]\nphases = ["intentions", "resolution", "narrative", "apply", "vote", "memory"]\n'
        '[phases.vote]\nper = "character"\ninstructions = "prompts/vote.md"\n'
        'input = "prompts/vote.input.md"\nschema = "schemas/vote.json"\n'
        'writes = { "state.stance" = "stance" }\n'
    ),
}


#: ``workers(..., variant="messages")``: ``[messages]`` on, each character tied to the
#: characters before and after it (by id: at other places, often another shard's), so a
#: ``message`` intention reaches them wherever they are (``with_ties``)
MESSAGES = "\n[messages]\nenabled = true\n"


def with_ties(world: Path) -> None:
    """Tie each character of ``world`` to the ones before and after it by id (a ring of
    acquaintances, as ``sim init --network ring`` makes), in its file."""
    from sim.network import NETWORK_TIE

    paths = sorted((world / "characters").glob("*.json"))
    ids = [path.stem for path in paths]
    for i, path in enumerate(paths):
        data = orjson.loads(path.read_bytes())
        near = (ids[i - 1], ids[(i + 1) % len(ids)])
        data["relationships"] = {other: dict(NETWORK_TIE) for other in sorted(set(near))}
        path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
    with (world / "config.toml").open("a", encoding="utf-8") as handle:
        handle.write(MESSAGES)


def with_a_package(world: Path, site: Path) -> None:
    """``workers(..., variant="package")``: a package's phase after the others that does
    not say it is about one place at a time (no ``per``: it may read or write any entity),
    one call per place (``sim.testing.plugins.CENSUS``), installed in ``site`` (a folder
    for ``PYTHONPATH``) and named last in ``world``'s phases; the shards hand ``sim tick``
    their parts before it, and it runs alone."""
    from sim.testing.plugins import CENSUS, write_distribution

    write_distribution(
        site, "bench_census", CENSUS, "sim.phases", "census = bench_census:CensusPhase"
    )
    with (world / "config.toml").open("a", encoding="utf-8") as handle:
        handle.write(
            '[tick]\nphases = ["intentions", "resolution", "narrative", "apply", "memory", '
            '"census"]\n'
        )


def workers(characters: int, repeats: int, scratch: Path, variant: str = "") -> dict[str, Any]:
    """One offline tick of a fresh world by ``sim tick --workers 1`` and ``--workers 2``
    child processes, alternating (``repeats`` pairs), each on its own copy of the world;
    the world files after each are compared (the same bytes, or the figure is void).
    ``variant``: ``""`` (the default phases), ``"conversation"`` (``CONVERSATION``),
    ``"declared"`` (``DECLARED``), ``"messages"`` (``with_ties``) or ``"package"``
    (``with_a_package``).

    Every copy is made in ``scratch`` before the first run, and none is deleted here (the
    caller removes ``scratch`` once every size has run): a tick creates files (its
    chains', its log), and for a minute after many files were deleted ext4 scans past
    each recently deleted inode for every file created (``recently_deleted``), seconds
    at 100,000 characters that a world copied just after the last run's was deleted
    paid, and a user's world does not."""
    import shutil

    runs: dict[str, list[dict[str, Any]]] = {"1": [], "2": []}
    digests: set[str] = set()
    settings = CONVERSATION if variant == "conversation" else ()
    tmp = scratch / (f"{characters}-{variant}" if variant else str(characters))
    tmp.mkdir(parents=True)
    base = tmp / "base"
    make_world(base, characters, max(1, characters // 10), seed=1)
    for rel, text in (DECLARED if variant == "declared" else {}).items():
        (base / rel).parent.mkdir(exist_ok=True)
        (base / rel).write_text(text, encoding="utf-8")
    env = child_env()
    if variant == "messages":
        with_ties(base)
    elif variant == "package":
        with_a_package(base, tmp / "site")
        env["PYTHONPATH"] = os.pathsep.join((env["PYTHONPATH"], str(tmp / "site")))
    copies = [(n, tmp / f"w{n}-{i}") for i in range(repeats) for n in ("1", "2")]
    for _, world in copies:
        shutil.copytree(base, world)
    os.sync()  # the copies on disk first: the ticks do not pay for them
    for n, world in copies:
        load = os.getloadavg()[0]
        run = run_child(
            sim_command("tick", "--world", str(world), "--json", "--workers", n, *settings),
            tmp,
            env,
        )
        doc = tick_document(run.pop("stdout"))
        runs[n].append(
            {"timings": doc["timings"], "notes": doc["notes"], "load_before": load, **run}
        )
        digests.add(_state_digest(world))
    floor = flush_floor(base)
    return {
        "characters": characters,
        "variant": variant,
        "runs": runs,
        "identical": len(digests) == 1,
        "floor": floor,
    }


def _state_digest(world: Path) -> str:
    """The digest of a world's files but its logs (the same in either form: a packed copy
    is unpacked first, outside any measured run)."""
    import hashlib

    if (world / "world.pack").exists():
        subprocess.run(
            sim_command("unpack", "--world", str(world)),
            check=True,
            env=child_env(),
            capture_output=True,
        )
    files = hashlib.sha256()
    for path in sorted(p for p in world.rglob("*") if p.is_file()):
        rel = path.relative_to(world).as_posix()
        if not rel.startswith(".sim/log/"):
            files.update(rel.encode() + b"\0" + path.read_bytes())
    return files.hexdigest()


def packed(characters: int, repeats: int, scratch: Path) -> dict[str, Any]:
    """One offline tick of a fresh world in folders and the same world packed
    (``sim pack``), each by ``sim tick --workers 1`` and ``--workers 2``, alternating
    (folders, then the pack, ``repeats`` times each); every copy made before the first run,
    none deleted here (``workers`` says why). The world files after each run are compared
    (the packed ones unpacked after every run has run): the same bytes, or the figure is
    void."""
    import shutil

    tmp = scratch / f"{characters}-packed"
    tmp.mkdir(parents=True)
    base = tmp / "base"
    make_world(base, characters, max(1, characters // 10), seed=1)
    base_pack = tmp / "base-pack"
    shutil.copytree(base, base_pack)
    subprocess.run(
        sim_command("pack", "--world", str(base_pack)),
        check=True,
        env=child_env(),
        capture_output=True,
    )
    env = child_env()
    copies = [
        (n, form, tmp / f"w{n}-{form}-{i}")
        for i in range(repeats)
        for n in ("1", "2")
        for form in ("folders", "pack")
    ]
    for _, form, world in copies:
        shutil.copytree(base if form == "folders" else base_pack, world)
    os.sync()  # the copies on disk first: the ticks do not pay for them
    runs: dict[str, list[dict[str, Any]]] = {}
    for n, form, world in copies:
        load = os.getloadavg()[0]
        run = run_child(
            sim_command("tick", "--world", str(world), "--json", "--workers", n), tmp, env
        )
        doc = tick_document(run.pop("stdout"))
        runs.setdefault(f"{form}-{n}", []).append(
            {"timings": doc["timings"], "load_before": load, **run}
        )
    digests = {_state_digest(world) for _, _, world in copies}
    return {
        "characters": characters,
        "runs": runs,
        "identical": len(digests) == 1,
        "pack_bytes": (base_pack / "world.pack").stat().st_size,
    }


def flush_floor(world: Path, threads: int = 16) -> dict[str, Any]:
    """The bare baseline of a commit's in-place writes: every entity file of ``world``
    overwritten with its own bytes plus one (the size changes, as a tick's do), each
    flushed (``fdatasync``), on ``threads`` threads taking the next file from one list,
    as ``sim.storage.journal`` does, without sim's checks: the disk's and the kernel's
    time, which no process split divides (``sys``: the kernel's CPU, on every core)."""
    import threading

    paths = sorted(p for p in world.rglob("*.json") if p.parent != world)
    items = iter([(p, p.read_bytes() + b" ") for p in paths])
    os.sync()

    def write() -> None:
        for path, data in items:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
                os.fdatasync(fd)
            finally:
                os.close(fd)

    before, started = os.times(), time.perf_counter()
    pool = [threading.Thread(target=write) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    wall, after = time.perf_counter() - started, os.times()
    return {
        "files": len(paths),
        "wall_s": wall,
        "user_s": after.user - before.user,
        "sys_s": after.system - before.system,
    }


#: what ``sim tick`` imports, by provider (the modules it loads to run a tick)
IMPORTS = {
    "cli": "import sim.cli",
    "offline tick": "import sim.cli.run, sim.cli.progress, sim.engine.runner, sim.offline.adapter",
    # the adapter built too, on a direct URL, as a tick builds it: nothing it does may
    # import what a plain call does not use (the OpenAI SDK)
    "openai tick": (
        "import sim.cli.run, sim.cli.progress, sim.engine.runner\n"
        "from sim.providers import create_adapter\n"
        f"create_adapter('openai', base_url='http://127.0.0.1:9/v1', api_key_env='{KEY_ENV}')"
    ),
}


def import_seconds(code: str, runs: int = 5) -> float:
    """The least CPU over ``runs`` fresh Pythons running ``code``, less a bare start-up."""

    def best(source: str) -> float:
        return min(
            float(run_child([sys.executable, "-c", source], ROOT, child_env())["cpu_s"])
            for _ in range(runs)
        )

    return max(best(code) - best("pass"), 0.0)


#: ``sim --help`` in a fresh Python: every command's module is loaded for its one-line help
HELP = "from sim.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"


def imports(runs: int = 5) -> dict[str, Any]:
    found = {name: import_seconds(code, runs) for name, code in IMPORTS.items()}
    # the measure: what ``sim --help`` costs beyond importing click
    found["sim --help, beyond import click"] = max(
        import_seconds(HELP, runs) - import_seconds("import click", runs), 0.0
    )
    return {"import_cpu_s": found}


def efficiency(
    characters: int, latency: float, concurrency: int, workers: int = 1
) -> dict[str, Any]:
    """The whole ``sim tick --workers N`` process against the stub server, ideal / wall."""
    from bench.http import stub_server

    with stub_server(latency) as stub, tempfile.TemporaryDirectory(prefix="sim-bench-") as tmp:
        world = Path(tmp) / "world"
        make_world(world, characters, max(1, characters // 10), seed=1)
        (Path(tmp) / "config.toml").write_text(
            "[llm]\n"
            'provider = "openai"\n'
            f'base_url = "{stub.url}"\n'
            f'api_key_env = "{KEY_ENV}"\n'
            f"max_concurrency = {concurrency}\n",
            encoding="utf-8",
        )
        os.sync()
        run = run_child(
            sim_command("tick", "--world", str(world), "--json", "--workers", str(workers)),
            Path(tmp),
            child_env(),
        )
    doc = tick_document(run.pop("stdout"))
    if doc["failures"]:
        raise SystemExit(f"{doc['failures']} calls failed")
    ideal = sum(math.ceil(p["calls"] / concurrency) * latency for p in doc["phases"])
    tick = doc["elapsed"]
    return {
        "characters": characters,
        "latency_s": latency,
        "concurrency": concurrency,
        "workers": workers,
        "calls": doc["calls"],
        "ideal_s": ideal,
        "process_wall_s": run["wall_s"],
        "tick_wall_s": tick,
        "outside_tick_s": run["wall_s"] - tick,
        "process_efficiency": ideal / run["wall_s"],
        "tick_efficiency": ideal / tick,
        "cpu_s": run["cpu_s"],
    }


def main() -> None:
    kind = sys.argv[1]
    compile_sim()
    if kind == "scale":
        out = scale(int(sys.argv[2]))
    elif kind == "workers":  # characters, pairs, the scratch folder (the caller removes it)
        variant = sys.argv[5] if len(sys.argv) > 5 else ""  # and "conversation", or none
        out = workers(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), variant)
    elif kind == "packed":  # characters, pairs, the scratch folder (the caller removes it)
        out = packed(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
    elif kind == "imports":
        out = imports()
    elif kind == "efficiency":
        out = efficiency(
            *(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])),
            *(int(a) for a in sys.argv[5:6]),
        )
    else:
        raise SystemExit(
            f"unknown benchmark {kind!r}: scale, workers, packed, imports or efficiency"
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
