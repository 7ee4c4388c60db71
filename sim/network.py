"""Relationship networks for ``sim init --network``: which characters know each other.

Four shapes over ``n`` characters numbered ``0 .. n-1`` (hand-written, so the core needs no
graph library; the same arguments always give the same edges):

- ``ring``: each character knows the one before and the one after it.
- ``star``: the first character knows every other; the others know only it.
- ``small-world``: Watts–Strogatz with ``k = 4`` (each knows the 2 before and the 2 after
  it on a ring) and rewiring probability ``p = 0.1``: each of those edges, in turn, is
  moved with probability ``p`` to a character chosen uniformly among those not yet known.
  Worlds of fewer than 5 characters use the largest even ``k`` below ``n``.
- ``random:p``: Erdős–Rényi G(n, p): each pair knows each other with probability ``p``.

Edges are undirected pairs ``(i, j)`` with ``i < j``, sorted; the random draws come from
``random.Random(seed)``, whose sequence for an integer seed Python keeps stable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from sim.errors import InputError

Kind = Literal["ring", "star", "small-world", "random"]
KINDS: tuple[Kind, ...] = ("ring", "star", "small-world", "random")
#: Watts–Strogatz: neighbours per character on the starting ring, rewiring probability
SMALL_WORLD_K = 4
SMALL_WORLD_P = 0.1

Edge = tuple[int, int]
#: the relationship ``sim init --network`` gives each pair of characters who know each other
NETWORK_TIE = {"kind": "acquaintance", "trust": 0.5}


@dataclass(frozen=True)
class Network:
    """A network shape; ``p`` is the edge probability of ``random``."""

    kind: Kind
    p: float = 0.0

    def __str__(self) -> str:
        return f"random:{self.p:g}" if self.kind == "random" else self.kind


def parse_network(text: str, flag: str = "--network") -> Network:
    """``ring``, ``star``, ``small-world`` or ``random:p`` (0 <= p <= 1).

    Raises:
        InputError: any other text, naming ``flag`` and what is expected.
    """
    expected = "expected ring, small-world, star or random:p with p from 0 to 1"
    name, colon, rest = text.partition(":")
    if name == "random" and colon:
        try:
            p = float(rest)
        except ValueError:
            raise InputError(None, flag, f"{expected} (got {text!r})") from None
        if not 0.0 <= p <= 1.0:
            raise InputError(None, flag, f"{expected} (got {text!r})")
        return Network("random", p)
    if not colon and name in ("ring", "star", "small-world"):
        return Network(name)  # type: ignore[arg-type]
    raise InputError(None, flag, f"{expected} (got {text!r})")


def _pair(i: int, j: int) -> Edge:
    return (i, j) if i < j else (j, i)


def ring(n: int) -> set[Edge]:
    return {_pair(i, (i + 1) % n) for i in range(n) if (i + 1) % n != i}


def star(n: int) -> set[Edge]:
    return {(0, i) for i in range(1, n)}


def erdos_renyi(n: int, p: float, rng: random.Random) -> set[Edge]:
    return {(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p}


def watts_strogatz(n: int, k: int, p: float, rng: random.Random) -> set[Edge]:
    """Watts–Strogatz: a ring lattice of ``k`` neighbours each (``k`` even, lowered to fit
    ``n``), then each lattice edge ``(u, u+j)``, for ``j`` from 1 to ``k/2`` and ``u`` in
    order, rewired with probability ``p`` to ``(u, w)``, ``w`` drawn uniformly from the
    characters ``u`` does not know yet (left as it is when ``u`` knows everyone)."""
    k = min(k, n - 1 if (n - 1) % 2 == 0 else n - 2)
    if k < 2:
        return ring(n)
    adjacent: dict[int, set[int]] = {u: set() for u in range(n)}
    for u in range(n):
        for j in range(1, k // 2 + 1):
            v = (u + j) % n
            adjacent[u].add(v)
            adjacent[v].add(u)
    for j in range(1, k // 2 + 1):
        for u in range(n):
            if rng.random() >= p:
                continue
            v = (u + j) % n
            if v not in adjacent[u]:
                continue  # already rewired away
            free = [w for w in range(n) if w != u and w not in adjacent[u]]
            if not free:
                continue  # u knows everyone
            w = free[rng.randrange(len(free))]
            adjacent[u].discard(v)
            adjacent[v].discard(u)
            adjacent[u].add(w)
            adjacent[w].add(u)
    return {_pair(u, v) for u in adjacent for v in adjacent[u]}


def edges(network: Network, n: int, seed: int) -> list[Edge]:
    """The network's undirected edges over ``n`` characters, sorted."""
    rng = random.Random(seed)
    if network.kind == "ring":
        found = ring(n)
    elif network.kind == "star":
        found = star(n)
    elif network.kind == "small-world":
        found = watts_strogatz(n, SMALL_WORLD_K, SMALL_WORLD_P, rng)
    else:
        found = erdos_renyi(n, network.p, rng)
    return sorted(found)


__all__ = [
    "KINDS",
    "NETWORK_TIE",
    "SMALL_WORLD_K",
    "SMALL_WORLD_P",
    "Network",
    "edges",
    "erdos_renyi",
    "parse_network",
    "ring",
    "star",
    "watts_strogatz",
]
