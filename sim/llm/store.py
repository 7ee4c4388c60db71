"""The response store: the exchanges behind each chain's response ids.

In ``window`` chain mode the engine, not the provider, remembers what each chain said, so
the model sees exactly the last ``depth`` exchanges with any provider. The store keeps one
small JSON file per chain and entity in a folder of the world (``<folder>/<chain>/
<entity_id>.json``: response id -> input and output). Which folder is the world layout's
to say (``sim.ticklog.format.STORE_DIR``, handed in by the engine), not this layer's.

Changes are held in memory and handed to ``Storage`` as part of the tick's atomic commit,
so the store on disk always agrees with the chain ids saved in the entities, and an evicted
exchange disappears only when the tick that evicted it commits.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from sim.llm.types import Exchange


def split_key(entity_key: str) -> tuple[str, str]:
    """``"intention:bob"`` -> ``("intention", "bob")``."""
    chain, _, entity_id = entity_key.partition(":")
    return chain, entity_id


class ResponseStore:
    """Exchanges by entity key and response id, backed by a world folder (or memory only).

    Args:
        root: the world folder; ``None`` keeps everything in memory (tests, scratch runs).
        folder: where the files go, relative to the world folder (``"/"``-separated; what
            ``changes`` names them under); needed with ``root``.
    """

    def __init__(self, root: Path | None = None, folder: str | None = None) -> None:
        if root is not None and folder is None:
            raise ValueError("a response store in a world folder needs the folder of its files")
        self.root = root
        self._prefix = f"{folder.strip('/')}/" if folder else ""
        self._cache: dict[str, dict[str, dict[str, str]]] = {}
        self._dirty: set[str] = set()

    def _relpath(self, entity_key: str) -> str:
        chain, entity_id = split_key(entity_key)
        return f"{self._prefix}{chain}/{entity_id}.json"

    def _entries(self, entity_key: str) -> dict[str, dict[str, str]]:
        entries = self._cache.get(entity_key)
        if entries is None:
            entries = {}
            if self.root is not None:
                path = self.root / self._relpath(entity_key)
                try:
                    entries = orjson.loads(path.read_bytes())
                except FileNotFoundError:
                    entries = {}
            self._cache[entity_key] = entries
        return entries

    def get(self, entity_key: str, response_id: str) -> Exchange | None:
        entry = self._entries(entity_key).get(response_id)
        if entry is None:
            return None
        return Exchange(response_id, entry["input"], entry["output"])

    def window(self, entity_key: str, response_ids: list[str]) -> tuple[Exchange, ...]:
        """The exchanges for these ids, oldest first; ids the store lacks are skipped."""
        entries = self._entries(entity_key)
        return tuple(
            Exchange(rid, entries[rid]["input"], entries[rid]["output"])
            for rid in response_ids
            if rid in entries
        )

    def put(self, entity_key: str, exchange: Exchange) -> None:
        self._entries(entity_key)[exchange.response_id] = {
            "input": exchange.input,
            "output": exchange.output,
        }
        self._dirty.add(entity_key)

    def evict(self, entity_key: str, response_id: str) -> None:
        if self._entries(entity_key).pop(response_id, None) is not None:
            self._dirty.add(entity_key)

    def discard(self, entity_key: str) -> None:
        """Drop a chain's stored exchanges without reading them (a damaged file): the
        store file is deleted by the next commit."""
        self._cache[entity_key] = {}
        self._dirty.add(entity_key)

    def changes(self) -> dict[str, bytes | None]:
        """Files to write (bytes) or delete (``None``), relative to the world folder."""
        out: dict[str, bytes | None] = {}
        for key in sorted(self._dirty):
            entries = self._cache[key]
            out[self._relpath(key)] = (
                orjson.dumps(entries, option=orjson.OPT_INDENT_2) + b"\n" if entries else None
            )
        return out

    def take(self, changes: dict[str, bytes | None]) -> None:
        """Hold another store's ``changes`` (of other entity keys, under the same
        folder) as changes of this one: a sharded tick's worker hands its chains to the
        coordinator, which runs the rest of the tick with them."""
        for rel, data in changes.items():
            chain, _, name = rel.removeprefix(self._prefix).partition("/")
            key = f"{chain}:{name.removesuffix('.json')}"
            self._cache[key] = orjson.loads(data) if data is not None else {}
            self._dirty.add(key)

    def mark_committed(self) -> None:
        self._dirty.clear()
