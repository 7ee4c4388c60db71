"""A condition's network: who knows whom in its arms (``network`` or ``edges`` in a study).

A condition may set the relationships of its arms' characters, so a study can compare
densities on one world:

- ``network = "ring"`` (or ``small-world``, ``star``, ``random:p``): the shapes of ``sim
  init --network`` (``sim.network``) over the world's characters in id order, drawn with
  the arm's seed;
- ``edges = "dense.csv"``: a CSV file inside the study file's folder (read as a survey's
  schema is, ``sim.safefs``), with a header naming ``from`` and ``to`` (and, optionally,
  ``kind`` and ``trust``) and one tie per row.

Either way the ties are both ways (``a,b`` and ``b,a`` are one tie), and they replace the
characters' relationships when the arm is forked, before its first tick: a pair the world
already relates keeps its relationship (kind, trust, its own attributes); a new pair gets
the tie ``sim init`` gives (``kind = "acquaintance"``, ``trust = 0.5``) or the file's
``kind``/``trust``; a pair not in the network loses its relationship. A study with such a
condition shares no prefix between its arms (the network differs from the first tick).

The factor ``network = ["ring", "random:0.6"]`` sets the same shapes per unit instead: the
arms of a unit share its network (and their prefix), so densities cross with conditions (a
2 x 2 of density and intervention). It is not a config setting: it is left out of the
runs' ``--set`` flags and recorded in each run's design (``network``).

Everything is checked when the study file is read, before anything runs: a bad spec, an
unreadable or malformed file, a row naming a character the world does not have.
"""

from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim import safefs
from sim.errors import InputError
from sim.network import NETWORK_TIE, Network, parse_network
from sim.network import edges as network_edges
from sim.world import TRUST_RANGE, World

#: the factor whose values are network shapes (every run of a unit starts in its value)
NETWORK_FACTOR = "network"
#: the most bytes of an edge file read (a study's folder is untrusted)
MAX_EDGE_FILE_BYTES = 8 * 1024 * 1024
_COLUMNS = ("from", "to", "kind", "trust")


@dataclass(frozen=True)
class Tie:
    """One tie of an edge file: an unordered pair, with the file's kind and trust if any."""

    a: str
    b: str
    kind: str | None = None
    trust: float | None = None


@dataclass(frozen=True)
class ConditionNetwork:
    """What a condition sets: a generated shape, or the ties of an edge file."""

    shape: Network | None = None
    ties: tuple[Tie, ...] = ()
    #: the edge file's digest (part of the study's identity: an edited file is another design)
    digest: str | None = None

    def pairs(self, ids: list[str], seed: int) -> dict[tuple[str, str], Tie]:
        """The network's ties over ``ids`` (sorted), each pair once, ``(a, b)`` with a < b."""
        out: dict[tuple[str, str], Tie] = {}
        if self.shape is not None:
            for i, j in network_edges(self.shape, len(ids), seed):
                out[(ids[i], ids[j])] = Tie(ids[i], ids[j])
            return out
        for tie in self.ties:
            key = (tie.a, tie.b) if tie.a < tie.b else (tie.b, tie.a)
            out.setdefault(key, tie)
        return out


def parse_spec(path: Path, where: str, text: str) -> ConditionNetwork:
    """A ``network = "..."`` spec.

    Raises:
        InputError: not one of the shapes (the study file and ``where`` named).
    """
    try:
        return ConditionNetwork(shape=parse_network(text, where))
    except InputError as exc:
        raise InputError(path, where, exc.problem) from None


def read_beside(path: Path, rel: str, where: str, limit: int) -> bytes:
    """The file ``rel`` beside the study file ``path``, read as a world's files are
    (``sim.safefs``): inside the study file's folder, no link followed, no FIFO or device,
    at most ``limit`` bytes.

    Raises:
        InputError: the path leaves the folder, is missing, a link, not a regular file or
            too large (the study file and ``where`` named).
    """
    shown = path.parent / rel
    try:
        return safefs.read_file(path.parent, rel, limit)
    except safefs.UnsafePath as exc:
        if exc.path is None:  # an absolute path, or one with ``..``
            raise InputError(
                path,
                where,
                f"{rel!r} is outside the study file's folder: expected a path inside it "
                "(no '..', not absolute)",
            ) from None
        raise InputError(path, where, str(exc)) from None
    except InputError as exc:  # larger than the limit
        raise InputError(path, where, str(exc)) from None
    except FileNotFoundError:
        raise InputError(path, where, f"{shown}: not found") from None
    except OSError as exc:
        raise InputError(path, where, f"{shown}: cannot read: {exc.strerror or exc}") from None


def read_edges(path: Path, where: str, rel: str, characters: set[str]) -> ConditionNetwork:
    """An edge file, read safely and checked against the world's character ids.

    Raises:
        InputError: the path leaves the study's folder, is missing, a link or too large;
            the CSV has no ``from``/``to`` header, a short row, an unknown character, a
            self-tie or a bad trust (the file, its line and column named).
    """
    shown = path.parent / rel
    raw = read_beside(path, rel, where, MAX_EDGE_FILE_BYTES)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(shown, None, "not UTF-8 text: expected a CSV file") from None
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise InputError(shown, None, f"not a CSV file: {exc}") from None
    if not rows:
        raise InputError(shown, "line 1", "empty: expected a header naming from and to")
    header = [name.strip() for name in rows[0]]
    if "from" not in header or "to" not in header:
        raise InputError(shown, "line 1", f"expected a header naming from and to, got {rows[0]}")
    unknown = [name for name in header if name not in _COLUMNS]
    if unknown:
        raise InputError(
            shown, "line 1", f"unknown column {unknown[0]!r}; expected from, to, kind, trust"
        )
    col = {name: header.index(name) for name in _COLUMNS if name in header}
    ties: list[Tie] = []
    for n, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue  # a blank line
        if len(row) != len(header):
            raise InputError(shown, f"line {n}", f"{len(row)} cells; expected {len(header)}")
        cells = {name: row[i].strip() for name, i in col.items()}
        for name in ("from", "to"):
            if cells[name] not in characters:
                raise InputError(
                    shown,
                    f"line {n}, {name}",
                    f"unknown character {cells[name]!r}; expected one of the world's "
                    "characters/ ids",
                )
        if cells["from"] == cells["to"]:
            raise InputError(shown, f"line {n}", "a character cannot have a tie to itself")
        trust: float | None = None
        if cells.get("trust"):
            try:
                trust = float(cells["trust"])
            except ValueError:
                trust = -1.0
            if not TRUST_RANGE[0] <= trust <= TRUST_RANGE[1]:
                raise InputError(
                    shown,
                    f"line {n}, trust",
                    f"expected a number from 0 to 1, got {row[col['trust']]!r}",
                )
        kind = cells.get("kind") or None
        ties.append(Tie(cells["from"], cells["to"], kind, trust))
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return ConditionNetwork(ties=tuple(ties), digest=digest)


def _tie(existing: Any, tie: Tie) -> dict[str, Any]:
    if tie.kind is None and tie.trust is None and isinstance(existing, dict):
        return existing
    out: dict[str, Any] = dict(existing) if isinstance(existing, dict) else dict(NETWORK_TIE)
    if tie.kind is not None:
        out["kind"] = tie.kind
    if tie.trust is not None:
        out["trust"] = tie.trust
    return out


def apply_network(world: World, network: ConditionNetwork, seed: int) -> None:
    """Replace every character's relationships with the network's ties (both ways)."""
    ids = sorted(world.characters)
    known: dict[str, dict[str, Tie]] = {cid: {} for cid in ids}
    for (a, b), tie in network.pairs(ids, seed).items():
        if a in known and b in known:
            known[a][b] = tie
            known[b][a] = tie
    for cid in ids:
        char = world.characters[cid]
        old = char.get("relationships") or {}
        new = {other: _tie(old.get(other), known[cid][other]) for other in sorted(known[cid])}
        if new:
            char["relationships"] = new
        else:
            char.pop("relationships", None)


__all__ = [
    "MAX_EDGE_FILE_BYTES",
    "NETWORK_FACTOR",
    "ConditionNetwork",
    "Tie",
    "apply_network",
    "parse_spec",
    "read_edges",
]
