"""The trust rule for a world's own ``config.toml``: worlds are shared, so a world's config
may not change where requests go, which credential they carry or the policy gates, unless
the user trusts it (``--trust-world-config``) or sets the same value in their own config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.config.names import ENDPOINT_KEYS, PHASE_SECTIONS, ROUTING_KEYS, ROUTING_TABLES
from sim.errors import InputError
from sim.llm.budget import Price, find_price
from sim.providers import find_profile, selectable_kinds


def _sends_nothing(kind: object) -> bool:
    """A built-in kind that sends no request and carries no key (the offline model)."""
    found = find_profile(kind) if isinstance(kind, str) and kind in selectable_kinds() else None
    return found is not None and found.sends_nothing


@dataclass(frozen=True)
class Rule:
    """Whose settings the rule judges and how the user opts in: the words of its errors
    (the same rule holds for a world's ``config.toml`` and a study file's factors)."""

    #: what set the value, e.g. "a world's config"
    subject: str
    #: how to trust it anyway, after "pass", e.g. "--trust-world-config if you trust this world"
    opt_in: str

    def remedy(self) -> str:
        return f"set it in your own config (--config or ./config.toml) or pass {self.opt_in}"

    def refusal(self, what: str) -> str:
        """The error's words for a setting that would change ``what``."""
        return f"{self.subject} may not change {what}; {self.remedy()}"


#: what the routing keys decide (``Rule.refusal``)
_ROUTING = "where requests go or which credential they carry"


#: the rule for a world's own ``config.toml``
WORLD_RULE = Rule("a world's config", "--trust-world-config if you trust this world")


def endpoint_paths(data: Mapping[str, Any]) -> list[str]:
    """Dotted paths of the endpoint keys (``ENDPOINT_KEYS``) a raw config layer sets, e.g.
    ``["llm.base_url", "phases.opinion.provider"]``: what the trust rule checks."""
    out: list[str] = []
    for section, value in data.items():
        if not isinstance(value, Mapping):
            continue
        if section == "phases":
            for name, phase in value.items():
                if isinstance(phase, Mapping):
                    out.extend(f"phases.{name}.{k}" for k in phase if k in ENDPOINT_KEYS)
        elif section == "llm" or section in PHASE_SECTIONS:
            out.extend(f"{section}.{k}" for k in value if k in ENDPOINT_KEYS)
    return out


def _routing_settings(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value of every routing setting in a config layer."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if (not prefix and key in ROUTING_TABLES) or key in ROUTING_KEYS:
            out[dotted] = value
        elif isinstance(value, Mapping):
            out.update(_routing_settings(value, f"{dotted}."))
    return out


#: what ``lookup`` answers for a key a layer does not set
MISSING = object()


def lookup(data: Mapping[str, Any], dotted: str) -> Any:
    """The value of the dotted key in a raw config layer, else ``MISSING``."""
    value: Any = data
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return MISSING
        value = value[part]
    return value


@dataclass(frozen=True)
class _Layers:
    """What the trust checks judge: the world's config layer ``world`` (read from
    ``source``), the user's layers merged so far (``users``), the command line's overrides
    (``flags``), and the ``rule`` that words the errors."""

    world: Mapping[str, Any]
    users: Mapping[str, Any]
    source: Path
    flags: Mapping[str, Any]
    rule: Rule


def _untrusted_routing(layers: _Layers) -> list[InputError]:
    """A problem for each routing setting the world's config changes from the user's (a
    setting the user's flags override is moot)."""
    problems: list[InputError] = []
    for dotted, value in _routing_settings(layers.world).items():
        if lookup(layers.flags, dotted) is not MISSING:
            continue  # the command line decides this one
        if dotted.rpartition(".")[2] == "provider" and _sends_nothing(value):
            continue  # the one choice that sends nothing and carries no key
        chosen = lookup(layers.users, dotted)
        if chosen == value or (chosen is MISSING and value == ""):
            continue  # the user chose the same thing (or the world restates the default)
        problems.append(InputError(layers.source, dotted, layers.rule.refusal(_ROUTING)))
    return problems


def _phase_layers(data: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Section -> settings of every phase section a raw config layer sets."""
    out: dict[str, Mapping[str, Any]] = {}
    for section in PHASE_SECTIONS:
        if isinstance(data.get(section), Mapping):
            out[section] = data[section]
    declared = data.get("phases")
    if isinstance(declared, Mapping):
        for name, value in declared.items():
            if isinstance(value, Mapping):
                out[f"phases.{name}"] = value
    return out


def _untrusted_models(layers: _Layers) -> list[InputError]:
    """A problem for each model string in the world's config qualified with an endpoint the
    user did not choose: a kind other than one that sends nothing (offline) and the user's
    ``[llm] provider`` (``openai/gpt-4.1`` would send ``OPENAI_API_KEY`` to OpenAI). A
    provider name only the world declares is reported by its ``[providers.*]`` table
    (``_untrusted_routing``)."""
    world, users, flags = layers.world, layers.users, layers.flags
    chosen_kind = lookup(flags, "llm.provider")  # --provider, else the user's config
    if chosen_kind is MISSING:
        chosen_kind = lookup(users, "llm.provider")
    declared = users.get("providers")
    chosen_names = set(declared) if isinstance(declared, Mapping) else set()
    problems: list[InputError] = []
    for section, settings in _phase_layers(world).items():
        for key in ("model", "fallback_models"):
            if key not in settings or lookup(flags, f"{section}.{key}") is not MISSING:
                continue
            value = settings[key]
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, (list, tuple)):
                continue  # a type error, reported by validation
            for name in names:
                if not isinstance(name, str):
                    continue
                head, slash, rest = name.strip().partition("/")
                if not slash or not rest.strip() or head in chosen_names:
                    continue
                if head not in selectable_kinds() or _sends_nothing(head) or head == chosen_kind:
                    continue  # a bare name, or an endpoint the user's config chose
                problems.append(
                    InputError(
                        layers.source,
                        f"{section}.{key}",
                        f"{name!r} runs on {head!r}, an endpoint your config does not use: "
                        + layers.rule.refusal(_ROUTING),
                    )
                )
    return problems


def _untrusted_policy(layers: _Layers) -> list[InputError]:
    """A problem for each ``[policy]`` key a world's config changes from the user's: the
    gates are the user's safety (what may be spent, on which models), so a shared world
    may not lift them on its own."""
    table = layers.world.get("policy")
    if not isinstance(table, Mapping):
        return []
    mine = layers.users.get("policy")
    mine = mine if isinstance(mine, Mapping) else {}
    problems: list[InputError] = []
    for key, value in table.items():
        if key in mine and mine[key] == value:
            continue  # the user chose the same (or the world restates the default)
        problems.append(
            InputError(
                layers.source,
                f"policy.{key}",
                layers.rule.refusal("the policy gates (docs/policies.md)"),
            )
        )
    return problems


def untrusted(
    world: Mapping[str, Any],
    users: Mapping[str, Any],
    source: Path,
    flags: Mapping[str, Any],
    rule: Rule = WORLD_RULE,
) -> list[InputError]:
    """Every setting of the world's config layer ``world`` (read from ``source``) that the
    trust rule refuses, given the user's layers merged so far (``users``) and the command
    line's overrides (``flags``): routing keys, endpoint-qualified models, policy gates.
    ``rule`` words the errors (a study file's factors: ``sim.study.trust``)."""
    layers = _Layers(world, users, source, flags, rule)
    return [*_untrusted_routing(layers), *_untrusted_models(layers), *_untrusted_policy(layers)]


# -- limits: a world may tighten them, never loosen them --------------------------------------

#: the caps a world's config may only tighten, with what 0 means: ``True`` when 0 is "no
#: cap" (the stricter of two caps is then the smaller non-zero one)
CAPS: dict[str, bool] = {
    "budget.max_cost_usd": True,
    "budget.max_total_tokens": True,
    # the pace the user keeps to their provider's quota
    "llm.requests_per_minute": True,
    "llm.tokens_per_minute": True,
    "limits.max_entity_bytes": False,
}

#: the fields of a ``[prices."<model>"]`` entry (US dollars per million tokens)
PRICE_FIELDS = ("input", "cached_input", "output")

#: the user's settings under which a price a world adds for a model the user has not
#: priced could let calls through: a cost cap, and the approval a tick's cost asks
_PRICE_GUARDS = ("budget.max_cost_usd", "policy.approve_above_usd")


def _number(value: Any) -> float | None:
    """A TOML number (not a bool), else ``None`` (validation reports the type)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _stricter(mine: float, theirs: float, zero_is_no_cap: bool) -> float:
    if zero_is_no_cap and mine == 0:
        return theirs
    if zero_is_no_cap and theirs == 0:
        return mine
    return min(mine, theirs)


def _price_table(raw: Mapping[str, Any]) -> dict[str, Price]:
    """A raw ``[prices]`` table as ``Price``s (a malformed entry, which validation reports,
    left out)."""
    out: dict[str, Price] = {}
    for key, entry in raw.items():
        if isinstance(entry, Mapping):
            values = [_number(entry.get(f, 0.0)) for f in PRICE_FIELDS]
            if all(v is not None for v in values):
                out[key] = Price(*(v or 0.0 for v in values))
    return out


def _users_price(prices: Mapping[str, Price], key: str) -> Price | None:
    """The user's price a world's ``[prices."<key>"]`` stands in for: the same key, else
    what the lookup (``find_price``) would find without it: the undated name of a
    snapshot, the model of a provider-qualified key."""
    _, slash, rest = key.partition("/")
    for name in (key, rest) if slash and rest else (key,):
        found = find_price(prices, name)
        if found is not None:
            return found
    return None


def tightened(
    merged: Mapping[str, Any],
    world: Mapping[str, Any],
    users: Mapping[str, Any],
    source: Path,
) -> tuple[dict[str, Any], list[str]]:
    """``merged`` (every layer, flags included) with each limit the world's layer ``world``
    (read from ``source``) tried to loosen set back to the user's (``users``: the user's
    layers and flags without the world's), and a note for each.

    A world may tighten a limit, never loosen it: of two caps (``CAPS``) the stricter wins;
    a world's ``[prices]`` entry may raise a price the user's config (or the built-in
    table) sets, never lower it; and it may price a model the user has not priced only
    when no cost cap or cost approval (``_PRICE_GUARDS``) depends on that price. This holds
    with ``--trust-world-config`` too: that flag trusts a world's routing, not its spending.
    """
    out = {
        key: dict(value) if isinstance(value, Mapping) else value for key, value in merged.items()
    }
    notes: list[str] = []
    for dotted, zero_is_no_cap in CAPS.items():
        section, _, key = dotted.partition(".")
        theirs = _number(lookup(world, dotted))
        if theirs is None:
            continue
        mine = _number(lookup(users, dotted))
        if mine is None:
            continue  # the user's layers always hold the built-in default
        stricter = _stricter(mine, theirs, zero_is_no_cap)
        if stricter == theirs:
            continue  # tightened, or the same
        value = lookup(users, dotted)
        out[section][key] = value
        notes.append(
            f"{source}: {dotted} = {lookup(world, dotted)!r} would loosen your "
            f"{value!r}; using yours (a world's config may tighten a limit, never loosen it)"
        )
    table = world.get("prices")
    if isinstance(table, Mapping):
        raw = users.get("prices")
        users_prices = _price_table(raw) if isinstance(raw, Mapping) else {}
        guarded = [g for g in _PRICE_GUARDS if (_number(lookup(users, g)) or 0.0) > 0]
        prices = dict(out.get("prices") or {})
        for model, entry in table.items():
            if not isinstance(entry, Mapping):
                continue  # a type error, reported by validation
            theirs_entry = {f: _number(entry.get(f, 0.0)) for f in PRICE_FIELDS}
            if any(v is None for v in theirs_entry.values()):
                continue
            mine_entry = _users_price(users_prices, model)
            where = f'{source}: prices."{model}"'
            if mine_entry is None:
                if guarded:
                    prices.pop(model, None)
                    notes.append(
                        f"{where} prices a model your config does not price; ignored, since "
                        f"your {' and '.join(guarded)} depend on prices (add the price to "
                        "your own config)"
                    )
                continue
            mine_values = {f: getattr(mine_entry, f) for f in PRICE_FIELDS}
            lowered = [f for f in PRICE_FIELDS if (theirs_entry[f] or 0.0) < mine_values[f]]
            if not lowered:
                continue
            prices[model] = {f: max(theirs_entry[f] or 0.0, mine_values[f]) for f in PRICE_FIELDS}
            notes.append(
                f"{where}: {', '.join(lowered)} would lower your price; using yours (a world's "
                "config may raise a price, never lower it)"
            )
        out["prices"] = prices
    return out, notes
