"""The constraint families of the stage model, one function each; the rule is in the docstring.

Every function takes the model, the tables, the cells and the variables and adds its family.
"""

from __future__ import annotations

import numpy as np
from ortools.sat.python import cp_model

from solver_models.cpsat.cells import StageOptionCells, lower_hull
from solver_models.cpsat.variables import StageVars
from solver_models.tables import StageTables

Cells = dict[tuple[int, int], StageOptionCells]


def add_one_option_per_stage(model: cp_model.CpModel, t: StageTables, v: StageVars) -> None:
    """Each stage runs exactly one option (stage 0 only options with DP == g.dp0: cells.py leaves
    the others out)."""
    for i in range(t.pp):
        model.add_exactly_one(v.x[i, o] for o in v.options_of(i))


def add_layer_counts(model: cp_model.CpModel, t: StageTables, cells: Cells, v: StageVars) -> None:
    """n[i, o] is 0 unless x[i, o], and within the option's allowed counts when chosen; the stage's
    layers are the sum over its options; starts chain (start[0] = 0, start[i+1] = start[i] +
    layers[i]) and the stages cover all N layers.  Layer counts per option rather than one count
    per stage with big-M links: the LP sees n[i, o] <= n_max * x[i, o] directly."""
    pp, N = t.pp, t.num_layers
    for (i, o), c in cells.items():
        counts = c.counts()
        model.add(v.n[i, o] <= counts[-1] * v.x[i, o])
        model.add(v.n[i, o] >= counts[0] * v.x[i, o])
    for i in range(pp):
        model.add(v.layers[i] == sum(v.n[i, o] for o in v.options_of(i)))
    model.add(v.start[0] == 0)
    for i in range(pp - 1):
        model.add(v.start[i + 1] == v.start[i] + v.layers[i])
    model.add(v.start[pp - 1] + v.layers[pp - 1] == N)
    model.add(sum(v.layers) == N)  # redundant, gives the LP the total directly


def add_stage_costs(model: cp_model.CpModel, cells: Cells, v: StageVars) -> dict[str, int]:
    """core[i, o] and sync[i, o] (and fwd[i, o] where the model has it: links with traffic) are the table's
    values at the stage's (start, n) cell, 0 when the option is not chosen (n = 0).  Only allowed cells (memory fits, the position's region) exist,
    so memory is enforced here.  Where the values do not depend on the start (first and last
    stage, single-kind models) an element over n, whose index domain is small and whose
    propagation is exact; otherwise a table over (start, n, core, sync), which propagates between
    the start and the count in both directions (a flattened start*(N+1)+n element would not).
    Returns how many of each form were used."""
    used = {"element": 0, "table": 0}
    for (i, o), c in cells.items():
        fwd = (i, o) in v.fwd
        if c.by_n is not None:
            size = max(c.by_n) + 1
            vals = [[0] * size for _ in range(3)]
            for n, cell in c.by_n.items():
                for k in range(3):
                    vals[k][n] = cell[k]
            model.add_element(v.n[i, o], vals[0], v.core[i, o])
            model.add_element(v.n[i, o], vals[1], v.sync[i, o])
            if fwd:
                model.add_element(v.n[i, o], vals[2], v.fwd[i, o])
            used["element"] += 1
        else:
            width = 5 if fwd else 4
            rows = [list(cell[:width]) for cell in c.cells]
            rows += [[s] + [0] * (width - 1) for s in range(c.start_lo, c.start_hi + 1)]
            columns = [v.start[i], v.n[i, o], v.core[i, o], v.sync[i, o]] + ([v.fwd[i, o]] if fwd else [])
            model.add_allowed_assignments(columns, rows)
            used["table"] += 1
    return used


def add_relaxation_cuts(model: cp_model.CpModel, cells: Cells, v: StageVars) -> int:
    """Redundant linear cuts for the LP: d*core[i, o] >= a*n[i, o] + b*x[i, o] for each facet of the
    lower convex hull of n -> least core over starts (likewise for sync).  They hold for every
    allowed cell and for an unchosen option (0 >= 0), and give the LP a per-layer cost per option,
    which is what bounds the bottleneck.  Returns the number of cuts."""
    count = 0
    for (i, o), c in cells.items():
        for which, var in ((2, v.core[i, o]), (3, v.sync[i, o])):
            for d, a, b in lower_hull(c.least_by_n(which)):
                if a == 0 and b <= 0:
                    continue  # trivially true
                model.add(d * var >= a * v.n[i, o] + b * v.x[i, o])
                count += 1
    return count


def link_classes(t: StageTables) -> list[int]:
    """Class id per option: options with equal link rows and columns (tables.link_rows, and with positional
    links the same type and GPUs) share a class, so links need one Boolean per class pair rather than per
    option pair (recompute variants collapse)."""
    keys: dict[tuple, int] = {}
    out = []
    for o in range(t.num_options):
        key = t.link_rows(o)
        if t.positional_links:
            key += (int(t.option_type[o]), int(t.option_gpus[o]))
        out.append(keys.setdefault(key, len(keys)))
    return out


def add_pipeline_links(model: cp_model.CpModel, t: StageTables, v: StageVars, classes: list[int]) -> None:
    """y[i, a, b] = [stage i in class a and stage i+1 in class b], as a transportation polytope
    (row sums are stage i's class indicators, column sums stage i+1's), which is integral in the
    LP; link[i] = sum p2p[a, b] * y[i, a, b] is the L of the link between stages i and i+1, less
    (p2p - p2p_near)[a, b] where the link stays inside a node (w[i, a, b], `add_node_positions`); likewise
    traffic[i], its M (tables.link), where the tables carry traffic, and v.fill[i], its fill X (an expression
    the objective counts)."""
    ids = sorted(set(classes))
    rep = {c: classes.index(c) for c in ids}
    for i in range(t.pp - 1):
        for a in ids:
            model.add(sum(v.y[i, a, b] for b in ids)
                      == sum(v.x[i, o] for o in v.options_of(i) if classes[o] == a))
        for b in ids:
            model.add(sum(v.y[i, a, b] for a in ids)
                      == sum(v.x[i + 1, o] for o in v.options_of(i + 1) if classes[o] == b))
        def price(far, near):
            stay = sum(int(near[rep[a], rep[b]] - far[rep[a], rep[b]]) * w for (k, a, b), w in v.w.items() if k == i)
            return sum(int(far[rep[a], rep[b]]) * v.y[i, a, b] for a in ids for b in ids) + stay
        model.add(v.link[i] == price(t.p2p_us, t.near_us))
        if v.traffic:
            model.add(v.traffic[i] == price(*t.traffic_us))
        if t.fill_us is not None:
            v.fill.append(price(*t.fill_us))
    add_node_positions(model, t, v, classes)


def add_node_positions(model: cp_model.CpModel, t: StageTables, v: StageVars, classes: list[int]) -> None:
    """With positional links: stage i's block of type ty starts after the GPUs of ty the stages before it use
    (U), so node_first = U // GPUs per node and node_last = (U + its GPUs + the next stage's - 1) // GPUs per
    node; stay[i, ty] <=> both stages run ty and node_first == node_last (tables.crosses_nodes), and
    w[i, a, b] <=> y[i, a, b] and stay[i, type of a]."""
    for (i, ty), first in v.node_first.items():
        def gpus(j: int):
            return sum(int(t.option_gpus[o]) * v.x[j, o] for o in v.options_of(j) if int(t.option_type[o]) == ty)

        def on(j: int):
            return sum(v.x[j, o] for o in v.options_of(j) if int(t.option_type[o]) == ty)
        before = sum(gpus(j) for j in range(i))
        gpn = int(t.gpus_per_node[ty])
        model.add_division_equality(first, before, gpn)
        model.add_division_equality(v.node_last[i, ty], before + gpus(i) + gpus(i + 1) - 1, gpn)
        same = v.same_node[i, ty]
        model.add(first == v.node_last[i, ty]).only_enforce_if(same)
        model.add(first != v.node_last[i, ty]).only_enforce_if(same.negated())
        stay = v.stay[i, ty]
        for side in (on(i), on(i + 1), same):
            model.add(stay <= side)
        model.add(stay >= on(i) + on(i + 1) + same - 2)
    for (i, a, b), w in v.w.items():
        stay = v.stay[i, int(t.option_type[classes.index(a)])]
        model.add(w <= v.y[i, a, b])
        model.add(w <= stay)
        model.add(w >= v.y[i, a, b] + stay - 1)


def add_stage_times(model: cp_model.CpModel, t: StageTables, v: StageVars) -> None:
    """t[i] = core of the chosen option + the links on both sides (as the evaluator charges them).  With
    traffic, t[i] >= into[i] + B + L_out and t[i] >= F + L_in + out[i], into[i] >= F + L_in, M_in and
    out[i] >= B + L_out, M_out (schemas.pipeline.stage_time_with_links, tables.stage_us): the objective only rises with t,
    so at the optimum each is its maximum."""
    pp = t.pp
    for i in range(pp):
        core = sum(v.core[i, o] for o in v.options_of(i))
        if not v.traffic:
            expr = core
            if i > 0:
                expr += v.link[i - 1]
            if i < pp - 1:
                expr += v.link[i]
            model.add(v.t[i] == expr)
            continue
        fwd = sum(v.fwd[i, o] for o in v.options_of(i))
        l_in = v.link[i - 1] if i > 0 else 0
        l_out = v.link[i] if i < pp - 1 else 0
        model.add(v.into[i] >= fwd + l_in)
        model.add(v.out[i] >= core - fwd + l_out)
        if i > 0:
            model.add(v.into[i] >= v.traffic[i - 1])
        if i < pp - 1:
            model.add(v.out[i] >= v.traffic[i])
        model.add(v.t[i] >= v.into[i] + core - fwd + l_out)
        model.add(v.t[i] >= fwd + l_in + v.out[i])


def add_gpu_budget(model: cp_model.CpModel, t: StageTables, v: StageVars) -> None:
    """Per device type, the GPUs of all stages on it stay within the cluster's count."""
    for ty in range(len(t.types)):
        terms = [int(t.option_gpus[o]) * x for (i, o), x in v.x.items() if t.option_type[o] == ty]
        if terms:
            model.add(sum(terms) <= int(t.budget[ty]))


def add_contiguous_types(model: cp_model.CpModel, t: StageTables, v: StageVars) -> int:
    """With tables.contiguous_types, each device type's stages form one contiguous block: a block
    starts at stage i where the stage runs the type and stage i-1 does not
    (block_start[i, ty] >= on[i, ty] - on[i-1, ty]), and each type starts at most one block.
    Returns the number of types constrained (0 when the rule is off)."""
    if not v.block_start:
        return 0
    types = sorted({ty for (_, ty) in v.block_start})
    for ty in types:
        def on(i: int):
            return sum(x for (s, o), x in v.x.items() if s == i and int(t.option_type[o]) == ty)
        for i in range(t.pp):
            prev = on(i - 1) if i > 0 else 0
            model.add(v.block_start[i, ty] >= on(i) - prev)
        model.add(sum(v.block_start[i, ty] for i in range(t.pp)) <= 1)
    return len(types)


def add_bottleneck(model: cp_model.CpModel, t: StageTables, v: StageVars, *, max_equality: bool) -> None:
    """t_max is the slowest stage and sync_max the largest per-stage sync.  With max_equality,
    AddMaxEquality; otherwise only t_max >= t[i] (the objective pushes it down), which keeps the
    LP rows simple."""
    if max_equality:
        model.add_max_equality(v.t_max, v.t)
    else:
        for ti in v.t:
            model.add(v.t_max >= ti)
    for key, s in v.sync.items():
        model.add(v.sync_max >= s)


def add_load_balance(model: cp_model.CpModel, cells: Cells, v: StageVars, windows: np.ndarray | None) -> int:
    """The paper's load-balance pruning (switchable): a chosen option holds between windows[o, 0]
    and windows[o, 1] layers (the tables' windows, solver_models.tables.balance_windows).  Returns the
    number of constraints added (0 when off)."""
    if windows is None:
        return 0
    count = 0
    for (i, o) in cells:
        lo, hi = int(windows[o, 0]), int(windows[o, 1])
        model.add(v.n[i, o] >= lo * v.x[i, o])
        model.add(v.n[i, o] <= hi * v.x[i, o])
        count += 2
    return count


def objective_expr(t: StageTables, v: StageVars) -> cp_model.LinearExpr:
    """v x iteration time: sum t_i + (m*v - 1) * t_max + v * sync_max + v * the links' fill
    (StageTables.objective_us)."""
    vpp = t.g.vpp
    return sum(v.t) + (t.num_microbatches * vpp - 1) * v.t_max + vpp * v.sync_max + vpp * sum(v.fill)


def add_upper_bound(model: cp_model.CpModel, objective: cp_model.LinearExpr, upper_bound_us: int | None) -> None:
    """Only plans strictly better than upper_bound_us (the best plan of another configuration):
    lets CP-SAT prove "nothing better here" without finding the configuration's own optimum."""
    if upper_bound_us is not None:
        model.add(objective <= upper_bound_us - 1)
