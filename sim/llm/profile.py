"""What the rest of sim knows about a provider kind: one ``ProviderProfile`` per kind.

Each provider declares its profile (``sim.providers`` keeps the built-ins' and reads a
package's from its adapter class's ``profile`` attribute); the config, the stack, the
phases and the policy ask the profile, never the kind's name. The type lives here, in the
provider-agnostic layer, so that a provider outside ``sim.providers`` (the offline model,
a package's) can declare one without importing the registry.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from sim.llm.capacity import Fetch, ServerCapacity
from sim.llm.types import StructuredOutput

#: asks a server how many requests it serves at once, over ``Fetch`` (``sim.llm.capacity``)
CapacityProbe = Callable[[Fetch], Awaitable[ServerCapacity]]

#: how a kind's phases hold references to the world by default (``[llm] constrain_refs =
#: "auto"``, ``sim.phases.refs``): enums in the schema sent, or the answer checked
RefsMode = Literal["schema", "validate"]

#: where a kind's embeddings come from (``[memory] embeddings = "provider"``):
#: ``fetched`` from its server (``embed``), ``hashed`` locally, or ``none``
Embeddings = Literal["fetched", "hashed", "none"]


@dataclass(frozen=True, slots=True)
class ProviderProfile:
    """The facts about one provider kind that code outside its adapter needs.

    Attributes:
        kind: the kind's name (``[llm] provider``, ``[providers.NAME] kind``).
        base_url: where requests go when ``base_url`` is empty (its SDK's default server).
        base_url_env: the environment variable its SDK reads first for that server.
        key_env: its own API-key variable (``[llm] api_key_env``'s built-in default is
            read as this one); empty: it takes no key.
        network: it sends requests to a server (backpressure, pools and a key apply);
            ``False``: it answers in this process or through a local command.
        runs_command: it runs a local program per call (``command`` in its table).
        takes_seed: its adapter takes the world seed (``seed``).
        structured_output: the structured-output forms it can send, in the order
            ``structured_output = "auto"`` tries them (``sim.providers._structured``).
        constrain_refs: ``[llm] constrain_refs = "auto"`` resolved for it.
        root_any_of: a schema it is sent may have a root ``anyOf`` (per-action branches).
        prefix_items: a schema it is sent may hold ``prefixItems`` (one item per id).
        grammarless_hosts: hosts of its kind that take neither (a hosted strict mode).
        embeddings: where its embeddings come from (``Embeddings``).
        embedding_example: an embedding model of its, for the error that asks for one.
        capacity: how its server's capacity is read (``None``: it is not asked).
        server_chains: it keeps responses on its server (``chain_mode = "server"``); its
            adapter takes ``store``.
        no_chains_why: why it keeps no chains, when the API says so plainly (the config
            error names it on every layer; empty: the generic error, on the merged config).
        batch_api: its wire format goes through the Batch API (``[llm] batch``);
            ``None``: not declared (a package's provider), not checked.
        answers_as: the one model name it answers under, whatever was asked, and is
            priced as (empty: the model asked for).
        refs_as_enums: a declared phase's ``x-sim-ref`` ids go into its schema as enums
            whatever ``constrain_refs`` says (it has no other way to know them, and
            nothing goes on a wire: the offline model).
        default_model: the model a phase left at the built-in default runs on it.
        default_model_env: the environment variable that overrides ``default_model``.
        sdk_extra: the ``sim[...]`` extra that installs its SDK (empty: none needed).
        selectable: a config may choose it (``False``: only sim itself builds it, such as
            the replaying provider of ``sim replay``).
    """

    kind: str
    base_url: str = ""
    base_url_env: str = ""
    key_env: str = ""
    network: bool = True
    runs_command: bool = False
    takes_seed: bool = False
    structured_output: tuple[StructuredOutput, ...] = ()
    constrain_refs: RefsMode = "validate"
    root_any_of: bool = False
    prefix_items: bool = False
    grammarless_hosts: tuple[str, ...] = ()
    embeddings: Embeddings = "none"
    embedding_example: str = ""
    capacity: CapacityProbe | None = None
    server_chains: bool = False
    no_chains_why: str = ""
    batch_api: bool | None = None
    answers_as: str = ""
    refs_as_enums: bool = False
    default_model: str = ""
    default_model_env: str = ""
    sdk_extra: str = ""
    selectable: bool = True

    def url(self, base_url: str) -> str:
        """Where requests go: ``base_url``, else the environment's choice for the kind's
        SDK (``base_url_env``), else its default server."""
        if base_url:
            return base_url
        return (os.environ.get(self.base_url_env) if self.base_url_env else None) or (self.base_url)

    @property
    def sends_nothing(self) -> bool:
        """It sends no request anywhere and carries no key: no server, no command."""
        return not self.network and not self.runs_command

    def grammar(self, host: str | None) -> bool:
        """Whether a schema sent to ``host`` may carry a grammar's forms (a root ``anyOf``
        and ``prefixItems``: ``sim.llm.enums.constrain(grammar=...)``)."""
        return self.root_any_of and self.prefix_items and host not in self.grammarless_hosts
