"""Building the effective config from its layers (``sim.config`` says which, in order): each
TOML file read and validated as it is merged, the trust rule applied to the world's, then
the command line's overrides."""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from sim.config.models import Config, DeclaredPhaseConfig
from sim.config.names import PHASE_SECTIONS, numbered_sections
from sim.config.trust import MISSING, lookup, tightened, untrusted
from sim.config.validate import (
    InvalidConfig,
    cli_model_problems,
    layer_problems,
    undeclared_endpoints,
    validated,
)
from sim.errors import InputError
from sim.providers import find_profile

logger = logging.getLogger(__name__)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise InputError(path, None, "config file not found") from None
    except OSError as exc:
        raise InputError(path, None, f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(path, None, "not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(path, None, f"not valid TOML: {exc}") from None


def merge_tables(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``, TOML tables merged key by key (a config layer's rule)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_tables(out[key], value)
        else:
            out[key] = value
    return out


def provider_models(config: Config, environ: Mapping[str, str]) -> Config:
    """The config with the provider's default model where a phase did not choose one.

    With a provider whose profile names a default model (``gemini``), a phase whose
    ``model`` is still the built-in default (no config file, world config or ``--model``
    changed it) uses the profile's variable (``$GEMINI_MODEL``), or its default model
    (``gemini-2.5-flash``) when that is unset or empty; a model set anywhere is kept as
    is, and so are ``fallback_models``. Other providers are left unchanged.
    """
    kind = find_profile(config.llm.provider)
    if kind is None or not kind.default_model:
        return config
    chosen = environ.get(kind.default_model_env, "") if kind.default_model_env else ""
    model = chosen.strip() or kind.default_model
    defaults = Config.model_validate(defaults_data())
    update: dict[str, Any] = {
        section: config.phase(section).model_copy(update={"model": model})
        for section in PHASE_SECTIONS
        if config.phase(section).model == defaults.phase(section).model
    }
    default_model = DeclaredPhaseConfig().model
    declared = {
        name: phase.model_copy(update={"model": model}) if phase.model == default_model else phase
        for name, phase in config.phases.items()
    }
    if declared:
        update["phases"] = declared
    return config.model_copy(update=update)


def defaults_data() -> dict[str, Any]:
    text = resources.files("sim").joinpath("defaults.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def load_config(
    config_file: Path | None = None,
    world_dir: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    cwd: Path | None = None,
    *,
    trust_world_config: bool = False,
) -> Config:
    """Build the effective config from its layers (see the module docstring).

    Args:
        trust_world_config: let the world's ``config.toml`` set ``ROUTING_KEYS``. Whether
            trusted or not, a world's config may tighten the user's limits (``[budget]``,
            ``[prices]``, ``[limits]``), never loosen them (``sim.config.trust.tightened``:
            the user's value is kept and a note logged, naming the file and field).

    Raises:
        InputError: a file is missing or malformed, a key is unknown, a value out of range,
            a world's config sets where requests go (``InvalidConfig`` lists every problem).
    """
    defaults = defaults_data()
    data = defaults
    layers: list[tuple[Path, bool]] = []
    if config_file is not None:
        layers.append((config_file, False))
    else:
        local = (cwd or Path.cwd()) / "config.toml"
        if local.is_file():
            layers.append((local, False))
    if world_dir is not None:
        world_config = world_dir / "config.toml"
        if world_config.is_symlink() or world_config.exists():
            layers.append((world_config, True))
    overrides = numbered_sections(overrides, None) if overrides else overrides
    problems: list[InputError] = []
    world_layer: tuple[dict[str, Any], dict[str, Any], Path] | None = None
    read: list[tuple[Path, dict[str, Any]]] = []
    for path, is_world in layers:
        layer = numbered_sections(_read_world_toml(path) if is_world else _read_toml(path), path)
        read.append((path, layer))
        if is_world:
            world_layer = (layer, data, path)  # with the user's layers merged so far
        if is_world and not trust_world_config:  # the user's layers and flags decide
            problems.extend(untrusted(layer, data, path, overrides or {}))
        merged = merge_tables(data, layer)
        # each layer on top of the defaults alone: a problem is reported once, by its file
        problems.extend(layer_problems(merge_tables(defaults, layer), path, combined=False))
        data = merged
    if problems:
        raise InvalidConfig(problems)
    if overrides:
        data = merge_tables(data, overrides)
    if world_layer is not None:  # trusted or not, a world may only tighten the user's limits
        layer, users, path = world_layer
        data, notes = tightened(data, layer, merge_tables(users, overrides or {}), path)
        for note in notes:
            logger.warning("note: %s", note)
    config = validated(data, None)

    def source(dotted: str) -> tuple[Path | None, str]:
        """The file (``None``: the command line) and field that set ``dotted``."""
        if _has(overrides or {}, dotted):
            return None, "--model" if dotted.endswith(".model") else dotted
        for path, layer in reversed(read):
            if _has(layer, dotted):
                return path, dotted
        return None, dotted

    problems = [*undeclared_endpoints(config, source), *cli_model_problems(config, source)]
    if problems:
        raise InvalidConfig(problems)
    return provider_models(config, os.environ)


def user_layers(config_file: Path | None = None, cwd: Path | None = None) -> dict[str, Any]:
    """The user's own layers merged, as raw data: the built-in defaults with ``--config
    FILE`` (else ``./config.toml`` of ``cwd``) on top, the file chosen as ``load_config``
    chooses it: what the trust rule compares an untrusted layer with (a study file's
    factors, ``sim.study.trust``).

    Raises:
        InputError: the file is missing or not TOML.
    """
    data = defaults_data()
    path = config_file
    if path is None:
        local = (cwd or Path.cwd()) / "config.toml"
        path = local if local.is_file() else None
    return data if path is None else merge_tables(data, _read_toml(path))


def _has(data: Mapping[str, Any], dotted: str) -> bool:
    """Whether a raw layer sets the dotted key."""
    return lookup(data, dotted) is not MISSING


def _read_world_toml(path: Path) -> dict[str, Any]:
    """A world's ``config.toml``: a regular file inside the world, read without following
    a link, size-limited."""
    from sim import safefs

    try:
        raw = safefs.read_file(path.parent, path.name, 1024 * 1024)
    except FileNotFoundError:
        raise InputError(path, None, "config file not found") from None
    except OSError as exc:
        raise InputError(path, None, f"cannot read: {exc.strerror}") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(path, None, "not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(path, None, f"not valid TOML: {exc}") from None
