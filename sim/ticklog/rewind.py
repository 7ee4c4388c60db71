"""Moving through a world's history: ``rewind`` in place and ``fork`` into a new folder.

Both take the state at the start of tick N from tick N's log (its ``state_before``).
``rewind`` writes it back through the commit journal, in one atomic step together with
moving the logs of ticks N and later aside into ``.sim/log/rewound-<k>/`` (never deleting
them). ``fork`` writes it into a new folder with the world's prompts and config and the logs
of the ticks before N, leaving the original untouched.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import orjson

from sim.errors import InputError
from sim.storage import SIM_DIR, Storage, dump_json
from sim.ticklog.format import (
    LOG_DIR,
    TickLog,
    is_state_file,
    list_logs,
    log_path,
    read_log,
    read_state,
    recover_logs,
)
from sim.world import World


@dataclass
class Rewound:
    tick: int
    moved_to: Path | None
    logs_moved: int


def state_log(world_dir: Path, tick: int) -> TickLog:
    """Tick ``tick``'s log, which must hold the state at the start of that tick."""
    path = log_path(world_dir, tick)
    if not path.is_file():
        have = ", ".join(str(t) for t, _ in list_logs(world_dir)) or "none"
        raise InputError(path, None, f"no log for tick {tick} (logs kept for ticks: {have})")
    log = read_log(path)
    log.state()  # raises LogError without a state_before record
    return log


def _current_tick(world_dir: Path) -> int:
    try:
        meta = orjson.loads((world_dir / "world.json").read_bytes())
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
        target = state_log(world_dir, tick).state()
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
            files[f"{aside}/{path.name}"] = path.read_bytes()
            files[rel] = None
        meta = orjson.loads((world_dir / "world.json").read_bytes())
        unchanged = World(world_dir, meta, {}, {}, {"world.json": dump_json(meta)})
        storage.commit(unchanged, files)
    return Rewound(tick, world_dir / aside if aside else None, len(later))


def fork(world_dir: Path, tick: int, dest: Path, seed: int | None = None) -> Path:
    """A new world at ``dest`` in the state at the start of ``tick``; the original is only read.

    With ``seed``, the new world's ``world.json`` holds that seed instead.

    Raises:
        InputError: ``dest`` exists and is not empty, or there is no log for ``tick``.
    """
    if dest.exists() and any(dest.iterdir()):
        raise InputError(dest, None, "the fork's folder must not exist yet (or be empty)")
    storage = Storage(world_dir)
    with storage.lock():
        log = state_log(world_dir, tick)
        target = log.state()
        earlier = [(t, p) for t, p in list_logs(world_dir) if t < tick]
        dest.mkdir(parents=True, exist_ok=True)
        for item in world_dir.iterdir():
            if item.name == SIM_DIR:
                continue
            rel = item.relative_to(world_dir).as_posix()
            if item.is_dir():
                shutil.copytree(
                    item,
                    dest / rel,
                    ignore=lambda d, names: [
                        n
                        for n in names
                        if is_state_file(f"{Path(d).relative_to(world_dir).as_posix()}/{n}")
                    ],
                )
            elif not is_state_file(rel):
                shutil.copy2(item, dest / rel)
        if seed is not None:
            meta = orjson.loads(target["world.json"])
            meta["seed"] = seed
            target = {**target, "world.json": dump_json(meta)}
        for rel, data in target.items():
            path = dest / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        for _, path in earlier:
            copy = dest / LOG_DIR / path.name
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, copy)
    return dest
