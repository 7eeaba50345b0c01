"""Your plan against ours: price the parallel plan the user's own flags (or script) already run.

`solve --megatron-script` (and `--megatron-args`) reads a run whose flags also hold a plan: TP, PP,
CP, EP, VPP, the layout and recompute.  This prices that plan on the same cluster and training
settings with the same cost model (planner/cost/estimate.plan_from_run: Megatron's default rank
order over the cluster's nodes as listed), checks it against Megatron's rules (planner/megatron/rules.py),
and says whether it fits.  A plan that cannot even be laid out on this cluster (e.g. TP*PP*CP does
not divide the GPU count) is reported with the reason instead of a price.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.checker import precision_problems
from planner.cost.estimate import plan_from_run
from planner.cost.model import CostModel, PlanCost
from planner.cost.ranges import RangeModel, TimeRange
from planner.megatron.rules import RuleViolation, run_violations
from planner.runtime import MEGATRON
from planner.schemas.cluster import ClusterSpec
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan


@dataclass
class UserPlan:
    """The user's own plan, priced; `error` is set (and plan/cost None) when it cannot be priced."""

    source: str
    plan: Plan | None = None
    cost: PlanCost | None = None
    violations: list[RuleViolation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    time_range: TimeRange | None = None
    keep_yours: bool = False
    keep_why: str = ""
    cannot_run: str | None = None  # why no upstream Megatron-LM job holds its device types (runtimes.yaml)

    @property
    def runs(self) -> bool:
        """Megatron would start it, one upstream job can hold its devices, and it fits in memory (its headroom
        kept free)."""
        return self.cost is not None and self.cost.fits and not self.violations and self.cannot_run is None

    @property
    def over_headroom(self) -> bool:
        """It would run but for the memory headroom: within the device's whole memory, above what the planner's
        own picks may use.  The headroom is the memory model's worst under-prediction on measured peaks, so such
        a plan may run (the published Qwen3-235B TP2 PP32 EP8 run is predicted at 74.9 GiB of 74.4 usable on an
        80 GB H100, and ran) or run out: the prediction cannot tell."""
        return (self.cost is not None and not self.cost.fits and self.cost.fits_device and not self.violations
                and self.cannot_run is None)

    def judge(self, ours: TimeRange, our_cost: PlanCost) -> None:
        """Set `keep_yours`: the plan runs, and its predicted time lies within the best plan's range (at most
        the top of it): the gain the search predicts is smaller than what the cost model can tell apart on
        the mechanisms these plans lean on.  `keep_why` says why, either way."""
        if not (self.runs or self.over_headroom) or self.cost is None:
            self.keep_yours, self.keep_why = False, "your plan does not run as given (see above)"
            return
        mine, nominal = self.cost.iteration_time_s, our_cost.iteration_time_s
        if mine <= nominal:
            why = (f"your plan's predicted {mine:.3f} s is no slower than ours ({nominal:.3f} s): the searched space "
                   f"holds neither it nor a better plan (its degrees, interleaving or layout lie outside it, or ours "
                   f"was chosen for its pessimistic time)")
        elif mine <= ours.high_s:
            why = (f"your plan's predicted {mine:.3f} s lies within our plan's range [{ours.low_s:.3f}, "
                   f"{ours.high_s:.3f}] s: the predicted gain ({100 * (mine / nominal - 1):+.1f}%) is within the cost "
                   f"model's held-out error on the mechanisms these plans lean on, so a change is not worth making "
                   f"on this evidence")
        else:
            why = (f"your plan's predicted {mine:.3f} s is above our plan's pessimistic {ours.high_s:.3f} s: ours is "
                   f"predicted faster even at the top of its range ({100 * (mine / ours.high_s - 1):.1f}% beyond it)")
        if self.over_headroom:
            why += ("; but your plan is over the memory headroom, within the device: it may run out of memory (if it "
                    "already runs, the measurement outranks the memory model)")
        self.keep_yours, self.keep_why = mine <= ours.high_s, why


def price_user_plan(run: MegatronRun, cluster: ClusterSpec, profiles, source: str,
                    range_model: RangeModel | None = None) -> UserPlan:
    """Price the plan the run's own flags describe on `cluster` (with `range_model`: its cost model, headroom
    and range); never raises on a bad plan."""
    out = UserPlan(source=source)
    try:
        plan, notes = plan_from_run(run, cluster, profiles)
    except ValueError as exc:  # PlannerInputError: the plan does not divide this cluster, bad layout
        out.error = str(exc)
        return out
    out.plan, out.notes = plan, list(notes)
    out.violations = run_violations(run, plan)
    runs = MEGATRON.can_run(cluster, profiles)  # the flags' plan spans the whole cluster (plan_from_run), whose
    if not runs.ok:  # stages may straddle types that the plan prices as the slower one
        out.cannot_run = runs.reason
    lacking = precision_problems(plan, profiles, run.training.precision)
    if lacking:  # no peak to price those stages with
        out.error = f"cannot be priced: {'; '.join(lacking)}"
        return out
    try:
        if range_model is None:
            out.cost = CostModel(run.model, run.training, cluster, profiles).evaluate(plan)
        else:
            out.cost = range_model.nominal.evaluate(plan)
            out.time_range = range_model.time_range(plan, out.cost)
    except (ValueError, KeyError, ZeroDivisionError) as exc:  # a plan the cost model cannot price
        out.error = f"cannot be priced: {exc}"
    return out
