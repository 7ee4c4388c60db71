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
        "replay": "sim.llm.adapters.replay:ReplayAdapter",  # needs a log: sim replay, resume
    }
)


def providers() -> tuple[str, ...]:
    return tuple(_REGISTRY)


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
    try:
        inspect.signature(cls).bind_partial(**options)
    except TypeError as exc:
        taken = [
            p.name
            for p in inspect.signature(cls).parameters.values()
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        raise LLMConfigurationError(
            f"provider {provider!r}: {exc}; it takes: {', '.join(taken)}"
        ) from None
    adapter: Adapter = cls(**options)
    return adapter
