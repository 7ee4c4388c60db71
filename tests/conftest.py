"""Shared fixtures: scratch copies of the bundled worlds as released."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sim.engine.recorder import TickRecorder
from sim.llm.types import AdapterResponse, ModelRequest
from sim.offline.adapter import OfflineAdapter
from sim.storage.journal import JOURNAL
from sim.testing.pytest_plugin import (  # noqa: F401  (fixtures)
    anthropic_stub,
    gemini_stub,
    stub_server,
)
from sim.testing.worlds import pristine_worlds
from sim.ticklog.compression import LogCompression

REPO = Path(__file__).resolve().parents[1]


#: the bundled worlds as released, for the whole session (removed at exit)
_PRISTINE = Path(tempfile.mkdtemp(prefix="sim-test-worlds-"))
atexit.register(shutil.rmtree, _PRISTINE, ignore_errors=True)
WORLDS = pristine_worlds(REPO, _PRISTINE)
DEMO = WORLDS / "demo"
HARVEST = WORLDS / "harvest-vote"


def install_distribution(
    folder: Path, monkeypatch: pytest.MonkeyPatch, module: str, code: str, group: str, entries: str
) -> None:
    """A tiny installed distribution for one test: module ``module`` (``code``) in
    ``folder``, offering ``entries`` (``name = module:attr`` lines) in entry-point group
    ``group``, importable until the test ends."""
    folder.mkdir(exist_ok=True)
    (folder / f"{module}.py").write_text(code)
    info = folder / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entries}\n")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, module, raising=False)


def copy_demo(dest: Path) -> Path:
    shutil.copytree(DEMO, dest, ignore=shutil.ignore_patterns(".sim"))
    return dest


def configured(world: str, dest: Path, old: str, new: str) -> Path:
    """The bundled world ``world`` copied to ``dest``, ``old`` in its config (which must
    hold it) replaced by ``new``."""
    shutil.copytree(WORLDS / world, dest, ignore=shutil.ignore_patterns(".sim"))
    config = dest / "config.toml"
    text = config.read_text()
    assert old in text
    config.write_text(text.replace(old, new))
    return dest


def vote_with_tools(dest: Path) -> Path:
    """The harvest vote's world, its phase given a query tool (``look``: at whoever and
    whatever is where the voter is, after the moves)."""
    tools = 'max_output_tokens = 200\ntools = ["look"]\n'
    return configured("harvest-vote", dest, "max_output_tokens = 200\n", tools)


@pytest.fixture
def demo_world(tmp_path: Path) -> Path:
    """A scratch copy of worlds/demo as released; the original is never touched."""
    return copy_demo(tmp_path / "demo")


def tree(root: Path, logs: bool = False) -> dict[str, bytes]:
    """Every file under root (relative path -> bytes), for byte-for-byte comparisons.

    Tick logs (``.sim/log/``) record latencies and times, so they are left out unless asked.
    """
    out = {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}
    return {
        rel: p.read_bytes() for rel, p in out.items() if logs or not rel.startswith(".sim/log/")
    }


def shard_workers_of(world: Path) -> list[int]:
    """The ``sim.engine.shard_worker`` processes of ``world`` that still run."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        running = stat.rsplit(")", 1)[1].split()[0] != "Z"
        if running and b"sim.engine.shard_worker" in args and str(world).encode() in args:
            found.append(int(entry.name))
    return found


@contextmanager
def interruptible_children() -> Iterator[None]:
    """Processes started inside get Ctrl-C (SIGINT) at its default, as from a terminal.

    A runner started in the background (``nohup make test &``, a CI step) may leave SIGINT
    ignored, and an ignored signal stays ignored across ``exec``: a child Python would
    never see its Ctrl-C. A *handled* signal is reset to its default by ``exec``, so
    handling SIGINT here while the children start gives each of them the default, which
    Python turns into ``KeyboardInterrupt``. Nothing runs in the forked child (unlike
    ``preexec_fn``, unsafe beside the stub servers' threads).
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


#: how long a child held in its commit waits for the kill (far longer than any trial takes)
HOLD_SECONDS = 60.0


def hold_the_commit(where: str) -> None:
    """In a forked child only: stop its commit at the commit point until it is killed.

    ``"before"`` holds the journal's rename (the commit point) after the journal was written
    and fsynced; ``"after"`` holds once the commit point is passed and the files applied,
    before the log gets its ``commit`` record. A kill at a random instant after the tick's
    ``usage`` record (or after the journal appeared) then lands on the chosen side of the
    commit point however loaded the machine is: the window stays open until the kill.
    """
    if where == "before":
        real_replace = os.replace

        def held_replace(src: object, dst: object, *args: object, **kwargs: object) -> None:
            if Path(str(dst)).name == Path(JOURNAL).name:
                time.sleep(HOLD_SECONDS)
            real_replace(src, dst, *args, **kwargs)  # type: ignore[arg-type]

        os.replace = held_replace  # type: ignore[assignment]
    elif where == "after":
        real_committed = TickRecorder.committed

        def held_committed(self: TickRecorder) -> None:
            time.sleep(HOLD_SECONDS)
            real_committed(self)

        TickRecorder.committed = held_committed  # type: ignore[method-assign]
    else:
        raise ValueError(f"hold the commit 'before' or 'after' its commit point, not {where!r}")


class Counted:
    """The offline model, counting what it answers; 'dies' as call number ``crash_at``
    starts (a ``KeyboardInterrupt``, as a killed process stops mid-tick)."""

    name = "offline"

    def __init__(self, seed: int, crash_at: int = 0) -> None:
        self.inner = OfflineAdapter(seed=seed)
        self.crash_at = crash_at
        self.started = 0
        self.answered = 0

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        self.started += 1
        if self.started == self.crash_at:
            raise KeyboardInterrupt  # the process dies mid-tick
        response = await self.inner.execute(request)
        self.answered += 1
        return response

    async def delete_response(self, response_id: str) -> None:
        return None


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> dict[int, bytes]:
    """Each committed log's plain bytes, taken just before its compressed form replaces it."""
    plain: dict[int, bytes] = {}
    real = LogCompression.finish

    def keep(self: LogCompression) -> Path:
        plain[int(self.path.name[5:11])] = self.path.read_bytes()
        return real(self)

    monkeypatch.setattr(LogCompression, "finish", keep)
    return plain


#: a phase a world declares per world: its files, and its section of config.toml
OMEN = {
    "prompts/omen.md": (
        "{{ characters | length }} people, {{ locations | length }} places: name an omen.\n"
    ),
    "prompts/omen.input.md": (
        "{% for c in characters %}{{ c.identity.name }} ({{ c.state.mood }}) remembers "
        "{{ c.memory.cells[-1:] | tojson }}.\n{% endfor %}"
    ),
    "schemas/omen.json": (
        '{"type": "object", "properties": {"omen": {"type": "string", "maxLength": 80}}, '
        '"required": ["omen"]}'
    ),
}
OMEN_SECTION = (
    '[phases.omen]\nper = "world"\ninstructions = "prompts/omen.md"\n'
    'input = "prompts/omen.input.md"\nschema = "schemas/omen.json"\n'
    'writes = { "omen" = "omen" }\n'
)


def with_an_omen(dest: Path, first: bool = False) -> Path:
    """The demo world with a phase it declares per world (``OMEN``), after the others (or
    ``first``): one subject, the world, whose templates see every character and place
    whole, and whose answer goes into ``world.json``."""
    copy_demo(dest)
    for rel, text in OMEN.items():
        (dest / rel).parent.mkdir(exist_ok=True)
        (dest / rel).write_text(text)
    builtin = '"intentions", "resolution", "narrative", "apply", "memory"'
    phases = f'"omen", {builtin}' if first else f'{builtin}, "omen"'
    (dest / "config.toml").write_text(f"[tick]\nphases = [{phases}]\n{OMEN_SECTION}")
    return dest


def omen_first(dest: Path) -> Path:
    """``with_an_omen``, the omen before the tick's other phases."""
    return with_an_omen(dest, first=True)


#: a package's phase that does not say it is about one place at a time (``per``): it runs
#: over the whole world, so ``sim tick --workers`` runs a tick with it in one process
TALLY = """
class TallyPhase:
    name = "tally"

    def subjects(self, ctx):
        return [ctx.world.meta]

    def requests(self, ctx, subjects):
        return []

    def apply(self, ctx, subjects, results):
        ctx.world.meta["population"] = len(ctx.world.characters)
        return {"world": {"population": len(ctx.world.characters)}}
"""


def with_a_tally(dest: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The demo world, with a package's phase over the whole world before its others
    (``TALLY``, installed for the test and the processes it starts): ``--workers`` runs
    such a tick in one process, as no phase before it runs on a part."""
    site = dest.parent / f"{dest.name}-site"
    install_distribution(
        site, monkeypatch, "simtest_tally", TALLY, "sim.phases", "tally = simtest_tally:TallyPhase"
    )
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    )
    copy_demo(dest)
    (dest / "config.toml").write_text(
        '[tick]\nphases = ["tally", "intentions", "resolution", "narrative", "apply", "memory"]\n'
    )
    return dest
