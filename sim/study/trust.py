"""The trust rule for a study file: studies are shared as worlds are, so a study's factors
get the rule a world's own ``config.toml`` gets (``sim.config.trust``).

Every run of a study is given its factor values as ``--set`` flags, which a child ``sim``
process trusts as the user's own: so they are judged here, once, before anything is
forked or called, against the user's own layers (the defaults and ``--config``, else
``./config.toml``: ``sim.config.user_layers``):

- where requests go, which credential they carry, the program a ``cli`` provider runs
  (``ROUTING_KEYS``, ``[providers.*]``), models qualified with an endpoint the user's
  config does not use, and the policy gates: refused unless the user's config sets the
  same value, or the user passes ``--trust-study`` (each such factor is then named in a
  note);
- the limits (``[budget]``, the request pace, ``[limits]``, ``[prices]``): a factor may
  tighten them, never loosen them, ``--trust-study`` or not.

A study's conditions schedule interventions (``sim inject``, ``sim set`` on a world's
entities) and its surveys questions: neither carries a config setting.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from sim.config import InvalidConfig, merge_tables
from sim.config.trust import MISSING, Rule, lookup, tightened, untrusted
from sim.errors import InputError
from sim.runs.design import nested
from sim.study.design import Study
from sim.study.network import NETWORK_FACTOR

logger = logging.getLogger(__name__)

#: the rule's words for a study file
STUDY_RULE = Rule("a study file", "--trust-study if you trust this study")


class RefusedStudy(InvalidConfig):
    """Every factor of a study file the trust rule refuses, one per line (exit 2)."""

    def __init__(self, problems: list[InputError]) -> None:
        super().__init__(problems)
        if len(problems) > 1:
            lines = "\n  ".join(str(p) for p in problems)
            self.args = (f"study file refused ({len(problems)} problems):\n  {lines}",)


def _values(values: list[Any]) -> list[Any]:
    """A factor's values without repeats (each judged once)."""
    out: list[Any] = []
    for value in values:
        if value not in out:
            out.append(value)
    return out


def check_factors(study: Study, users: Mapping[str, Any], trust: bool = False) -> list[str]:
    """Judge every value of every factor of ``study`` against the user's own layers
    ``users`` (``sim.config.user_layers``); return a note for each factor ``--trust-study``
    (``trust``) let through.

    Raises:
        RefusedStudy: every refused factor, each naming the study file, the factor (its
            config key) and what the rule says: a routing setting without ``trust``, a
            limit loosened (with or without it).
    """
    problems: list[InputError] = []
    notes: list[str] = []
    for key, values in study.spec.factors.items():
        if key == NETWORK_FACTOR:  # a network shape, not a config setting
            continue
        field = f'factors."{key}"'
        trusted = False
        for value in _values(values):
            layer = nested({key: value})
            routing = untrusted(layer, users, study.path, {}, STUDY_RULE)
            if routing and trust:
                trusted = True
            elif routing:
                problems.append(InputError(study.path, field, routing[0].problem))
                break
            merged = merge_tables(users, layer)
            kept, _ = tightened(merged, layer, users, study.path)
            if lookup(kept, key) != value:
                yours = lookup(kept, key)
                shown = "" if yours is MISSING else f" ({yours!r})"
                problems.append(
                    InputError(
                        study.path,
                        field,
                        f"{value!r} would loosen the limit your config sets{shown}: "
                        f"{STUDY_RULE.subject} may tighten a limit, never loosen it "
                        "(--trust-study does not change this); set it in your own config "
                        "(--config or ./config.toml)",
                    )
                )
                break
        if trusted:
            notes.append(
                f"{study.path}: {field} sets where requests go, which credential they "
                "carry, the program a cli provider runs or a policy gate; trusted "
                "(--trust-study)"
            )
    if problems:
        raise RefusedStudy(problems)
    for note in notes:
        logger.warning("note: %s", note)
    return notes


__all__ = ["STUDY_RULE", "RefusedStudy", "check_factors"]
