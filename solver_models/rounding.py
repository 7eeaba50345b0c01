"""A rounding heuristic over one configuration's integer tables: a plan from a pipeline the
relaxation chose (which options each stage may take), by the linear-partition test.  It finds a
plan fast for the search to bound with before any exact stage solve has finished; it proves
nothing (the exact stage model, solver_models/cpsat/model.py, does)."""

from __future__ import annotations

import numpy as np

from planner.schemas.search import stage_min_layers
from solver_models.scaling import INF_US
from solver_models.tables import StageTables, position


def rounded_plan(t: StageTables, allowed: list[list[int]]) -> list[tuple[int, int, int]] | None:
    """A plan [(option, start, n)] whose stage i takes an option of `allowed[i]` (earlier ones
    preferred), layers split so that the slowest stage's core time is the least the greedy
    test reaches: for a cap c, each stage in turn takes the most layers that fit in memory and
    within c, leaving every later stage its least (a layer per virtual chunk: stage_min_layers);
    the least c that places every layer.  None when no
    cap places them (memory, or the budget and contiguity rules the tables carry)."""
    if len(allowed) != t.pp:
        return None
    core = t.core_us[sorted({o for options in allowed for o in options})]
    caps = np.unique(core[core < INF_US])  # the slowest stage's core time is one of these
    lo, hi = 0, len(caps) - 1
    if not caps.size or _place(t, allowed, int(caps[hi])) is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if _place(t, allowed, int(caps[mid])) is None:
            lo = mid + 1
        else:
            hi = mid
    plan = _place(t, allowed, int(caps[lo]))
    if plan is None or not t.type_sequence_ok([o for o, _, _ in plan]) or not within_budget(t, plan):
        return None
    return plan


def _place(t: StageTables, allowed: list[list[int]], cap: int) -> list[tuple[int, int, int]] | None:
    lo, hi = t.fit_range()
    n_layers, pp = t.num_layers, t.pp
    fewest = [stage_min_layers(i, pp, t.g.vpp) for i in range(pp)]
    start, plan = 0, []
    for i in range(pp):
        later = sum(fewest[i + 1:])
        p = position(i, pp)
        choice = None
        for o in allowed[i]:
            if (i == 0 and not t.first_stage_ok(o)) or (i == pp - 1 and not t.last_stage_ok(o)):
                continue
            most = n_layers - start if i == pp - 1 else min(int(hi[o, i, start]), n_layers - start - later)
            least = n_layers - start if i == pp - 1 else max(1, int(lo[o, i, start]))
            for n in range(most, least - 1, -1):
                if n <= hi[o, i, start] and n >= lo[o, i, start] and t.core_us[o, p, start, n] <= cap:
                    choice = (o, start, n)
                    break
            if choice:
                break
        if choice is None:
            return None
        plan.append(choice)
        start += choice[2]
    return plan if start == n_layers else None


def within_budget(t: StageTables, plan: list[tuple[int, int, int]]) -> bool:
    used = [0] * len(t.types)
    for o, _, _ in plan:
        used[int(t.option_type[o])] += int(t.option_gpus[o])
    return all(u <= b for u, b in zip(used, t.budget))
