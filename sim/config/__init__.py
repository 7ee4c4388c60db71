"""Typed configuration: ``config.toml`` layers merged and validated once, strictly.

Layers, later wins: built-in defaults (``sim/defaults.toml``, identical to the shipped
``config.toml``) < ``--config FILE`` or ``./config.toml`` < the world's ``config.toml`` <
command-line overrides. Each file is validated as it is merged, so an error names the file
that holds the bad key, and every error of every file is reported at once.

Types are strict (``"16"`` or ``true`` is not a number) and numbers finite. A world's own
``config.toml`` is untrusted (worlds are shared): it may not change where requests go or
which credential they carry (``ROUTING_KEYS``) unless the user trusts it
(``--trust-world-config``) or sets the same value in their own config. Trusted or not,
it may tighten the user's limits (``[budget]``, ``[prices]``, ``[limits]``), never loosen
them (``trust.tightened``).

The package, by concept (every public name is importable from ``sim.config``):

- ``names``: phase sections and aliases, built-in phases, the routing keys
- ``models``: the pydantic models of the sections (``Config`` and its parts)
- ``clock``: in-world time (``[time]``): a tick's date and hour, durations, ``when`` times
- ``validate``: a layer's problems, all at once (``InvalidConfig``)
- ``trust``: the rule for a world's own ``config.toml``
- ``layers``: ``load_config``, the layers merged in order
- ``endpoints``: where each phase's models run (``routing``), endpoint descriptions

Owns: the config's layers, their validation and trust rule, and where each phase's
models run.

May import: ``sim.errors``, ``sim.llm``, ``sim.providers`` (which provider
kinds exist), ``sim.safefs`` (a world's ``config.toml`` read without following a link).

Next: a new section is a model in ``models`` and a field of ``Config``, with its defaults
in ``sim/defaults.toml`` (and the shipped ``config.toml``); a rule no single field states
goes in ``validate``.
"""

from __future__ import annotations

from sim.config.endpoints import (
    EndpointSpec,
    Routing,
    endpoint,
    kind_endpoint,
    llm_endpoint,
    named_endpoint,
    named_endpoints,
    normalised_model,
    offline_config,
    own_key_env,
    phase_endpoints,
    phase_home,
    resolve_model,
    routing,
)
from sim.config.layers import (
    defaults_data,
    load_config,
    merge_tables,
    provider_models,
    user_layers,
)
from sim.config.models import (
    DEFAULT_PRICES,
    BaseUrl,
    BudgetConfig,
    Config,
    ConstrainRefs,
    ConversationConfig,
    DeclaredPhaseConfig,
    FailurePolicy,
    HistoryConfig,
    ImportanceRule,
    LimitsConfig,
    LLMConfig,
    MemoryConfig,
    MemoryPhaseConfig,
    MemoryWeights,
    MessagesConfig,
    Phase1Config,
    PhaseConfig,
    PhaseEndpoint,
    PlanningConfig,
    PolicyConfig,
    PriceConfig,
    ProviderConfig,
    ProviderName,
    ReflectionConfig,
    TickConfig,
    TimeConfig,
    VerbName,
    base_urls,
    describe_base_url,
    loggable,
    redacted,
)
from sim.config.names import (
    BUILTIN_PHASES,
    DEFAULT_ORDER,
    ENDPOINT_KEYS,
    MEMORY_GROUP,
    MEMORY_STRATEGIES,
    NAME_PATTERN,
    PHASE_ALIASES,
    PHASE_SECTIONS,
    PROVIDER_NAME_PATTERN,
    READABLE_SECTIONS,
    ROUTING_KEYS,
    ROUTING_TABLES,
    SECTION_NAMES,
    known_memory,
    numbered_sections,
    phase_section,
    section_name,
)
from sim.config.trust import (
    endpoint_paths,
    untrusted,
)
from sim.config.validate import (
    InvalidConfig,
    layer_problems,
    validated,
)

__all__ = [
    "BUILTIN_PHASES",
    "DEFAULT_ORDER",
    "DEFAULT_PRICES",
    "ENDPOINT_KEYS",
    "MEMORY_GROUP",
    "MEMORY_STRATEGIES",
    "NAME_PATTERN",
    "PHASE_ALIASES",
    "PHASE_SECTIONS",
    "PROVIDER_NAME_PATTERN",
    "READABLE_SECTIONS",
    "ROUTING_KEYS",
    "ROUTING_TABLES",
    "SECTION_NAMES",
    "BaseUrl",
    "BudgetConfig",
    "Config",
    "ConstrainRefs",
    "ConversationConfig",
    "DeclaredPhaseConfig",
    "EndpointSpec",
    "FailurePolicy",
    "HistoryConfig",
    "ImportanceRule",
    "InvalidConfig",
    "LLMConfig",
    "LimitsConfig",
    "MemoryConfig",
    "MemoryPhaseConfig",
    "MemoryWeights",
    "MessagesConfig",
    "Phase1Config",
    "PhaseConfig",
    "PhaseEndpoint",
    "PlanningConfig",
    "PolicyConfig",
    "PriceConfig",
    "ProviderConfig",
    "ProviderName",
    "ReflectionConfig",
    "Routing",
    "TickConfig",
    "TimeConfig",
    "VerbName",
    "base_urls",
    "defaults_data",
    "describe_base_url",
    "endpoint",
    "endpoint_paths",
    "kind_endpoint",
    "known_memory",
    "layer_problems",
    "llm_endpoint",
    "load_config",
    "loggable",
    "merge_tables",
    "named_endpoint",
    "named_endpoints",
    "normalised_model",
    "numbered_sections",
    "offline_config",
    "own_key_env",
    "phase_endpoints",
    "phase_home",
    "phase_section",
    "provider_models",
    "redacted",
    "resolve_model",
    "routing",
    "section_name",
    "untrusted",
    "user_layers",
    "validated",
]
