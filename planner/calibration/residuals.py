"""Leave-one-source-out residuals of the calibration rows, with the mechanisms each prediction leans on.

The contract (for the uncertainty ranges of `estimate` and `solve`):

    calibration_residuals() -> list[RowResidual]

one `RowResidual` per calibration row (planner/calibration/runs.py `load_runs`, in that order):

- `id`, `source` (the row's source key: rows of one publication and software stack share one);
- `measured_s`: measured seconds per iteration (TFLOP/s rows converted with Megatron's model FLOPs);
- `predicted_s`: the shipped model's prediction (profiles/ as shipped, corrections included);
- `loso_predicted_s`: the prediction with every row of the row's source left out of the fit
  (planner.calibration.fit.leave_one_source_out);
- `loso_residual`: loso_predicted_s / measured_s - 1 (negative: the model is optimistic, predicted too fast);
- `shares`: the fraction of `predicted_s` in each mechanism (planner.cost.model.TIME_PARTS, via
  `PlanCost.time_shares()`; the fractions sum to 1, zero entries omitted).

The same shares for any plan come from `PlanCost.time_shares()`, so a range for a new plan can weight each
mechanism's residuals by how much of the plan's time that mechanism is.  Computing the residuals refits the
calibration once per source (minutes); cache the result, do not call this per plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.calibration.fit import fit, leave_one_source_out
from planner.calibration.runs import cases
from planner.profile_tables import ProfileSet


@dataclass(frozen=True)
class RowResidual:
    """One calibration row's leave-one-source-out residual and its prediction's split by mechanism."""

    id: str
    source: str
    measured_s: float
    predicted_s: float
    loso_predicted_s: float
    shares: dict[str, float]

    @property
    def loso_residual(self) -> float:
        """Relative error of the leave-one-source-out prediction (negative: predicted too fast)."""
        return self.loso_predicted_s / self.measured_s - 1.0


def calibration_residuals(profiles: ProfileSet | None = None) -> list[RowResidual]:
    """Every calibration row's leave-one-source-out residual and mechanism shares (see the module docstring).
    `profiles` prices `predicted_s` and the shares (default: the shipped profiles, `ProfileSet.load()`)."""
    shipped = profiles or ProfileSet.load()
    base = ProfileSet.uncalibrated()
    all_cases = cases(base)
    result, ev = fit(all_cases, base=base)
    loso = leave_one_source_out(result, ev, {c.id: c.source_key for c in all_cases})
    out = []
    for c in all_cases:
        cost = c.price(shipped)
        out.append(RowResidual(id=c.id, source=c.source_key, measured_s=c.seconds_per_iteration(),
                               predicted_s=cost.iteration_time_s, loso_predicted_s=loso[c.id],
                               shares=cost.time_shares()))
    return out
