"""A response chain as one thing: its response ids and the exchanges behind them.

Spec 002 keeps a chain's response ids in its entity (``entity["_openai"]["{chain}_chain"]``,
oldest first). In ``window`` mode the engine also keeps what each id's call sent and got
back in the ``ResponseStore``, and sends the last ``depth`` exchanges itself. ``Chain``
owns both halves, so they change together: confirming an answer appends its id and stores
its exchange; trimming the chain to ``depth`` evicts both (the evicted ids are collected
for deletion at the provider after the tick commits).

``ResponseChainManager`` is spec 002's facade over the chains of a set of entities.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sim.llm.store import ResponseStore, split_key
from sim.llm.types import Exchange

logger = logging.getLogger(__name__)


class Chain:
    """One entity's chain (``"{chain}:{entity_id}"``).

    Args:
        key: the entity key.
        entity: the entity dict the ids live in (mutated in place).
        store: where the exchanges live (``window`` mode); ``None`` keeps ids only
            (``server`` mode: the provider holds the exchanges).
        evicted: where evicted ``(key, response id)`` pairs are collected.
    """

    def __init__(
        self,
        key: str,
        entity: dict[str, Any],
        store: ResponseStore | None,
        evicted: list[tuple[str, str]],
    ) -> None:
        self.key = key
        self.entity = entity
        self.store = store
        self._evicted = evicted
        self._field = f"{split_key(key)[0]}_chain"

    @property
    def ids(self) -> list[str]:
        """The response ids, oldest first (a copy)."""
        chain = self.entity.get("_openai", {}).get(self._field)
        return list(chain) if chain else []

    @property
    def previous(self) -> str | None:
        """The last response id (``server`` mode's ``previous_response_id``)."""
        chain = self.ids
        return chain[-1] if chain else None

    def exchanges(self, response_ids: Sequence[str]) -> tuple[Exchange, ...]:
        """The stored exchanges of these ids, oldest first; ids without one are skipped."""
        if self.store is None or not response_ids:
            return ()
        return self.store.window(self.key, list(response_ids))

    def window(self, depth: int) -> tuple[Exchange, ...]:
        """The last ``depth`` exchanges: what the model sees in ``window`` mode."""
        return self.exchanges(self.ids[-depth:]) if depth > 0 else ()

    def confirm(self, response_id: str, exchange: Exchange | None, depth: int) -> list[str]:
        """Append an answer, keeping at most ``depth`` ids (and their exchanges).

        Args:
            response_id: the answer's id.
            exchange: what was sent and answered, kept when the chain has a store.
            depth: the chain's depth; ``0`` keeps nothing (an unchained call).

        Returns:
            The evicted ids, oldest first (more than one after a depth decrease).
        """
        if depth <= 0:
            return []
        if exchange is not None and self.store is not None:
            self.store.put(self.key, exchange)
        chain: list[str] = self.entity.setdefault("_openai", {}).setdefault(self._field, [])
        evicted: list[str] = []
        while len(chain) >= depth:
            evicted.append(chain.pop(0))
        chain.append(response_id)
        for rid in evicted:
            self.evict(rid)
        self._evicted.extend((self.key, rid) for rid in evicted)
        return evicted

    def evict(self, response_id: str) -> None:
        """Drop one exchange from the store (it goes in this tick's atomic commit)."""
        if self.store is not None:
            self.store.evict(self.key, response_id)

    def reset(self) -> list[str]:
        """Empty a chain the provider lost; returns the ids it held (nothing to delete)."""
        chain = self.entity.get("_openai", {}).get(self._field) or []
        lost = list(chain)
        chain.clear()
        return lost


class ResponseChainManager:
    """The chains of a set of entities (spec 002's facade, keyed by entity key).

    Args:
        entities: characters or locations, mutated in place; each needs ``identity.id``.
        store: the exchanges behind the ids (``window`` mode), else ``None``.
    """

    def __init__(
        self, entities: Sequence[dict[str, Any]], store: ResponseStore | None = None
    ) -> None:
        self.entities: dict[str, dict[str, Any]] = {}
        for entity in entities:
            try:
                entity_id = entity["identity"]["id"]
            except (KeyError, TypeError):
                logger.debug("chain manager: skipping an entity without identity.id")
                continue
            if isinstance(entity_id, str) and entity_id:
                self.entities[entity_id] = entity
        self.store = store
        self.evicted: list[tuple[str, str]] = []

    @staticmethod
    def _parse_key(entity_key: str) -> tuple[str, str]:
        """``"intention:bob"`` -> ``("bob", "intention")`` (entity id, chain name)."""
        chain_name, entity_id = split_key(entity_key)
        return entity_id, chain_name

    def chain(self, entity_key: str) -> Chain | None:
        """The chain of ``entity_key``, or ``None`` when its entity is unknown."""
        entity = self.entities.get(self._parse_key(entity_key)[0])
        if entity is None:
            return None
        return Chain(entity_key, entity, self.store, self.evicted)

    def knows(self, entity_key: str) -> bool:
        return self._parse_key(entity_key)[0] in self.entities

    def get_chain(self, entity_key: str) -> list[str]:
        chain = self.chain(entity_key)
        return chain.ids if chain is not None else []

    def get_previous(self, entity_key: str) -> str | None:
        """The chain's last response id, or ``None`` if the chain is empty or unknown."""
        chain = self.chain(entity_key)
        return chain.previous if chain is not None else None

    def reset(self, entity_key: str) -> list[str]:
        """Empty a chain the provider lost; returns the ids it held (nothing to delete)."""
        chain = self.chain(entity_key)
        return chain.reset() if chain is not None else []

    def confirm(self, entity_key: str, response_id: str, depth: int) -> str | None:
        """Append ``response_id`` to the chain, keeping at most ``depth`` ids.

        Returns:
            The evicted id (the oldest, if several were trimmed after a depth decrease),
            or ``None``. Every evicted id is also appended to ``self.evicted``.
        """
        chain = self.chain(entity_key)
        if chain is None:
            return None
        evicted = chain.confirm(response_id, None, depth)
        return evicted[0] if evicted else None
