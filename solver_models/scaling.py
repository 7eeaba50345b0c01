"""The one float -> int quantisation both backends use.

Times are integer microseconds (QUANTUM_S = 1e-6 s): a 100 s iteration is 1e8, far inside int64
and CP-SAT's comfortable range, and rounding moves a stage time by at most 0.5 us, below anything
the cost model can resolve.  Memory feasibility is decided in floats when the tables are built
(a boolean per entry), so both backends see the same feasible set.
"""

from __future__ import annotations

import numpy as np

QUANTUM_S = 1e-6
INF_US = np.int64(2**50)  # "not allowed" in integer tables; sums of a few stay far below 2**63


def to_us(seconds: float) -> int:
    return int(round(seconds / QUANTUM_S))


def from_us(us: int | float) -> float:
    return float(us) * QUANTUM_S
