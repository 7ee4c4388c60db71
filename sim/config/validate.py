"""Validating a config layer: every problem at once, each naming its file and field, and the
rules no single field states (a known provider, server chains and the Batch API only where
they are offered, no built-in names reused)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sim.config.models import Config, base_urls
from sim.config.names import (
    BUILTIN_PHASES,
    MEMORY_GROUP,
    MEMORY_STRATEGIES,
    PHASE_ALIASES,
    PHASE_SECTIONS,
    known_memory,
)
from sim.errors import InputError
from sim.providers import (
    builtin_kinds,
    find_profile,
    is_builtin,
    plugin_providers,
    profile,
    selectable_kinds,
)


def known_provider(kind: str) -> bool:
    """A built-in provider kind a config may choose, or one an installed package offers
    (``sim.providers``)."""
    if kind in selectable_kinds():
        return True
    return kind not in builtin_kinds() and kind in plugin_providers()  # reads entry points


class InvalidConfig(InputError):
    """Every problem found in the config layers, one per line (exit 2)."""

    def __init__(self, problems: list[InputError]) -> None:
        first = problems[0]
        super().__init__(first.path, first.field, first.problem)
        self.problems = problems
        if len(problems) > 1:
            lines = "\n  ".join(str(p) for p in problems)
            self.args = (f"config is invalid ({len(problems)} problems):\n  {lines}",)

    def __str__(self) -> str:
        return str(self.args[0])


def _memory_problems(config: Config, source: Path | None) -> list[InputError]:
    """``[memory] mode`` (and each phase's) names no memory strategy sim knows."""
    modes = [("memory.mode", config.memory.mode)] + [
        (f"memory.phases.{name}.mode", phase.mode)
        for name, phase in config.memory.phases.items()
        if phase.mode is not None
    ]
    return [
        InputError(
            source,
            field,
            f"unknown memory strategy {mode!r}; expected one of: "
            f"{', '.join(MEMORY_STRATEGIES)}, or one an installed package offers "
            f"(entry-point group {MEMORY_GROUP!r})",
        )
        for field, mode in modes
        if not known_memory(mode)
    ]


def layer_problems(
    data: Mapping[str, Any], source: Path | None, *, combined: bool = True
) -> list[InputError]:
    """Every validation problem of ``data``, each naming ``source`` and the field."""
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        out: list[InputError] = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            problem = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].lower()
            if err["type"] == "finite_number":
                problem = "expected a finite number"
            got = err.get("input")
            if err["type"] != "extra_forbidden" and not isinstance(got, Mapping):
                problem += f" (got {got!r})"
            out.append(InputError(source, field, problem))
        return out
    problems: list[InputError] = _memory_problems(config, source)
    if not known_provider(config.llm.provider):
        problems.append(
            InputError(
                source,
                "llm.provider",
                f"unknown provider {config.llm.provider!r}; "
                f"expected one of: {', '.join(selectable_kinds())}",
            )
        )
    elif profile(config.llm.provider).no_chains_why and config.llm.chain_mode == "server":
        why = profile(config.llm.provider).no_chains_why
        problems.append(
            InputError(
                source,
                "llm.chain_mode",
                f'server chains are not offered for provider "{config.llm.provider}" ({why}); '
                'use chain_mode = "window"',
            )
        )
    elif (
        combined
        and config.llm.chain_mode == "server"
        and not profile(config.llm.provider).server_chains
    ):
        chains = [k for k in selectable_kinds() if profile(k).server_chains]
        problems.append(
            InputError(
                source,
                "llm.chain_mode",
                f"provider {config.llm.provider!r} cannot keep chains on its server; "
                f'use chain_mode = "window" ("server" needs: {", ".join(chains)})',
            )
        )
    if config.llm.chain_mode == "server" or config.llm.batch:
        pooled = [
            f"{section}.base_url"
            for section in ("llm", *PHASE_SECTIONS, *(f"phases.{n}" for n in config.phases))
            if len(
                base_urls(
                    config.llm.base_url if section == "llm" else config.phase(section).base_url
                )
            )
            > 1
        ]
        if config.llm.batch:  # a named endpoint keeps no server chains, but it batches
            pooled += [
                f"providers.{name}.base_url"
                for name, named in config.providers.items()
                if len(base_urls(named.base_url)) > 1
            ]
        why = (
            "a list of servers cannot keep server-side chains (a response id is known "
            'only to the server that made it); use chain_mode = "window" with a pool'
            if config.llm.chain_mode == "server"
            else "a list of servers cannot take one Batch API upload (a batch lives on the "
            "server that made it); use batch = false with a pool, or one server"
        )
        problems.extend(InputError(source, field, why) for field in pooled)
    if (
        combined
        and config.llm.batch
        and known_provider(config.llm.provider)
        and profile(config.llm.provider).batch_api is False
    ):
        batching = [k for k in selectable_kinds() if profile(k).batch_api]
        problems.append(
            InputError(
                source,
                "llm.batch",
                f"the Batch API is not offered for provider {config.llm.provider!r}; "
                f"set batch = false or a provider that has it ({', '.join(batching)})",
            )
        )
    for section in (*PHASE_SECTIONS, *(f"phases.{n}" for n in config.phases)):
        provider = config.phase(section).provider
        if provider and not known_provider(provider):
            problems.append(
                InputError(
                    source,
                    f"{section}.provider",
                    f"unknown provider {provider!r}; "
                    f"expected one of: {', '.join(selectable_kinds())}",
                )
            )
    for name, spec in config.providers.items():
        if is_builtin(name):
            problems.append(
                InputError(
                    source,
                    f"providers.{name}",
                    f"{name!r} is a provider kind ({name}/model already means it); "
                    "give the endpoint another name",
                )
            )
        if not known_provider(spec.kind):
            problems.append(
                InputError(
                    source,
                    f"providers.{name}.kind",
                    f"unknown kind {spec.kind!r}; expected one of: {', '.join(selectable_kinds())}",
                )
            )
    problems.extend(_command_problems(config, source, combined))
    for verb in config.actions:
        if verb in ("move", "speak", "act", "wait"):
            problems.append(
                InputError(source, f"actions.{verb}", "a built-in action; choose another verb")
            )
        elif verb == "message" and config.messages is not None and config.messages.enabled:
            problems.append(
                InputError(
                    source,
                    "actions.message",
                    "the action of [messages] (enabled): choose another verb",
                )
            )
    for name in config.phases:
        if name in BUILTIN_PHASES:
            problems.append(
                InputError(
                    source,
                    f"phases.{name}",
                    "a built-in phase: configure it in its own section "
                    f"([{PHASE_ALIASES.get(name, name)}])"
                    if name in PHASE_ALIASES
                    else "a built-in phase without settings",
                )
            )
    return problems


def _command_problems(config: Config, source: Path | None, combined: bool) -> list[InputError]:
    """A command-running endpoint (``cli``) needs a ``command``; no other built-in kind
    takes one. ``[llm]``'s rule is checked on the merged layers only (one layer may set
    the provider, another the command)."""
    tables = [(f"providers.{n}", p.kind, p.command) for n, p in config.providers.items()]
    if combined:
        tables.insert(0, ("llm", config.llm.provider, config.llm.command))
    problems = []
    runners = " or ".join(f'"{k}"' for k in selectable_kinds() if profile(k).runs_command)
    for where, kind, command in tables:
        if not known_provider(kind):
            continue  # said already
        runs = profile(kind).runs_command
        if runs and not command:
            problems.append(
                InputError(
                    source,
                    f"{where}.command",
                    f'a "{kind}" provider needs the command to run, e.g. command = ["llm", '
                    '"-m", "gpt-4.1-mini"]: it gets the prompt on stdin and answers on stdout',
                )
            )
        elif command and not runs and is_builtin(kind):
            problems.append(
                InputError(
                    source,
                    f"{where}.command",
                    f"only a {runners} provider runs a command, not {kind!r}",
                )
            )
    return problems


def undeclared_endpoints(
    config: Config, source: Callable[[str], tuple[Path | None, str]]
) -> list[InputError]:
    """A problem for each model written ``NAME/model`` that would run on the offline
    provider because no ``[providers.NAME]`` declares ``NAME``; ``source`` says which file
    (``None``: the command line) and field set a dotted key.

    On a server, ``meta-llama/Llama-3-8B`` is a model's own name, sent as written (the
    server says if it has no such model). The offline model answers any name, so there
    ``local/qwen2.5-7b`` would quietly run offline while the user believes a model ran.
    """
    from sim.config.endpoints import phase_home  # needs the config's models

    problems: list[InputError] = []
    for section in (*PHASE_SECTIONS, *(f"phases.{n}" for n in config.phases)):
        home = find_profile(phase_home(config, section).kind)
        if home is None or not home.sends_nothing:
            continue
        phase = config.phase(section)
        for key, names in (("model", (phase.model,)), ("fallback_models", phase.fallback_models)):
            for name in names:
                head, slash, rest = name.strip().partition("/")
                if (
                    not slash
                    or not rest.strip()
                    or head in selectable_kinds()
                    or head in config.providers
                ):
                    continue
                path, field = source(f"{section}.{key}")
                problem = InputError(
                    path,
                    field,
                    f"{name!r} names the endpoint {head!r}, but no [providers.{head}] "
                    "section declares it, and the offline provider would answer in its "
                    f"place; add [providers.{head}] (kind, base_url: docs/providers.md) "
                    "to your config, or choose the provider with --provider",
                )
                if str(problem) not in {str(p) for p in problems}:  # --model: said once
                    problems.append(problem)
    return problems


def cli_model_problems(
    config: Config, source: Callable[[str], tuple[Path | None, str]]
) -> list[InputError]:
    """A problem for each model a ``cli`` endpoint could not pass to its command (one
    starting with ``-`` would add an option to it: ``sim.providers.cli``), naming the file
    and field that set it (``source``, as for ``undeclared_endpoints``): found when the
    config loads, before a tick writes anything."""
    from sim.config.endpoints import phase_home, resolve_model, routing

    endpoints = routing(config).endpoints
    problems: list[InputError] = []
    if not any(profile(spec.kind).runs_command for spec in endpoints.values()):
        return problems
    from sim.providers.cli import model_argument_problem  # only for a cli endpoint

    for section in (*PHASE_SECTIONS, *(f"phases.{n}" for n in config.phases)):
        phase = config.phase(section)
        home = phase_home(config, section)
        for key, names in (("model", (phase.model,)), ("fallback_models", phase.fallback_models)):
            for name in names:
                target = resolve_model(config, name, home)
                spec = endpoints.get(target.provider)
                if spec is None or not profile(spec.kind).runs_command:
                    continue
                why = model_argument_problem(spec.command, target.model)
                if why is None:
                    continue
                path, field = source(f"{section}.{key}")
                problem = InputError(path, field, why)
                if str(problem) not in {str(p) for p in problems}:  # --model: said once
                    problems.append(problem)
    return problems


def validated(data: Mapping[str, Any], source: Path | None) -> Config:
    """``data`` as a ``Config``, or ``InvalidConfig`` naming every problem."""
    problems = layer_problems(data, source)
    if problems:
        raise InvalidConfig(problems)
    return Config.model_validate(data)
