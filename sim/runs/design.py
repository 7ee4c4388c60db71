"""A sweep's design: the runs of one world, the cross product of seeds and config settings
(``--seeds``, ``--set``), each named from its seed and settings alone and checked as a config
before anything is run."""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sim.config import Config, load_config
from sim.errors import InputError
from sim.world import MAX_SEED

#: the most runs a sweep or a study may expand to: counted before anything is made
MAX_RUNS = 10_000
#: where counting a design stops (the count is then "more than" this)
_COUNT_BOUND = 2**64
_SEED_PART = re.compile(r"([0-9]{1,19})(?:-([0-9]{1,19}))?")
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
    #: each run's ticks on this many shards of its world (``sim tick --workers``): how
    #: long a step takes, never what it computes
    workers: int = 1

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


def seed_ranges(text: str) -> list[tuple[int, int]]:
    """``1-20``, ``1,4,9`` or ``1-3,7`` as (first, last) ranges, in order, nothing expanded.

    Raises:
        InputError: a part that is not N or N-M (ASCII digits), a range that ends before it
            starts, a seed above the largest a world holds.
    """
    ranges: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        match = _SEED_PART.fullmatch(part)
        if match is None:
            raise InputError(
                None, "--seeds", f"expected N, N-M or a list of them (got {text[:80]!r})"
            )
        first = int(match[1])
        last = first if match[2] is None else int(match[2])
        if last < first:
            raise InputError(None, "--seeds", f"{part}: the range ends before it starts")
        if last > MAX_SEED:
            raise InputError(None, "--seeds", f"{part}: a seed is at most {MAX_SEED}")
        ranges.append((first, last))
    return ranges


def count_seeds(ranges: Iterable[tuple[int, int]]) -> int:
    """How many distinct seeds the ranges hold (overlaps counted once), by arithmetic."""
    total, end = 0, -1
    for first, last in sorted(ranges):
        if last > end:
            total += last - max(first, end + 1) + 1
            end = last
    return total


def count_runs(sizes: Iterable[int]) -> int:
    """The product of ``sizes`` (a design's count), stopped once past ``_COUNT_BOUND``."""
    total = 1
    for size in sizes:
        total *= size
        if total > _COUNT_BOUND:
            break
    return total


def shown_count(count: int) -> str:
    return f"more than {_COUNT_BOUND}" if count > _COUNT_BOUND else str(count)


def parse_seeds(text: str, most: int = MAX_RUNS) -> list[int]:
    """``1-20``, ``1,4,9`` or ``1-3,7``: the seeds, in order, without repeats, counted
    before they are listed: more than ``most`` are refused without being made.

    Raises:
        InputError: see ``seed_ranges``; more than ``most`` seeds.
    """
    ranges = seed_ranges(text)
    count = count_seeds(ranges)
    if count > most:
        raise InputError(
            None, "--seeds", f"{count} seeds: more than {most}, the most runs a design may have"
        )
    seeds: dict[int, None] = {}
    for first, last in ranges:
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
            name one key, more than ``MAX_RUNS`` runs (counted first), or a combination
            is not a valid config (names the ``--set`` value).
    """
    if not (world / "world.json").is_file():
        raise InputError(world / "world.json", None, "not found: is this a world folder?")
    if out.resolve().is_relative_to(world.resolve()):
        raise InputError(out, None, "the runs' folder must be outside the world it forks")
    keys = [s.key for s in settings]
    if len(set(keys)) != len(keys):
        raise InputError(None, "--set", "each key may be set once (list its values: K=A,B)")
    count = count_runs([len(seeds), *(len(s.values) for s in settings)])
    if count > MAX_RUNS:
        raise InputError(
            None,
            "--set" if settings and count > len(seeds) else "--seeds",
            f"{len(seeds)} seeds x {shown_count(count_runs(len(s.values) for s in settings))} "
            f"combinations of --set values = {shown_count(count)} runs: more than "
            f"{MAX_RUNS}, the most a sweep may have (nothing was made)",
        )
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
    "MAX_RUNS",
    "RunSpec",
    "Setting",
    "SweepPlan",
    "count_runs",
    "count_seeds",
    "make_plan",
    "nested",
    "parse_seeds",
    "parse_setting",
    "run_name",
    "seed_ranges",
    "shown_count",
]
