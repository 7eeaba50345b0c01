"""The one float -> int quantisation every backend uses.

Times are integer microseconds (QUANTUM_S = 1e-6 s), ROUNDED DOWN: a 100 s iteration is 1e8, far
inside int64 and CP-SAT's comfortable range.  Rounding down makes every table objective a lower
bound of the plan's float cost (StageTables.quantisation_us says by how much at most), so a bound
proved on the tables is a bound on the evaluator's costs.  Memory feasibility is decided in floats
when the tables are built (a boolean per entry), so every backend sees the same feasible set.
"""

from __future__ import annotations

import math

import numpy as np

QUANTUM_S = 1e-6
INF_US = np.int64(2**50)  # "not allowed" in integer tables; sums of a few stay far below 2**63
# relative slack before flooring: a float sum computed in another order never floors one us higher
_FLOOR_SLACK = 1e-9


def to_us(seconds: float) -> int:
    """Seconds to whole microseconds, rounded down."""
    return int(math.floor(seconds / QUANTUM_S * (1 - _FLOOR_SLACK)))


def to_us_array(seconds: np.ndarray) -> np.ndarray:
    """to_us over an array (int64)."""
    return np.floor(seconds / QUANTUM_S * (1 - _FLOOR_SLACK)).astype(np.int64)


def from_us(us: int | float) -> float:
    return float(us) * QUANTUM_S


def bound_s(bound_us: int | float, vpp: int) -> float:
    """A bound on the tables (v x T microseconds) as seconds of iteration time: tables round down,
    so it bounds the float costs too."""
    return float(bound_us) * QUANTUM_S / vpp
