"""A sweep's design: the runs of one world, the cross product of seeds and config settings
(``--seeds``, ``--set``), each named from its seed and settings alone and checked as a config
before anything is run."""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sim.config import Config, load_config
from sim.errors import InputError

_NAME_SAFE = re.compile(r"[^A-Za-z0-9._=+-]")
_MAX_NAME = 120


@dataclass(frozen=True)
class Setting:
    """One ``--set KEY=V1,V2``: a dotted config key and the values it takes."""

    key: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class RunSpec:
    """One run of the plan: its folder name, seed and config overrides (dotted keys)."""

    name: str
    seed: int
    overrides: dict[str, Any]


@dataclass
class SweepPlan:
    """A sweep: the world, where runs go, the runs and how many ticks each gets."""

    world: Path
    out: Path
    runs: list[RunSpec]
    ticks: int
    config_file: Path | None = None
    #: the folder the sweep was started in: each child runs there (never in a run folder)
    cwd: Path = field(default_factory=Path.cwd)

    @property
    def trusted_config(self) -> Path | None:
        """The user's config file the children are given: ``--config``, else the
        ``./config.toml`` of the sweep's folder (both absolute), else none."""
        if self.config_file is not None:
            return (self.cwd / self.config_file).resolve()
        local = self.cwd / "config.toml"
        return local.resolve() if local.is_file() else None

    def config(self, overrides: Mapping[str, Any]) -> Config:
        """A run's effective config, from the trusted layers only (the source world's
        config under the trust rule, the user's config, the run's settings)."""
        return load_config(self.config_file, self.world, nested(overrides), cwd=self.cwd)


# -- parsing the command line ------------------------------------------------------------------


def parse_seeds(text: str) -> list[int]:
    """``1-20``, ``1,4,9`` or ``1-3,7``: the seeds, in order, without repeats."""
    seeds: dict[int, None] = {}
    for part in text.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise InputError(None, "--seeds", f"expected N, N-M or a list of them (got {text!r})")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise InputError(None, "--seeds", f"{part}: the range ends before it starts")
        if last - first >= 100_000:
            raise InputError(None, "--seeds", f"{part}: more than 100000 seeds")
        seeds.update(dict.fromkeys(range(first, last + 1)))
    return list(seeds)


def _value(text: str) -> Any:
    """A ``--set`` value: JSON where it parses (``0.5``, ``true``, ``"x"``), else the text."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def parse_setting(text: str) -> Setting:
    """``phase1.temperature=0.5,0.9``: a dotted config key and its values."""
    key, sep, values = text.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or len(parts) < 2 or not all(parts) or not values.strip():
        raise InputError(None, "--set", f"expected SECTION.KEY=VALUE[,VALUE...] (got {text!r})")
    return Setting(key, tuple(_value(v.strip()) for v in values.split(",")))


def nested(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys as nested tables: ``{"phase1.temperature": 0.5}`` -> ``{"phase1": {...}}``."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        *path, last = key.split(".")
        table = out
        for part in path:
            table = table.setdefault(part, {})
        table[last] = value
    return out


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def run_name(seed: int, overrides: Mapping[str, Any]) -> str:
    """A run's folder name, from its seed and settings only (the same run, the same name).

    Characters other than letters, digits and ``._=+-`` become ``-``; a name changed that
    way, or cut to length, ends in a hash of the settings, so two runs never share one.
    """
    raw = f"seed-{seed}" + "".join(f"_{k}={_value_text(v)}" for k, v in overrides.items())
    name = _NAME_SAFE.sub("-", raw)
    if name != raw or len(name) > _MAX_NAME:
        digest = hashlib.sha256(orjson.dumps([seed, list(overrides.items())])).hexdigest()[:10]
        name = f"{name[: _MAX_NAME - 11]}-{digest}"
    return name


def make_plan(
    world: Path,
    out: Path,
    seeds: Sequence[int],
    settings: Sequence[Setting],
    ticks: int,
    config_file: Path | None = None,
) -> SweepPlan:
    """Every combination of seed and setting values, each checked as a config now.

    Raises:
        InputError: the world has no ``world.json``, ``out`` is inside it, two settings
            name one key, or a combination is not a valid config (names the ``--set`` value).
    """
    if not (world / "world.json").is_file():
        raise InputError(world / "world.json", None, "not found: is this a world folder?")
    if out.resolve().is_relative_to(world.resolve()):
        raise InputError(out, None, "the runs' folder must be outside the world it forks")
    keys = [s.key for s in settings]
    if len(set(keys)) != len(keys):
        raise InputError(None, "--set", "each key may be set once (list its values: K=A,B)")
    combos = [
        dict(zip(keys, combo, strict=True))
        for combo in itertools.product(*(s.values for s in settings))
    ]
    cwd = Path.cwd()
    for overrides in combos:
        try:
            load_config(config_file, world, nested(overrides), cwd=cwd)
        except InputError as exc:
            shown = ", ".join(f"{k}={_value_text(v)}" for k, v in overrides.items())
            raise InputError(None, "--set", f"{shown}: {exc}") from None
    runs = [
        RunSpec(run_name(seed, overrides), seed, overrides)
        for seed in seeds
        for overrides in combos
    ]
    return SweepPlan(world, out, runs, ticks, config_file, cwd)


__all__ = [
    "RunSpec",
    "Setting",
    "SweepPlan",
    "make_plan",
    "nested",
    "parse_seeds",
    "parse_setting",
    "run_name",
]
