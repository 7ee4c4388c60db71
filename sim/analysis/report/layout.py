"""A deterministic map layout: force-directed (Fruchterman–Reingold) from a circle.

The start positions come from the ids (sorted by a hash of each id, placed on a circle),
and there is no randomness after that, so the same world always gets the same map.
Work is bounded (about two million pair steps) so a world of hundreds of locations still
lays out in a second or two.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

PAIR_STEPS = 2_000_000
GRAVITY = 0.5


def layout(ids: Sequence[str], edges: Sequence[tuple[int, int]]) -> list[tuple[float, float]]:
    """Positions in the unit square (0..1, 0..1), one per id, in the order given.

    Args:
        ids: node ids (their hashes fix the start positions).
        edges: pairs of indices into ``ids`` (direction ignored).
    """
    n = len(ids)
    if n == 0:
        return []
    if n == 1:
        return [(0.5, 0.5)]
    order = sorted(range(n), key=lambda i: hashlib.sha256(ids[i].encode()).hexdigest())
    xs = [0.0] * n
    ys = [0.0] * n
    for rank, i in enumerate(order):
        angle = 2 * math.pi * rank / n
        xs[i], ys[i] = math.cos(angle), math.sin(angle)
    links = sorted({(min(a, b), max(a, b)) for a, b in edges if a != b})
    k = math.sqrt(4.0 / n)  # ideal distance in a 2x2 box
    iterations = max(20, min(300, PAIR_STEPS // (n * n)))
    temperature = 0.2
    kk = k * k
    for step in range(iterations):
        dx = [0.0] * n
        dy = [0.0] * n
        for i in range(n):
            xi, yi = xs[i], ys[i]
            # node i's sums kept in locals: the same additions in the same order as on
            # the lists (so the same map), at a fraction of the interpreter's work
            sx, sy = dx[i], dy[i]
            for j in range(i + 1, n):
                ddx, ddy = xi - xs[j], yi - ys[j]
                dist2 = ddx * ddx + ddy * ddy or 1e-9
                force = kk / dist2  # repulsion k²/d, as a factor of (ddx, ddy)/d
                fx, fy = ddx * force, ddy * force
                sx += fx
                sy += fy
                dx[j] -= fx
                dy[j] -= fy
            dx[i], dy[i] = sx, sy
        for a, b in links:
            ddx, ddy = xs[a] - xs[b], ys[a] - ys[b]
            dist = math.sqrt(ddx * ddx + ddy * ddy) or 1e-9
            force = dist / k  # attraction d²/k, as a factor of (ddx, ddy)/d
            dx[a] -= ddx * force
            dy[a] -= ddy * force
            dx[b] += ddx * force
            dy[b] += ddy * force
        for i in range(n):
            # a weak pull to the centre keeps unconnected parts from drifting off
            dx[i] -= xs[i] * GRAVITY
            dy[i] -= ys[i] * GRAVITY
            length = math.sqrt(dx[i] * dx[i] + dy[i] * dy[i]) or 1e-9
            move = min(length, temperature)
            xs[i] += dx[i] / length * move
            ys[i] += dy[i] / length * move
        temperature = 0.2 * (1 - (step + 1) / iterations) + 0.002
    return _normalise(xs, ys)


def _normalise(xs: list[float], ys: list[float]) -> list[tuple[float, float]]:
    """Each axis stretched to 0..1 (the page's map is wider than tall; a line of nodes is
    centred rather than stretched)."""

    def scale(values: list[float]) -> list[float]:
        lo, hi = min(values), max(values)
        if hi - lo < 1e-6:
            return [0.5] * len(values)
        return [round((v - lo) / (hi - lo), 4) for v in values]

    return list(zip(scale(xs), scale(ys), strict=True))
