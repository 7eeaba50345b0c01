"""Stage order: each device type's stages in one block of the pipeline when that costs nothing.

Upstream Megatron-LM places stage s on the nodes of node rank order, so any order of device types runs;
but a plan whose types interleave (H100, H200, H200, H100, ...) crosses the slow links between types more
often, and is harder to place with a scheduler.  The search may return such an order when it ties with a
contiguous one.  `contiguous_order` tries every order of the type blocks (each type's stages keep their
own order), prices each with the one cost model, and keeps the plan's order only when every contiguous
order is slower or does not fit, saying why.
"""

from __future__ import annotations

import itertools

from planner.checker import plan_problems
from planner.cost.model import CostModel, PlanCost
from planner.schemas.plan import Plan

MAX_TYPE_ORDERS = 24  # block orders tried (4 device types: every order)
SAME_TIME = 1e-9  # relative: a contiguous order this close to the plan's time costs nothing


def type_blocks(plan: Plan) -> list[str]:
    """The device types of the stages, consecutive repeats merged (H100, H200, H100: 3 blocks)."""
    out: list[str] = []
    for s in plan.stages:
        if not out or out[-1] != s.device_type:
            out.append(s.device_type)
    return out


def contiguous_order(cost: CostModel, plan: Plan, plan_cost: PlanCost) -> tuple[Plan, PlanCost, str | None]:
    """(plan, cost, note): the plan with contiguous device types when an order of the blocks is as fast
    (within SAME_TIME) and passes the checker; else the plan as it is, with a note that says why its
    types interleave.  No note when the types are already contiguous."""
    blocks = type_blocks(plan)
    types = list(dict.fromkeys(blocks))
    if len(blocks) == len(types):
        return plan, plan_cost, None
    best: tuple[Plan, PlanCost] | None = None
    for order in itertools.islice(itertools.permutations(types), MAX_TYPE_ORDERS):
        stages = sorted(plan.stages, key=lambda s: order.index(s.device_type))  # stable inside a type
        cand = plan.model_copy(update={"stages": tuple(stages)})
        problems, c = plan_problems(cost, cand)
        if not problems and (best is None or c.iteration_time_s < best[1].iteration_time_s):
            best = (cand, c)
    shown = ", ".join(blocks)
    if best is None:
        return plan, plan_cost, (f"device types interleave ({shown}): no order with each type's stages together "
                                 "fits or keeps the rules")
    if best[1].iteration_time_s <= plan_cost.iteration_time_s * (1 + SAME_TIME):
        faster = 1 - best[1].iteration_time_s / plan_cost.iteration_time_s
        how = (f"{faster * 100:.2f}% faster than" if faster > SAME_TIME else "the same predicted time as")
        return best[0], best[1], (f"stages grouped by device type ({', '.join(type_blocks(best[0]))}): {how} "
                                  f"the order found ({shown})")
    slower = best[1].iteration_time_s / plan_cost.iteration_time_s - 1
    return plan, plan_cost, (f"device types interleave ({shown}): the best order with each type's stages together "
                             f"({', '.join(type_blocks(best[0]))}) is {slower * 100:.2f}% slower")
