"""A folder of runs' inputs, fingerprinted: the world as forked, the user's config, the
design (a study's file) and sim's version, each as a digest recorded when the folder is
made (``Inputs``), and compared when the runs go on (``changed``): a folder whose runs
were made from other inputs is refused by name, so runs of two worlds are never pooled.

The world's digest covers every regular file of the world a fork copies (its state, its
``config.toml``, prompts, schemas, the pending interventions), by path, and none of its
runtime files (``.sim``: logs, caches, answers) nor a run's record.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict

from sim import safefs
from sim.errors import InputError
from sim.storage.journal import SIM_DIR
from sim.ticklog.format import INTERVENTIONS
from sim.version import __version__

#: what each recorded input is called when it differs
NAMES = {
    "world": "the world (its files differ from those the runs were forked from)",
    "config": "the config (--config or ./config.toml differs)",
    "design": "the design (the study file or a survey's schema file differs)",
    "sim": "sim's version",
}


class Inputs(BaseModel):
    """The digests of what a folder of runs was made from (sha256, hex)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    world: str
    config: str
    design: str | None = None
    sim: str = __version__


def digest_data(data: Any) -> str:
    """The digest of JSON data, keys sorted."""
    return hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _walk(world: Path, rel: str, found: dict[str, str]) -> None:
    folder = world / rel if rel else world
    with os.scandir(folder) as listing:
        entries = sorted((e.name, e.is_dir(follow_symlinks=False), e.is_symlink()) for e in listing)
    for name, is_dir, is_link in entries:
        path = f"{rel}/{name}" if rel else name
        if path == SIM_DIR:
            continue
        if is_link:  # not followed: the link itself is what the world holds
            found[path] = "link:" + os.readlink(folder / name)
        elif is_dir:
            _walk(world, path, found)
        else:
            try:
                found[path] = hashlib.sha256(safefs.read_file(world, path)).hexdigest()
            except safefs.UnsafePath:  # a FIFO, a device: named, never opened
                found[path] = "special"


def world_digest(world: Path, exclude: tuple[str, ...] = ()) -> str:
    """The digest of a world's files as a fork copies them (``exclude``: top-level names
    left out, such as a run's record).

    Raises:
        InputError: the world cannot be read.
    """
    found: dict[str, str] = {}
    try:
        _walk(world, "", found)
        pending = safefs.read_optional(world, INTERVENTIONS)
    except OSError as exc:
        raise InputError(world, None, f"cannot read: {exc.strerror or exc}") from None
    if pending is not None:
        found[INTERVENTIONS] = hashlib.sha256(pending).hexdigest()
    for name in exclude:
        found.pop(name, None)
    return digest_data(found)


def inputs_of(
    world: Path, user_layers: Mapping[str, Any], design: Any = None, exclude: tuple[str, ...] = ()
) -> Inputs:
    """The inputs of runs of ``world`` under the user's config layers (``sim.config.
    user_layers``) and ``design`` (JSON data, or ``None``)."""
    return Inputs(
        world=world_digest(world, exclude),
        config=digest_data(dict(user_layers)),
        design=None if design is None else digest_data(design),
    )


def changed(recorded: Inputs | None, now: Inputs) -> list[str]:
    """What differs between the recorded inputs and those now, each named (``NAMES``);
    everything when none were recorded."""
    if recorded is None:
        return ["the inputs (the folder records none: made by an earlier sim)"]
    out: list[str] = []
    for key, name in NAMES.items():
        before, after = getattr(recorded, key), getattr(now, key)
        if before != after:
            out.append(f"{name}: {before} -> {after}" if key == "sim" else name)
    return out


__all__ = ["NAMES", "Inputs", "changed", "digest_data", "inputs_of", "world_digest"]
