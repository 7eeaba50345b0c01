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

from planner.cost.estimate import plan_from_run
from planner.cost.model import CostModel, PlanCost
from planner.megatron.rules import RuleViolation, check_plan
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
    cannot_run: str | None = None  # why no upstream Megatron-LM job holds its device types (runtimes.yaml)

    @property
    def runs(self) -> bool:
        """Megatron would start it, one upstream job can hold its devices, and it fits in memory."""
        return self.cost is not None and self.cost.fits and not self.violations and self.cannot_run is None


def price_user_plan(run: MegatronRun, cluster: ClusterSpec, profiles, source: str) -> UserPlan:
    """Price the plan the run's own flags describe on `cluster`; never raises on a bad plan."""
    out = UserPlan(source=source)
    try:
        plan, notes = plan_from_run(run, cluster, profiles)
    except ValueError as exc:  # PlannerInputError: the plan does not divide this cluster, bad layout
        out.error = str(exc)
        return out
    out.plan, out.notes = plan, list(notes)
    out.violations = check_plan(run.model, plan, run.training)
    runs = MEGATRON.can_run([s.device_type for s in plan.stages], profiles)
    if not runs.ok:
        out.cannot_run = runs.reason
    try:
        out.cost = CostModel(run.model, run.training, cluster, profiles).evaluate(plan)
    except (ValueError, KeyError, ZeroDivisionError) as exc:  # a plan the cost model cannot price
        out.error = f"cannot be priced: {exc}"
    return out
