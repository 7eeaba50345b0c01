"""The prediction guard: a predicted throughput above the devices' peak is an error, never a result.

The cost model is trusted inside the range it was built for; an input far outside it (100,000
multi-token-prediction layers, say) can make it report more FLOP/s than the hardware has.  Every
command checks the plans it reports with `check_prediction` before printing or writing anything:
the iteration time must be finite and positive, memory finite and not negative, and the achieved
model FLOP/s must not exceed the summed peak of the plan's GPUs (MFU <= 1).  The check reads the
public `PlanCost` figures only; it never changes them.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from planner.errors import ImplausiblePredictionError


def check_prediction(cost: Any, what: str = "the plan", user_files: Sequence[str] = ()) -> None:
    """Raise ImplausiblePredictionError when `cost` (a PlanCost) cannot be true.  `user_files`: the
    --profiles files that priced it (a calibration fitted to another run's log can make any input look
    implausible, so the message names them)."""
    try:
        _check(cost, what)
    except ImplausiblePredictionError as exc:
        if not user_files:
            raise
        files = ", ".join(user_files[:3]) + (", ..." if len(user_files) > 3 else "")
        raise ImplausiblePredictionError(
            f"{exc}; the profiles of --profiles were applied ({files}): corrections fitted to a log of another run "
            "do this: check them (calibrate's report says what they were fitted to), or drop --profiles") from None


def _check(cost: Any, what: str) -> None:
    t = cost.iteration_time_s
    if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
        raise ImplausiblePredictionError(
            f"{what}: the predicted iteration time is {t!r} s, not a finite positive number; "
            "the input lies outside what the cost model covers"
        )
    for stage in cost.stages:
        m = stage.memory_gib
        if not (math.isfinite(m) and m >= 0):
            raise ImplausiblePredictionError(
                f"{what}: stage {stage.index} has a predicted memory of {m!r} GiB; "
                "the input lies outside what the cost model covers"
            )
    flop = cost.model_flop_per_iteration
    peak = cost.peak_flop_per_s_total
    if not (math.isfinite(flop) and flop >= 0 and math.isfinite(peak) and peak > 0):
        raise ImplausiblePredictionError(
            f"{what}: the model FLOP per iteration ({flop!r}) or the devices' peak ({peak!r} FLOP/s) is not a "
            "finite number"
        )
    achieved = flop / t
    if achieved > peak:
        per_gpu = cost.world_size or 1
        raise ImplausiblePredictionError(
            f"{what}: {achieved / 1e12 / per_gpu:,.1f} TFLOP/s per GPU predicted, above the devices' peak of "
            f"{peak / 1e12 / per_gpu:,.1f} TFLOP/s per GPU (MFU {achieved / peak:.0%}); the input lies outside "
            "what the cost model covers (check the model's sizes and counts, e.g. mtp_num_layers)"
        )
