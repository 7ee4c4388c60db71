"""The protocol of a phase that is not built in, and how the engine runs one.

A phase a package adds (entry-point group ``sim.phases``) or a world declares in
``[phases.<name>]`` is an object with a ``name`` and three methods; the engine does the
rest: one ``LLMClient`` configured from ``[phases.<name>]``, the batch, the report (calls,
failures, usage), the log records, the chain key ``<name>:<id>`` of each request::

    subjects(ctx)                     -> the entities it is about (chains live in them)
    requests(ctx, subjects)           -> one LLMRequest per subject (entity_key "<name>:<id>")
    apply(ctx, subjects, results)     -> results[i] is the answer (a pydantic model) or an
                                         LLMError; mutate entities, return {id: result} for
                                         the tick log

A package registers one in its ``pyproject.toml``::

    [project.entry-points."sim.phases"]
    gossip = "my_package.phases:GossipPhase"

The entry point may name an instance or a class (called without arguments); its ``name``
must be the entry point's name. A world runs it by listing the name in ``[tick] phases``.

A phase may also define ``async ask(ctx, client, subjects, requests) -> (results, calls)``
to take several calls per subject (a declared phase with ``tools`` does: tool steps); the
engine then uses it instead of one batch, and takes the failure fraction over subjects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol, runtime_checkable

from sim.errors import SimError
from sim.llm.client import LLMRequest
from sim.llm.errors import LLMError
from sim.phases.base import TickContext
from sim.phases.refs import verified
from sim.plugins import load_plugin
from sim.world import Entity

GROUP = "sim.phases"


@runtime_checkable
class Phase(Protocol):
    """A phase the engine runs like a built-in one (see the module docstring)."""

    name: str

    def subjects(self, ctx: TickContext) -> Sequence[Entity]: ...

    def requests(self, ctx: TickContext, subjects: Sequence[Entity]) -> Sequence[LLMRequest]: ...

    def apply(
        self, ctx: TickContext, subjects: Sequence[Entity], results: Sequence[Any]
    ) -> Mapping[str, Any]: ...


class PhaseFailed(SimError):
    """A phase's own code raised: the tick is not committed (exit code 1)."""

    exit_code = 1


async def run_phase(phase: Phase, ctx: TickContext) -> None:
    """Run one protocol phase: subjects, requests, the batch, apply; report and log.

    Raises:
        PhaseFailed: the phase's code raised (named; nothing is committed).
    """
    report = ctx.report(phase.name)
    try:
        subjects = list(phase.subjects(ctx))
        requests = list(phase.requests(ctx, subjects))
    except SimError:
        raise
    except Exception as exc:
        raise PhaseFailed(f"phase {phase.name!r} failed building its requests: {exc!r}") from exc
    client = ctx.client(f"phases.{phase.name}", subjects, phase.name)
    ask = getattr(phase, "ask", None)
    if ask is not None and requests:  # several calls per subject (tool steps)
        results, calls = await ask(ctx, client, subjects, requests)
        report.calls += calls
        report.entities += len(subjects)
    else:
        results = await client.create_batch(requests) if requests else []
        report.calls += len(requests)
    # an answer from a tick log, or a tool call, never passed recovery's check
    results = [verified(r, q.check) for q, r in zip(requests, results, strict=True)]
    for request, result in zip(requests, results, strict=True):
        if isinstance(result, LLMError):
            report.fail(str(request.entity_key), result)
    try:
        ctx.results[phase.name] = dict(phase.apply(ctx, subjects, results))
    except SimError:
        raise
    except Exception as exc:
        raise PhaseFailed(f"phase {phase.name!r} failed applying its answers: {exc!r}") from exc


def entry_point_phases() -> dict[str, EntryPoint]:
    """The phases installed packages offer, by name."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def load_entry_point(ep: EntryPoint) -> Phase:
    """The phase an entry point names (an instance, or a class called without arguments).

    Raises:
        InputError: it cannot be imported, or it does not follow the protocol.
    """
    phase: Phase = load_plugin(
        ep, Phase, "tick.phases", "a phase: it needs name, subjects, requests and apply"
    )
    return phase
