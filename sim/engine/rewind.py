"""Moving through a world's history: ``rewind`` in place and ``fork`` into a new folder.

Both take the state at the start of tick N from tick N's log (its ``state_before``).
``rewind`` writes it back through the commit journal, in one atomic step together with
moving the logs of ticks N and later aside into ``.sim/log/rewound-<k>/`` (never deleting
them). ``fork`` writes it into a new folder with the world's prompts and config and the logs
of the ticks before N, leaving the original untouched; forking at the tick after the
current one (no log yet) copies the state as the world's files hold it now.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import orjson

from sim import safefs
from sim.errors import InputError, LogError
from sim.pack import PACK, PACK_TMP, is_packed, pack_entities
from sim.safefs import UnsafePath
from sim.storage import Storage, dump_json
from sim.storage.journal import SIM_DIR, commit_path_problem, journal_overlay
from sim.ticklog.format import (
    GZ,
    INTERVENTIONS,
    LOG_DIR,
    STORE_DIR,
    ZST,
    is_state_file,
    list_logs,
    log_file,
    read_state,
    summary_rel,
)
from sim.ticklog.reader import TickLog, read_log, read_log_bytes
from sim.ticklog.recovery import recover_logs
from sim.world import World


@dataclass
class Rewound:
    tick: int
    moved_to: Path | None
    logs_moved: int


def state_log(world_dir: Path, tick: int) -> TickLog:
    """Tick ``tick``'s log, which must hold the state at the start of that tick."""
    path = log_file(world_dir, tick)
    if not path.is_file():
        have = ", ".join(str(t) for t, _ in list_logs(world_dir)) or "none"
        raise InputError(path, None, f"no log for tick {tick} (logs kept for ticks: {have})")
    log = read_log(path)
    logged_state(log)  # raises LogError without a usable state_before record
    return log


def logged_state(log: TickLog) -> dict[str, bytes]:
    """The state at the start of the log's tick, every path checked like a journal's.

    A log is part of the world folder, so it is untrusted too: each path must be a state
    file a commit writes (``world.json``, an entity, a response-store file), relative and
    inside the world.

    Raises:
        LogError: no state, or a state that cannot be decoded.
        InputError: a path that is not a state file inside the world.
    """
    try:
        files = log.state()
    except LogError:
        raise
    except Exception as exc:  # zlib, base64, JSON, UTF-8: a damaged record
        raise LogError(f"{log.path}: the state_before record cannot be decoded ({exc})") from None
    for rel in files:
        try:
            safefs.split_rel(rel)
            problem = None if is_state_file(rel) else f"{rel!r} is not a state file"
            problem = problem or commit_path_problem(rel)
        except UnsafePath as exc:
            problem = exc.problem
        if problem is not None:
            raise InputError(
                log.path, "state_before", f"refusing the logged state: {problem}"
            ) from None
    return files


def _current_tick(world_dir: Path) -> int:
    """The tick ``world.json`` shows (a committed journal's copy if one is pending)."""
    try:
        raw = journal_overlay(world_dir).get("world.json") or safefs.read_file(
            world_dir, "world.json"
        )
        meta = orjson.loads(raw)
        return int(meta["tick"])
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        raise InputError(world_dir / "world.json", "tick", "cannot read the current tick") from None


def _aside_dir(world_dir: Path) -> str:
    n = 1
    while (world_dir / LOG_DIR / f"rewound-{n}").exists():
        n += 1
    return f"{LOG_DIR}/rewound-{n}"


def rewind(world_dir: Path, tick: int) -> Rewound:
    """Put the world back to its state at the start of ``tick`` (= after tick − 1).

    Raises:
        InputError: no such log, or ``tick`` is beyond the world's current tick + 1.
        LogError: the log cannot be read.
    """
    storage = Storage(world_dir)
    with storage.lock():
        storage.recover()
        recover_logs(world_dir)
        current = _current_tick(world_dir)
        if not 1 <= tick <= current + 1:
            raise InputError(
                None,
                "--tick",
                f"expected 1..{current + 1} for a world at tick {current} (got {tick})",
            )
        target = logged_state(state_log(world_dir, tick))
        now = read_state(world_dir)
        files: dict[str, bytes | None] = {rel: None for rel in now if rel not in target}
        files.update(
            {
                rel: data
                for rel, data in target.items()
                if is_state_file(rel) and now.get(rel) != data
            }
        )
        later = [(t, p) for t, p in list_logs(world_dir) if t >= tick]
        aside = _aside_dir(world_dir) if later else None
        for _, path in later:  # moved through the journal: atomic with the state
            rel = path.relative_to(world_dir).as_posix()
            # the journal holds text: a compressed log is moved as its JSONL lines
            name = path.name.removesuffix(ZST).removesuffix(GZ)
            files[f"{aside}/{name}"] = read_log_bytes(path)
            files[rel] = None
        meta = orjson.loads(safefs.read_file(world_dir, "world.json"))
        unchanged = World(world_dir, meta, {}, {}, {"world.json": dump_json(meta)})
        storage.commit(unchanged, files)
        for number, _ in later:  # derived from those logs; a stale one is rebuilt anyway
            with contextlib.suppress(FileNotFoundError):
                (world_dir / summary_rel(number)).unlink()
    return Rewound(tick, world_dir / aside if aside else None, len(later))


def _copy_tree(src: Path, dest: Path, skip: str) -> None:
    """Copy regular files and folders (not links, pipes or devices, which a world may not
    hold) from ``src`` to ``dest``; ``skip`` is the top-level name left out."""
    for folder, dirs, names in os.walk(src, followlinks=False):
        here = Path(folder)
        rel_dir = here.relative_to(src)
        if rel_dir == Path("."):
            dirs[:] = [d for d in dirs if d != skip]
            names = [n for n in names if n not in (skip, PACK, PACK_TMP)]  # a pack: state
        dirs[:] = [d for d in dirs if not os.path.islink(here / d)]
        (dest / rel_dir).mkdir(parents=True, exist_ok=True)
        for name in names:
            rel = (rel_dir / name).as_posix()
            if is_state_file(rel):
                continue
            mode = os.lstat(here / name).st_mode
            if stat.S_ISREG(mode):
                shutil.copy2(here / name, dest / rel)


def current_state(storage: Storage) -> dict[str, bytes]:
    """The state the world is in now (what the next tick's log will snapshot), every file
    read without following a link: the validated world (a pending committed journal's
    files included), its response store and the interventions waiting.

    Raises:
        InvalidWorld, UnsafePath, CorruptJournal: the world as it stands cannot be read.
    """
    root = storage.root
    world = storage.load()
    files = {rel: data for rel, data in world.originals.items() if is_state_file(rel)}
    store = STORE_DIR.split("/")
    for chain in safefs.list_names(root, store, "") or []:
        for name in safefs.list_names(root, [*store, chain], ".json") or []:
            rel = f"{STORE_DIR}/{chain}/{name}"
            files[rel] = safefs.read_file(root, rel)
    pending = safefs.read_optional(root, INTERVENTIONS)
    if pending is not None:
        files[INTERVENTIONS] = pending
    for rel, data in journal_overlay(root).items():  # entities are in ``world`` already
        if is_state_file(rel) and data is None:
            files.pop(rel, None)
        elif is_state_file(rel) and data is not None:
            files[rel] = data
    return {rel: files[rel] for rel in sorted(files)}


def _refuse_nested(world_dir: Path, dest: Path) -> None:
    """A fork inside its own world would copy itself into itself without end; a world
    inside the fork's folder would be copied over."""
    source, target = world_dir.resolve(), dest.resolve()
    if target == source or source in target.parents:
        raise InputError(
            dest,
            None,
            f"the fork's folder is inside the world it forks ({world_dir}); "
            "choose a folder outside it",
        )
    if target in source.parents:
        raise InputError(
            dest,
            None,
            f"the world to fork ({world_dir}) is inside the fork's folder; "
            "choose a folder outside it",
        )


def fork(world_dir: Path, tick: int, dest: Path, seed: int | None = None) -> Path:
    """A new world at ``dest`` in the state at the start of ``tick``; the original is only read.

    ``tick`` is any tick whose log is kept, or the tick after the world's current one:
    the world as it stands now (right after ``sim rewind`` too). With ``seed``, the new
    world's ``world.json`` holds that seed instead.

    Raises:
        InputError: ``dest`` is inside the world (or the world inside it), exists and is
            not empty, ``tick`` is past the next one, or there is no log for ``tick``.
    """
    _refuse_nested(world_dir, dest)
    if dest.is_symlink() or (dest.exists() and (not dest.is_dir() or any(dest.iterdir()))):
        raise InputError(dest, None, "the fork's folder must not exist yet (or be empty)")
    storage = Storage(world_dir)
    with storage.lock():
        current = _current_tick(world_dir)
        if tick > current + 1:
            raise InputError(
                None,
                "--tick",
                f"expected 1..{current + 1} for a world at tick {current} (got {tick}; "
                f"{current + 1} is the world as it is now)",
            )
        target = (
            current_state(storage)
            if tick == current + 1
            else logged_state(state_log(world_dir, tick))
        )
        earlier = [(t, p) for t, p in list_logs(world_dir) if t < tick]
        dest.mkdir(parents=True, exist_ok=True)
        _copy_tree(world_dir, dest, SIM_DIR)
        if seed is not None and "world.json" in target:
            meta = orjson.loads(target["world.json"])
            meta["seed"] = seed
            target = {**target, "world.json": dump_json(meta)}
        if is_packed(world_dir):  # the fork keeps the world's form
            target = pack_entities(dest, target)
        for rel, data in target.items():
            parts = rel.split("/")
            with safefs.open_dir(dest, parts[:-1], create=True) as dir_fd:
                safefs.unlink_at(dir_fd, parts[-1])
                safefs.write_at(dir_fd, parts[-1], dest / rel, data)
        for number, path in earlier:
            summary = world_dir / summary_rel(number)
            for copied in (path, summary) if summary.is_file() else (path,):
                copy = dest / LOG_DIR / copied.name
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(copied, copy)
    return dest
