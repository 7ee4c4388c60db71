"""Provider adapters, one module per wire format, by name, each with its profile.

The registry is immutable and imports lazily: the built-ins below, then the adapters an
installed package offers in the ``sim.providers`` entry-point group (read once, at first
use; a built-in's name cannot be taken). ``sim/llm`` is the provider-agnostic pipeline
these plug into; nothing there imports this package.

Each kind has a ``ProviderProfile`` (``sim.llm.profile``): its default server and key
variable, structured-output forms, embeddings, capacity probe, SDK extra... The
built-ins' are in ``sim.providers.profiles``; a package's adapter class declares its own
as a ``profile`` class attribute. Code outside a provider's own module asks ``profile``,
never a kind's name (``tests/unit/test_provider_names.py``).

Owns: the adapters, one module per wire format, their profiles and registry, and the HTTP
client (``http/``).

May import: ``sim.llm``, ``sim.lifeline`` (the guard a ``cli`` command runs under), and
``sim.version`` (the User-Agent).

Next: a built-in provider is a module here, named in the registry below; a provider from a
package goes in the ``sim.providers`` entry-point group, its profile a ``profile`` class
attribute of its adapter.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from types import MappingProxyType
from typing import Any

from sim.llm.errors import LLMConfigurationError
from sim.llm.profile import ProviderProfile
from sim.llm.types import Adapter
from sim.providers import profiles

#: the entry-point group of providers offered by installed packages
GROUP = "sim.providers"

_BUILTIN = MappingProxyType(
    {
        "offline": "sim.offline.adapter:OfflineAdapter",
        "openai": "sim.providers.openai:OpenAIAdapter",
        "chat": "sim.providers.chat:ChatAdapter",
        "gemini": "sim.providers.gemini:GeminiAdapter",  # the sim[gemini] extra
        "anthropic": "sim.providers.anthropic:AnthropicAdapter",  # the sim[anthropic] extra
        "cli": "sim.providers.cli:CLIAdapter",  # a local command: prompt in, answer out
        "replay": "sim.providers.replay:ReplayAdapter",  # needs a log: sim replay, resume
    }
)

_PROFILES: Mapping[str, ProviderProfile] = MappingProxyType(
    {
        p.kind: p
        for p in (
            profiles.OFFLINE,
            profiles.OPENAI,
            profiles.CHAT,
            profiles.GEMINI,
            profiles.ANTHROPIC,
            profiles.CLI,
            profiles.REPLAY,
        )
    }
)

#: the kind a config that names none runs on: the one that sends nothing and needs no key
DEFAULT_KIND = profiles.OFFLINE.kind


@functools.cache
def _registry() -> Mapping[str, str | EntryPoint]:
    """Built-ins, then the ``sim.providers`` entry points (a built-in's name is kept)."""
    offered = {ep.name: ep for ep in entry_points(group=GROUP) if ep.name not in _BUILTIN}
    return MappingProxyType({**_BUILTIN, **dict(sorted(offered.items()))})


def providers() -> tuple[str, ...]:
    return tuple(_registry())


def builtin_kinds() -> tuple[str, ...]:
    """The built-in kinds, sim's own included (``replay``): no endpoint may take their
    names."""
    return tuple(_BUILTIN)


def selectable_kinds() -> tuple[str, ...]:
    """The built-in kinds a config may choose, in the order messages list them."""
    return tuple(kind for kind, p in _PROFILES.items() if p.selectable)


def is_builtin(kind: str) -> bool:
    return kind in _BUILTIN


def profile(kind: str) -> ProviderProfile:
    """The profile of ``kind``: a built-in's, or the one a package's adapter class declares
    as its ``profile`` class attribute, under the entry point's name (a subclass of a
    built-in adapter inherits that kind's facts); none declared, or the entry point fails
    to load: ``UNDECLARED`` (building the adapter says what is wrong).

    Raises:
        LLMConfigurationError: no such kind, or a package's ``profile`` that is not a
            ``ProviderProfile``.
    """
    found = _PROFILES.get(kind)
    if found is not None:
        return found
    target = _registry().get(kind)
    if not isinstance(target, EntryPoint):
        raise LLMConfigurationError(
            f"unknown provider {kind!r}; choose one of: {', '.join(_registry())}"
        )
    return _plugin_profile(kind, target)


def find_profile(kind: str) -> ProviderProfile | None:
    """``profile(kind)``, or ``None`` for a name no provider has."""
    if kind in _PROFILES:
        return _PROFILES[kind]
    return profile(kind) if kind in _registry() else None


@functools.cache
def _plugin_profile(kind: str, ep: EntryPoint) -> ProviderProfile:
    try:
        declared = getattr(ep.load(), "profile", None)
    except Exception:  # named by create_adapter, when the adapter is built
        declared = None
    if declared is None:
        return dataclasses.replace(profiles.UNDECLARED, kind=kind)
    if not isinstance(declared, ProviderProfile):
        raise LLMConfigurationError(
            f"provider {kind!r} (entry point {ep.value} in group {GROUP!r}): its `profile` "
            "is not a sim.llm.profile.ProviderProfile"
        )
    return dataclasses.replace(declared, kind=kind)


def plugin_providers() -> tuple[str, ...]:
    """The providers installed packages offer (the ``sim.providers`` group)."""
    return tuple(name for name in _registry() if name not in _BUILTIN)


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
    registry = _registry()
    try:
        target = registry[provider]
    except KeyError:
        raise LLMConfigurationError(
            f"unknown provider {provider!r}; choose one of: {', '.join(registry)} "
            "(set [llm] provider in config.toml or pass --provider)"
        ) from None
    if isinstance(target, EntryPoint):
        cls = _load_plugin(provider, target)
    else:
        module_name, _, class_name = target.partition(":")
        cls = getattr(importlib.import_module(module_name), class_name)
    taken = options_of(cls)
    if isinstance(target, EntryPoint):
        # an installed provider takes what it declares of the options sim passes every
        # network provider (base_url, api_key_env, timeouts...)
        options = {name: value for name, value in options.items() if name in taken}
    unknown = [name for name in options if name not in taken]
    if unknown:
        raise LLMConfigurationError(
            f"provider {provider!r}: unknown option(s) {', '.join(map(repr, unknown))}; "
            f"it takes: {', '.join(taken)}"
        )
    adapter: Adapter = cls(**options)
    return adapter


def _load_plugin(provider: str, ep: EntryPoint) -> type:
    """The adapter class an entry point names, or an error naming the entry point."""
    where = f"provider {provider!r} (entry point {ep.value} in group {GROUP!r})"
    try:
        cls = ep.load()
    except Exception as exc:  # a broken plugin is named, never a traceback
        raise LLMConfigurationError(f"{where} failed to load: {exc}") from None
    if not isinstance(cls, type) or not inspect.iscoroutinefunction(getattr(cls, "execute", None)):
        raise LLMConfigurationError(
            f"{where} is not an adapter class: it needs an `async def execute(self, request)` "
            "(the sim.llm.types.Adapter protocol)"
        )
    return cls
