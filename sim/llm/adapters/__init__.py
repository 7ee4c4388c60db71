"""Provider adapters, by name. The registry is immutable and imports lazily."""

from __future__ import annotations

import importlib
import inspect
from types import MappingProxyType
from typing import Any

from sim.llm.errors import LLMConfigurationError
from sim.llm.types import Adapter

_REGISTRY = MappingProxyType(
    {
        "offline": "sim.offline.adapter:OfflineAdapter",
        "openai": "sim.llm.adapters.openai:OpenAIAdapter",
        "chat": "sim.llm.adapters.chat:ChatAdapter",
        "gemini": "sim.llm.adapters.gemini:GeminiAdapter",  # the sim[gemini] extra
        "anthropic": "sim.llm.adapters.anthropic:AnthropicAdapter",  # the sim[anthropic] extra
        "cli": "sim.llm.adapters.cli:CLIAdapter",  # a local command: prompt in, answer out
        "replay": "sim.llm.adapters.replay:ReplayAdapter",  # needs a log: sim replay, resume
    }
)


def providers() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def options_of(cls: type) -> list[str]:
    """The keyword options ``cls`` takes: its constructor's, and, where a constructor passes
    ``**options`` on to its base class, the base's as well (down the MRO)."""
    taken: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = list(inspect.signature(init).parameters.values())[1:]  # after self
        taken += [
            p.name
            for p in params
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in taken
        ]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return taken


def create_adapter(provider: str, **options: Any) -> Adapter:
    """Build the adapter registered as ``provider`` with its own keyword options.

    Raises:
        LLMConfigurationError: no such provider, or an option it does not take (a
            misspelt option is an error, never silently ignored).
    """
    try:
        target = _REGISTRY[provider]
    except KeyError:
        raise LLMConfigurationError(
            f"unknown provider {provider!r}; choose one of: {', '.join(_REGISTRY)} "
            "(set [llm] provider in config.toml or pass --provider)"
        ) from None
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    taken = options_of(cls)
    unknown = [name for name in options if name not in taken]
    if unknown:
        raise LLMConfigurationError(
            f"provider {provider!r}: unknown option(s) {', '.join(map(repr, unknown))}; "
            f"it takes: {', '.join(taken)}"
        )
    adapter: Adapter = cls(**options)
    return adapter
