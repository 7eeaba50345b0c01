"""An independent plan checker: knows no solver.  Every plan a backend returns passes through it.

Checks: decoder layers covered exactly once and in order (every stage holds at least one), GPUs
per device type within the cluster, every stage's device type runs the run's precision, memory fits on every stage (the float cost model, the memory headroom kept
free), and every
Megatron / runtime rule (planner/megatron/rules.py).  It also recomputes the plan's cost, so a solver's
scaled objective is never what gets reported.
"""

from __future__ import annotations

from planner.cost.model import CostModel, PlanCost
from planner.megatron.rules import check_plan
from planner.precision import listed, runs_precision
from planner.profile_tables import ProfileSet
from planner.schemas.plan import Plan


def plan_problems(cost_model: CostModel, plan: Plan) -> tuple[list[str], PlanCost | None]:
    """Every problem with `plan` (empty list: valid) and its float cost (None when a stage is on a device type
    without the run's precision: nothing prices it)."""
    model, cluster = cost_model.model, cost_model.cluster
    problems: list[str] = []
    total = sum(s.num_layers for s in plan.stages)
    if total != model.num_layers:
        problems.append(f"stages hold {total} decoder layers, the model has {model.num_layers}")
    for i, s in enumerate(plan.stages):
        if s.num_layers < 1:
            problems.append(f"stage {i} holds no layers")
    problems += [f"plan: {p}" for p in cluster.shortfalls(plan.gpus_by_type())]  # a pooled type uses its members
    for v in check_plan(model, plan, cost_model.training):
        problems.append(f"rule {v.rule}: {v.message}")
    lacking = precision_problems(plan, cost_model.profiles, cost_model.training.precision)
    if lacking:
        return problems + lacking, None
    cost = cost_model.evaluate(plan)
    for s in cost.stages:
        if not s.fits:
            problems.append(
                f"stage {s.index} ({s.device_type}) needs {s.memory_gib:.1f} GiB, may use {s.capacity_bytes / 2**30:.1f} "
                f"GiB ({s.device_memory_bytes / 2**30:.1f} GiB less the {100 * cost_model.memory_headroom:.0f}% "
                f"memory headroom)"
            )
    return problems, cost


def precision_problems(plan: Plan, profiles: ProfileSet, precision: str) -> list[str]:
    """A stage on a device type (or a pool with a member) that does not run `precision`, one line each."""
    out = []
    for i, stage in enumerate(plan.stages):
        lacking = [m for m in stage.member_types() if not runs_precision(m, profiles, precision)]
        if lacking:
            out.append(f"stage {i} runs on {'+'.join(lacking)}, which has no {precision}, the run's precision (its "
                       f"profile lists {listed(lacking[0], profiles)})")
    return out
