"""Loading an object an installed package offers through an entry point (``sim.phases``,
``sim.policies``): a broken or wrong plugin is named, never a traceback."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import Any

from sim.errors import InputError


def load_plugin(ep: EntryPoint, protocol: type[Any], field: str, needs: str) -> Any:
    """The object ``ep`` names (an instance, or a class called without arguments),
    checked at run time to follow ``protocol`` (typed ``Any``: mypy takes no protocol
    class as a ``type[T]``; the caller annotates what it gets).

    Args:
        protocol: the runtime-checkable protocol it must follow.
        field: the config field that asked for it (``tick.phases``), for the error.
        needs: what the protocol asks, for the error ("a phase: it needs ...").

    Raises:
        InputError: it cannot be imported, it does not follow the protocol, or its ``name``
            is not the entry point's name.
    """
    where = f"entry point {ep.name!r} ({ep.value}) in group {ep.group!r}"
    try:
        obj = ep.load()
        plugin = obj() if isinstance(obj, type) else obj
    except Exception as exc:  # a broken plugin is named, never a traceback
        raise InputError(None, f"{field}: {ep.name}", f"{where} failed to load: {exc}") from None
    if not isinstance(plugin, protocol):
        raise InputError(None, f"{field}: {ep.name}", f"{where} is not {needs}")
    name = getattr(plugin, "name", None)
    if name != ep.name:
        raise InputError(None, f"{field}: {ep.name}", f"{where} says its name is {name!r}")
    return plugin
