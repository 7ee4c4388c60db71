"""Custom policies from installed packages: the ``sim.policies`` entry-point group.

A package registers one in its ``pyproject.toml``::

    [project.entry-points."sim.policies"]
    office_hours = "my_package.policies:OfficeHours"

The entry point names an instance, or a class called without arguments; its ``name`` must
be the entry point's name. A config turns it on by listing the name in ``[policy] custom``.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from sim.errors import InputError
from sim.plugins import load_plugin
from sim.policy.types import Policy

GROUP = "sim.policies"


def entry_point_policies() -> dict[str, EntryPoint]:
    """The policies installed packages offer, by name."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def load_policies(names: tuple[str, ...]) -> list[Policy]:
    """The policies ``[policy] custom`` names, in order.

    Raises:
        InputError: a name no installed package offers, an entry point that cannot be
            imported, or an object that does not follow the ``Policy`` protocol.
    """
    if not names:
        return []
    offered = entry_point_policies()
    out: list[Policy] = []
    for name in names:
        ep = offered.get(name)
        if ep is None:
            choices = ", ".join(sorted(offered)) or "none is installed"
            raise InputError(
                None,
                "policy.custom",
                f"no policy {name!r} in entry-point group {GROUP!r} (installed: {choices})",
            )
        out.append(_load(ep))
    return out


def _load(ep: EntryPoint) -> Policy:
    policy: Policy = load_plugin(
        ep, Policy, "policy.custom", "a policy: it needs a name and decide(call)"
    )
    return policy
