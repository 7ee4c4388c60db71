"""Tuning one phase: run the same ticks at several chain depths, or with its memory as a
window and retrieved (``sim tune --memory window,retrieve``), and compare.

For each depth, ``tune`` copies the world into a scratch folder (its files and response
store, not its logs), runs ``ticks`` ticks there with the phase's ``response_chain_depth``
overridden, and reads the numbers back from the scratch copy's tick logs, so a row counts
exactly what ``sim usage`` would. The live world is only read, under its lock. Memory rows
also say what the phase's calls were shown of memory: the lines, how old, and how often
they differ from the first row's for the same character and tick.

In the scratch copy nothing the live world refers to is ever deleted at the provider: a
chain's old responses belong to the live world, so only responses the scratch run itself
created are deleted when its chains evict them.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sim import interrupts
from sim.analysis.usage import UsageRow, log_totals
from sim.config import (
    PHASE_ALIASES,
    Config,
    MemoryPhaseConfig,
    known_memory,
    offline_config,
    resolve_model,
    section_name,
)
from sim.engine.deletions import PENDING
from sim.engine.runner import Runner
from sim.engine.stack import build_stack
from sim.errors import InputError
from sim.llm.budget import Cost, price_usage
from sim.llm.types import Adapter, AdapterResponse, ModelRequest
from sim.llm.wrapper import AdapterWrapper
from sim.sections import loads as read_input
from sim.storage import Storage
from sim.ticklog.books import call_usage
from sim.ticklog.format import LOG_DIR
from sim.ticklog.reader import read_logs

PHASE_NAMES = {section: name for name, section in PHASE_ALIASES.items()}  # built-ins only


@dataclass
class TuneRow:
    """What ``ticks`` ticks cost with the phase at ``depth``."""

    depth: int
    ticks: int
    total: UsageRow
    phase: UsageRow
    wall_seconds: float
    windows: int
    #: the phase's ``[memory] mode`` in this row (``sim tune --memory``), else ``None``
    memory: str | None = None
    #: what each of the phase's calls was shown of memory: (tick, entity key) -> its lines
    seen: dict[tuple[int, str], tuple[str, ...]] = field(default_factory=dict, repr=False)
    #: the share of calls shown other memory lines than the first row's call for the same
    #: character and tick (of the calls both rows made); ``None`` in the first row
    differs: float | None = None

    @property
    def avg_window(self) -> float:
        """Mean number of earlier exchanges sent per call of the phase."""
        return self.windows / self.phase.calls if self.phase.calls else 0.0

    @property
    def memory_lines(self) -> float:
        """Mean number of memory lines (cells) shown per call of the phase."""
        return sum(map(len, self.seen.values())) / len(self.seen) if self.seen else 0.0

    @property
    def mean_age(self) -> float:
        """Mean age, in ticks, of the cells shown (the call's tick minus the cell's)."""
        ages = [
            tick - int(m.group(1))
            for (tick, _), lines in self.seen.items()
            for line in lines
            if (m := _CELL_TICK.match(line))
        ]
        return sum(ages) / len(ages) if ages else 0.0

    def compare(self, first: TuneRow) -> None:
        """Set ``differs`` against the first row."""
        both = self.seen.keys() & first.seen.keys()
        changed = sum(self.seen[k] != first.seen[k] for k in both)
        self.differs = changed / len(both) if both else 0.0

    def to_dict(self) -> dict[str, Any]:
        total = self.total.to_dict()
        del total["key"]
        out = {
            "depth": self.depth,
            "ticks": self.ticks,
            **total,
            "wall_seconds": round(self.wall_seconds, 3),
            "phase_requests": self.phase.calls,
            "phase_input_tokens": self.phase.usage.input_tokens,
            "avg_window": round(self.avg_window, 3),
        }
        if self.memory is not None:
            out.update(
                memory=self.memory,
                memory_lines=round(self.memory_lines, 3),
                mean_age=round(self.mean_age, 3),
                differs=None if self.differs is None else round(self.differs, 3),
            )
        return out


#: a memory line as phases show a cell: ``tick N: text``
_CELL_TICK = re.compile(r"^tick (\d+): ")


def memory_shown(text: str) -> tuple[str, ...] | None:
    """The memory lines a call's input showed (``memory.recall`` or ``memory.recent``), or
    ``None`` for an input without them (free text, a template of the world's own)."""
    doc = read_input(text)
    memory = doc.get("memory") if doc else None
    if not isinstance(memory, dict):
        return None
    lines = memory.get("recall", memory.get("recent"))
    if not isinstance(lines, list):
        return None
    return tuple(str(line) for line in lines)


@dataclass
class CostEstimate:
    """A cost estimate for a tune run, and how it was made."""

    input_tokens: int
    output_tokens: int
    cost: Cost
    method: str


class ScratchAdapter(AdapterWrapper):
    """Passes calls through; deletes only the responses this scratch run created."""

    def __init__(self, inner: Adapter) -> None:
        super().__init__(inner)
        self.created: set[str] = set()

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        response = await self.inner.execute(request)
        self.created.add(response.response_id)
        return response

    async def delete_response(self, response_id: str) -> None:
        if response_id in self.created:
            await self.inner.delete_response(response_id)


def scratch_copy(world_dir: Path, dest: Path) -> Path:
    """Copy a world's files and response store to ``dest``; not its logs, nor the live
    world's pending deletions (those responses are the live world's to delete)."""
    skip_rel = {LOG_DIR, PENDING}

    def ignore(folder: str, names: list[str]) -> list[str]:
        rel = Path(folder).relative_to(world_dir).as_posix()
        return [n for n in names if (n if rel == "." else f"{rel}/{n}") in skip_rel]

    with Storage(world_dir).lock():
        # symlinks stay symlinks: the copy reads nothing the live world would refuse to read
        shutil.copytree(world_dir, dest, ignore=ignore, symlinks=True)
    return dest


def _keep_logs(config: Config) -> Config:
    history = config.history.model_copy(update={"keep_ticks": 0})
    return config.model_copy(update={"history": history})


def depth_config(config: Config, section: str, depth: int) -> Config:
    """``config`` with one phase's depth set, and every tick log kept (the rows read them)."""
    return _keep_logs(config.with_phase(section, response_chain_depth=depth))


def memory_config(config: Config, section: str, mode: str) -> Config:
    """``config`` with one phase's ``[memory] mode`` set (``[memory.phases.<name>]``), and
    every tick log kept."""
    if not known_memory(mode):
        raise InputError(None, "--memory", f"expected window and/or retrieve (got {mode!r})")
    name = section_name(section)
    phases = dict(config.memory.phases)
    phases[name] = (phases.get(name) or MemoryPhaseConfig()).model_copy(update={"mode": mode})
    memory = config.memory.model_copy(update={"phases": phases})
    return _keep_logs(config.model_copy(update={"memory": memory}))


async def _run(world: Path, config: Config, ticks: int) -> None:
    seed = Storage(world).load().seed
    built = build_stack(config, seed)
    stack = replace(built, adapter=ScratchAdapter(built.adapter))
    try:
        await Runner(world, config, stack=stack).run_async(ticks)
    finally:
        await stack.aclose()


def run_depth(world_dir: Path, config: Config, section: str, depth: int, ticks: int) -> TuneRow:
    """Run ``ticks`` ticks of a scratch copy with ``section`` at ``depth``; its row."""
    return _run_row(world_dir, depth_config(config, section, depth), section, depth, ticks)


def run_memory(world_dir: Path, config: Config, section: str, mode: str, ticks: int) -> TuneRow:
    """Run ``ticks`` ticks of a scratch copy with ``section``'s memory ``mode``; its row."""
    depth = config.phase(section).response_chain_depth
    tuned = memory_config(config, section, mode)
    return _run_row(world_dir, tuned, section, depth, ticks, memory=mode)


def _run_row(
    world_dir: Path, config: Config, section: str, depth: int, ticks: int, memory: str | None = None
) -> TuneRow:
    name = section_name(section)
    with tempfile.TemporaryDirectory(prefix="sim-tune-") as tmp:
        world = scratch_copy(world_dir, Path(tmp) / "world")
        started = time.perf_counter()
        interrupts.run(_run(world, config, ticks))
        wall = time.perf_counter() - started
        logs, problems = read_logs(world)
        if problems:  # the scratch run wrote them just now: a bug, not a user error
            raise RuntimeError(f"tune: unreadable scratch log: {problems[0]}")
        phase = UsageRow(name)
        windows = 0
        seen: dict[tuple[int, str], tuple[str, ...]] = {}
        for log in logs:
            for call in log.call_records:
                if call.phase == name:
                    phase.add_call(call, config.prices)
                    windows += len(call.history)
                    lines = memory_shown(call.input) if memory is not None else None
                    if lines is not None and call.entity_key is not None:
                        seen[(log.tick, call.entity_key)] = lines
        total = log_totals(logs, config.prices)
        return TuneRow(depth, ticks, total, phase, wall, windows, memory=memory, seen=seen)


def tune(
    world_dir: Path,
    config: Config,
    section: str,
    depths: Sequence[int],
    ticks: int,
    on_row: Callable[[TuneRow], None] | None = None,
    memory: Sequence[str] = (),
) -> list[TuneRow]:
    """One row per depth (or, given ``memory``, per memory mode at the phase's own depth),
    each from the same starting state; ``on_row`` sees each as it ends.

    Raises:
        InputError: the world cannot be loaded, or a memory mode is unknown.
        LLMError: a provider or budget failure stopped a run (earlier rows were reported).
    """
    rows: list[TuneRow] = []
    for mode in memory:
        memory_config(config, section, mode)  # each mode checked before any run
    for i in range(len(memory) or len(depths)):
        if memory:
            row = run_memory(world_dir, config, section, memory[i], ticks)
            if rows:
                row.compare(rows[0])
        else:
            row = run_depth(world_dir, config, section, depths[i], ticks)
        rows.append(row)
        if on_row:
            on_row(row)
    return rows


def estimate(
    world_dir: Path,
    config: Config,
    section: str,
    depths: Sequence[int],
    ticks: int,
    memory: Sequence[str] = (),
) -> CostEstimate:
    """Estimate a tune run's cost without calling the provider.

    The same ticks are run on scratch copies with the offline provider (free, no network),
    and each call's token counts are priced at the price of the model the config asks for.
    The offline engine counts tokens roughly (about four characters each) and writes
    shorter answers than most models, so this is an order of magnitude, not a quote.
    """
    offline = offline_config(config)
    name = section_name(section)
    input_tokens = output_tokens = 0
    cost = Cost()
    variants = [memory_config(offline, section, mode) for mode in memory] or [
        depth_config(offline, section, depth) for depth in depths
    ]
    for variant in variants:
        with tempfile.TemporaryDirectory(prefix="sim-tune-estimate-") as tmp:
            world = scratch_copy(world_dir, Path(tmp) / "world")
            interrupts.run(_run(world, variant, ticks))
            logs, _ = read_logs(world)
        for log in logs:
            for call in log.call_records:
                usage = call_usage(call)
                input_tokens += usage.input_tokens
                output_tokens += usage.output_tokens
                # the offline model answered; price the tokens at the model the config
                # asks, on its provider (the offline model is named after it)
                target = resolve_model(config, call.model)
                cost = cost + price_usage(
                    usage, target.model, config.prices, provider=target.provider
                )
    method = (
        f"estimated by running the same {ticks} ticks x {len(variants)} "
        f"{'memory modes' if memory else 'depths'} of the "
        f"{name} phase offline (no calls sent) and pricing those token counts at the "
        "configured models' [prices], all input as uncached; real models write more or "
        "less than the offline one, so treat it as a rough guide"
    )
    return CostEstimate(input_tokens, output_tokens, cost, method)


__all__ = [
    "CostEstimate",
    "TuneRow",
    "estimate",
    "memory_shown",
    "run_depth",
    "run_memory",
    "scratch_copy",
    "tune",
]
