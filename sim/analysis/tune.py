"""Tuning one phase's chain depth: run the same ticks at several depths and compare.

For each depth, ``tune`` copies the world into a scratch folder (its files and response
store, not its logs), runs ``ticks`` ticks there with the phase's ``response_chain_depth``
overridden, and reads the numbers back from the scratch copy's tick logs, so a row counts
exactly what ``sim usage`` would. The live world is only read, under its lock.

In the scratch copy nothing the live world refers to is ever deleted at the provider: a
chain's old responses belong to the live world, so only responses the scratch run itself
created are deleted when its chains evict them.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sim.analysis.usage import UsageRow, call_row, log_totals
from sim.config import PHASE_ALIASES, Config, offline_config, resolve_model, section_name
from sim.engine.deletions import PENDING
from sim.engine.runner import Runner
from sim.engine.stack import build_stack
from sim.llm.budget import Cost, price_usage
from sim.llm.types import Adapter, AdapterResponse, ModelRequest
from sim.llm.wrapper import AdapterWrapper
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

    @property
    def avg_window(self) -> float:
        """Mean number of earlier exchanges sent per call of the phase."""
        return self.windows / self.phase.requests if self.phase.requests else 0.0

    def to_dict(self) -> dict[str, Any]:
        total = self.total.to_dict()
        del total["key"]
        return {
            "depth": self.depth,
            "ticks": self.ticks,
            **total,
            "wall_seconds": round(self.wall_seconds, 3),
            "phase_requests": self.phase.requests,
            "phase_input_tokens": self.phase.input_tokens,
            "avg_window": round(self.avg_window, 3),
        }


@dataclass
class Estimate:
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


def depth_config(config: Config, section: str, depth: int) -> Config:
    """``config`` with one phase's depth set, and every tick log kept (the rows read them)."""
    history = config.history.model_copy(update={"keep_ticks": 0})
    tuned = config.with_phase(section, response_chain_depth=depth)
    return tuned.model_copy(update={"history": history})


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
    name = section_name(section)
    with tempfile.TemporaryDirectory(prefix="sim-tune-") as tmp:
        world = scratch_copy(world_dir, Path(tmp) / "world")
        started = time.perf_counter()
        asyncio.run(_run(world, depth_config(config, section, depth), ticks))
        wall = time.perf_counter() - started
        logs, problems = read_logs(world)
        if problems:  # the scratch run wrote them just now: a bug, not a user error
            raise RuntimeError(f"tune: unreadable scratch log: {problems[0]}")
        phase = UsageRow(name)
        windows = 0
        for log in logs:
            for call in log.call_records:
                if call.phase == name:
                    phase.add(call_row(name, call, config.prices))
                    windows += len(call.history)
        return TuneRow(depth, ticks, log_totals(logs, config.prices), phase, wall, windows)


def tune(
    world_dir: Path,
    config: Config,
    section: str,
    depths: Sequence[int],
    ticks: int,
    on_row: Callable[[TuneRow], None] | None = None,
) -> list[TuneRow]:
    """One row per depth, each from the same starting state; ``on_row`` sees each as it ends.

    Raises:
        InputError: the world cannot be loaded.
        LLMError: a provider or budget failure stopped a run (earlier rows were reported).
    """
    rows = []
    for depth in depths:
        row = run_depth(world_dir, config, section, depth, ticks)
        rows.append(row)
        if on_row:
            on_row(row)
    return rows


def estimate(
    world_dir: Path, config: Config, section: str, depths: Sequence[int], ticks: int
) -> Estimate:
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
    for depth in depths:
        with tempfile.TemporaryDirectory(prefix="sim-tune-estimate-") as tmp:
            world = scratch_copy(world_dir, Path(tmp) / "world")
            asyncio.run(_run(world, depth_config(offline, section, depth), ticks))
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
        f"estimated by running the same {ticks} ticks x {len(depths)} depths of the "
        f"{name} phase offline (no calls sent) and pricing those token counts at the "
        "configured models' [prices], all input as uncached; real models write more or "
        "less than the offline one, so treat it as a rough guide"
    )
    return Estimate(input_tokens, output_tokens, cost, method)


__all__ = ["Estimate", "TuneRow", "estimate", "run_depth", "scratch_copy", "tune"]
