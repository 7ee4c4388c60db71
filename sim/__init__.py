"""sim: a tick-based engine for LLM-driven world simulations.

The names in ``__all__`` are the public API (see ``docs/api.md``); everything else is
private and may change. They are imported lazily, so ``import sim`` (and the CLI) stays
cheap: a name's module loads the first time the name is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sim.version import __version__ as __version__

#: public name -> the module that defines it
_EXPORTS = {
    # configuration
    "Config": "sim.config",
    "load_config": "sim.config",
    # a world
    "Storage": "sim.storage",
    "World": "sim.world",
    "Entity": "sim.world",
    # running ticks
    "Runner": "sim.engine.runner",
    "TickResult": "sim.engine.runner",
    "PhaseReport": "sim.phases.base",
    "LLMEvent": "sim.llm.events",
    "EventSink": "sim.llm.events",
    # phases of your own
    "Phase": "sim.phases.protocol",
    "TickContext": "sim.phases.base",
    "LLMRequest": "sim.llm.client",
    # results and history
    "TickLog": "sim.ticklog.reader",
    "read_log": "sim.ticklog.reader",
    "log_path": "sim.ticklog.format",
    "replay": "sim.engine.replay",
    "ReplayReport": "sim.engine.replay",
    "usage_report": "sim.analysis.usage",
    # errors
    "SimError": "sim.errors",
    "InputError": "sim.errors",
    "RunFailed": "sim.errors",
    "LLMError": "sim.llm.errors",
}

__all__ = [
    "Config",
    "Entity",
    "EventSink",
    "InputError",
    "LLMError",
    "LLMEvent",
    "LLMRequest",
    "Phase",
    "PhaseReport",
    "ReplayReport",
    "RunFailed",
    "Runner",
    "SimError",
    "Storage",
    "TickContext",
    "TickLog",
    "TickResult",
    "World",
    "load_config",
    "log_path",
    "read_log",
    "replay",
    "usage_report",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from sim.analysis.usage import usage_report
    from sim.config import Config, load_config
    from sim.engine.replay import ReplayReport, replay
    from sim.engine.runner import Runner, TickResult
    from sim.errors import InputError, RunFailed, SimError
    from sim.llm.client import LLMRequest
    from sim.llm.errors import LLMError
    from sim.llm.events import EventSink, LLMEvent
    from sim.phases.base import PhaseReport, TickContext
    from sim.phases.protocol import Phase
    from sim.storage import Storage
    from sim.ticklog.format import log_path
    from sim.ticklog.reader import TickLog, read_log
    from sim.world import Entity, World
