"""The report's map layout: deterministic, inside the unit square, quick for big worlds."""

from __future__ import annotations

import time

from sim.analysis.report.layout import layout


def ring(n: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % n) for i in range(n)] + [(i, (i * 7 + 3) % n) for i in range(0, n, 5)]


def test_the_same_world_gets_the_same_map():
    ids = [f"loc-{i}" for i in range(12)]
    first = layout(ids, ring(12))
    assert first == layout(ids, ring(12))
    assert len(set(first)) == 12
    assert all(0.0 <= x <= 1.0 and 0.0 <= y <= 1.0 for x, y in first)


def test_small_and_degenerate_worlds():
    assert layout([], []) == []
    assert layout(["a"], []) == [(0.5, 0.5)]
    two = layout(["a", "b"], [(0, 1)])
    assert len(two) == 2 and two[0] != two[1]


def test_connected_places_end_up_closer_than_unconnected_ones():
    ids = [f"p{i}" for i in range(10)]
    pos = layout(ids, [(i, i + 1) for i in range(9)])  # a chain

    def dist(a: int, b: int) -> float:
        return ((pos[a][0] - pos[b][0]) ** 2 + (pos[a][1] - pos[b][1]) ** 2) ** 0.5

    assert sum(dist(i, i + 1) for i in range(9)) / 9 < dist(0, 9)


def test_hundreds_of_locations_lay_out_quickly():
    ids = [f"loc-{i}" for i in range(300)]
    start = time.perf_counter()
    pos = layout(ids, ring(300))
    assert len(pos) == 300
    assert time.perf_counter() - start < 10
