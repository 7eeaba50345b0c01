"""Efficiency curves (profiles/README.md, `EfficiencyCurve`): piecewise linear in log(size), clamped at both ends.

One reading for every curve of a device profile: GEMM, attention and grouped-GEMM efficiency
(planner/cost/kernels.py), the collectives' bus-bandwidth efficiency (planner/cost/communication.py) and
the MoE dispatch streams (planner/cost/dispatch.py); the profiler (planner/profiling/tables.py) reads its
fitted points the same way.
"""

from __future__ import annotations

import math
from bisect import bisect_right

from planner.schemas.device import EfficiencyCurve


def interpolate_efficiency(curve: EfficiencyCurve, size: float) -> float:
    """Efficiency at `size`: piecewise linear in log(size) between the curve's points, clamped to the
    first/last point outside their range (and for size <= 0)."""
    if math.isnan(size):
        raise ValueError("interpolate_efficiency: size is NaN")
    points, sizes = _pairs(curve)
    return _interpolate(points, sizes, size)


def interpolate_points(points: list[tuple[float, float]], size: float) -> float:
    """`interpolate_efficiency` on bare (size, efficiency) pairs (sorted by size)."""
    return _interpolate(points, [p[0] for p in points], size)


def _interpolate(points, sizes: list[float], size: float) -> float:
    """`interpolate_points` with the points' sizes given (`sizes`)."""
    if size <= points[0][0]:
        return points[0][1]
    if size >= points[-1][0]:
        return points[-1][1]
    i = bisect_right(sizes, size)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    t = (math.log(size) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return y0 + t * (y1 - y0)


_PAIRS: dict[int, tuple[EfficiencyCurve, list[tuple[float, float]], list[float]]] = {}
_PAIRS_MAX = 4096  # curves remembered (the cost model reads a few dozen; the profiler's fits make more)


def _pairs(curve: EfficiencyCurve) -> tuple[list[tuple[float, float]], list[float]]:
    """A curve's (size, efficiency) pairs and sizes, read once per curve (EfficiencyCurve is frozen; the entry
    keeps the curve, so its id names no other while it is remembered)."""
    hit = _PAIRS.get(id(curve))
    if hit is None or hit[0] is not curve:
        if len(_PAIRS) >= _PAIRS_MAX:
            _PAIRS.clear()
        points = [(p.size, p.efficiency) for p in curve.points]
        hit = _PAIRS[id(curve)] = (curve, points, [p[0] for p in points])
    return hit[1], hit[2]
