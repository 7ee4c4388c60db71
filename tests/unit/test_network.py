"""The relationship networks of `sim init --network` (sim.network)."""

from __future__ import annotations

import random

import pytest

from sim.errors import InputError
from sim.network import Network, edges, erdos_renyi, parse_network, ring, star, watts_strogatz


def test_small_worlds_edge_cases() -> None:
    assert ring(1) == set() and ring(2) == {(0, 1)} and ring(3) == {(0, 1), (1, 2), (0, 2)}
    assert star(1) == set() and star(3) == {(0, 1), (0, 2)}
    assert edges(Network("small-world"), 2, 1) == [(0, 1)]
    assert edges(Network("small-world"), 1, 1) == []


def test_watts_strogatz_without_rewiring_is_the_ring_lattice() -> None:
    n = 10
    lattice = {tuple(sorted((u, (u + j) % n))) for u in range(n) for j in (1, 2)}
    assert watts_strogatz(n, 4, 0.0, random.Random(1)) == lattice
    assert watts_strogatz(5, 4, 0.0, random.Random(1)) == {
        (i, j) for i in range(5) for j in range(i + 1, 5)
    }  # k = n - 1: everyone knows everyone
    assert watts_strogatz(4, 4, 0.0, random.Random(1)) == ring(4)  # k lowered to 2


def test_watts_strogatz_rewiring_keeps_the_edge_count_and_no_self_loops() -> None:
    for seed in range(20):
        found = watts_strogatz(30, 4, 0.5, random.Random(seed))
        assert len(found) == 60 and all(a < b for a, b in found)
    assert watts_strogatz(30, 4, 1.0, random.Random(3)) != watts_strogatz(
        30, 4, 0.0, random.Random(3)
    )


def test_erdos_renyi_and_determinism() -> None:
    assert erdos_renyi(6, 0.0, random.Random(1)) == set()
    assert len(erdos_renyi(6, 1.0, random.Random(1))) == 15
    net = Network("random", 0.4)
    assert edges(net, 20, 7) == edges(net, 20, 7) != edges(net, 20, 8)


@pytest.mark.parametrize(
    ("text", "network"),
    [
        ("ring", Network("ring")),
        ("star", Network("star")),
        ("small-world", Network("small-world")),
        ("random:0.25", Network("random", 0.25)),
        ("random:1", Network("random", 1.0)),
    ],
)
def test_parse(text: str, network: Network) -> None:
    assert parse_network(text) == network
    assert str(network) == text


@pytest.mark.parametrize(
    "text", ["", "mesh", "random", "random:", "random:-0.1", "random:nan", "star:1"]
)
def test_parse_refuses(text: str) -> None:
    with pytest.raises(InputError, match="--network"):
        parse_network(text)
