"""The CP-SAT decision variables of one global configuration, with hinting and extraction.

Per stage i and allowed option o (see cells.py):
  x[i, o]     Boolean, stage i runs option o;
  n[i, o]     layers stage i holds under option o (0 unless x[i, o]);
  core[i, o]  core time of stage i under option o, integer us (0 unless x[i, o]);
  sync[i, o]  exposed DP sync + optimizer time (0 unless x[i, o]);
  fwd[i, o]   the forward part of core (0 unless x[i, o]; only where the tables carry traffic);
Per stage: start[i] (first layer), layers[i] = sum_o n[i, o], t[i] stage time (with traffic, into[i] and
  out[i]: its forward with the link in and its backward with the link out, schemas.pipeline.stage_time_with_links).
Per link: link[i] its L (and with traffic, traffic[i] its M: tables.link).
Per link between stages i and i+1 and option classes (a, b) with equal p2p rows/columns:
  y[i, a, b]  Boolean, stage i is in class a and stage i+1 in class b.
With positional links (tables.link_us), per link i and device type ty whose links can stay inside a node:
  node_first[i, ty], node_last[i, ty]  the node (of type ty) holding the first GPU of stage i's block and
              the last of stage i+1's, counting ty's GPUs of the stages before i;
  same_node[i, ty]  Boolean, node_first == node_last;
  stay[i, ty] Boolean, stages i and i+1 both run ty and their blocks share one node;
  w[i, a, b]  Boolean, y[i, a, b] and the link stays inside a node (class pairs whose two prices differ).
Per stage and device type, when the tables carry the contiguity rule:
  block_start[i, ty]  Boolean, stage i runs type ty and stage i-1 does not.
Global: t_max (bottleneck stage time), sync_max.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from solver_models.cpsat.cells import StageOptionCells, start_range
from solver_models.tables import StageTables, position


@dataclass
class StageVars:
    """Variables of the stage model, keyed by index tuples."""

    x: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    n: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    core: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    sync: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    fwd: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    start: list[cp_model.IntVar] = field(default_factory=list)
    layers: list[cp_model.IntVar] = field(default_factory=list)
    t: list[cp_model.IntVar] = field(default_factory=list)
    link: list[cp_model.IntVar] = field(default_factory=list)  # L of the link after stage i
    traffic: list[cp_model.IntVar] = field(default_factory=list)  # its M (with traffic)
    fill: list = field(default_factory=list)  # its fill X, a linear expression (interleaved)
    into: list[cp_model.IntVar] = field(default_factory=list)  # with traffic: max(F + L_in, M_in)
    out: list[cp_model.IntVar] = field(default_factory=list)  # with traffic: max(B + L_out, M_out)
    y: dict[tuple[int, int, int], cp_model.IntVar] = field(default_factory=dict)
    block_start: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    node_first: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    node_last: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    same_node: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    stay: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    w: dict[tuple[int, int, int], cp_model.IntVar] = field(default_factory=dict)
    t_max: cp_model.IntVar | None = None
    sync_max: cp_model.IntVar | None = None

    def options_of(self, i: int) -> list[int]:
        """Options stage i may take, ascending."""
        return sorted(o for (s, o) in self.x if s == i)


def create_vars(model: cp_model.CpModel, t: StageTables, cells: dict[tuple[int, int], StageOptionCells],
                link_classes: list[int]) -> StageVars:
    """Create every variable with the tightest domain the cells give."""
    pp, N = t.pp, t.num_layers
    v = StageVars()
    for (i, o), c in sorted(cells.items()):
        counts = c.counts()
        cores = [cell[2] for cell in c.cells]
        syncs = [cell[3] for cell in c.cells]
        v.x[i, o] = model.new_bool_var(f"x_{i}_{o}")
        v.n[i, o] = model.new_int_var_from_domain(cp_model.Domain.from_values([0] + counts), f"n_{i}_{o}")
        v.core[i, o] = model.new_int_var(0, max(cores), f"core_{i}_{o}")
        v.sync[i, o] = model.new_int_var(0, max(syncs), f"sync_{i}_{o}")
        if t.traffic_us is not None:
            v.fwd[i, o] = model.new_int_var(0, max(cell[4] for cell in c.cells), f"fwd_{i}_{o}")
    max_core = max((max(cell[2] for cell in c.cells) for c in cells.values()), default=0)
    max_sync = max((max(cell[3] for cell in c.cells) for c in cells.values()), default=0)
    max_link = int(max(t.p2p_us.max(), t.near_us.max())) if t.p2p_us.size else 0
    max_traffic = int(t.traffic_us.max()) if t.traffic_us is not None and t.traffic_us.size else 0
    max_link = max_link + max_traffic
    for i in range(pp):
        s_lo, s_hi = start_range(i, pp, N)
        v.start.append(model.new_int_var(s_lo, s_hi, f"start_{i}"))
        v.layers.append(model.new_int_var(1, N - (pp - 1), f"layers_{i}"))
        v.t.append(model.new_int_var(0, max_core + 2 * max_link, f"t_{i}"))
        if t.traffic_us is not None:
            v.into.append(model.new_int_var(0, max_core + max_link, f"into_{i}"))
            v.out.append(model.new_int_var(0, max_core + max_link, f"out_{i}"))
    for i in range(pp - 1):
        v.link.append(model.new_int_var(0, max_link, f"link_{i}"))
        if t.traffic_us is not None:
            v.traffic.append(model.new_int_var(0, max_traffic, f"traffic_{i}"))
        classes = sorted(set(link_classes))
        for a in classes:
            for b in classes:
                v.y[i, a, b] = model.new_bool_var(f"y_{i}_{a}_{b}")
        types, pairs = positional_pairs(t, link_classes)
        for ty in types:
            gpn = int(t.gpus_per_node[ty])
            v.node_first[i, ty] = model.new_int_var(0, int(t.budget[ty]) // gpn, f"node_first_{i}_{ty}")
            v.node_last[i, ty] = model.new_int_var(0, 3 * int(t.budget[ty]) // gpn + 1, f"node_last_{i}_{ty}")
            v.same_node[i, ty] = model.new_bool_var(f"same_node_{i}_{ty}")
            v.stay[i, ty] = model.new_bool_var(f"stay_{i}_{ty}")
        for a, b in pairs:
            v.w[i, a, b] = model.new_bool_var(f"w_{i}_{a}_{b}")
    if contiguous(t):
        for ty in sorted({int(t.option_type[o]) for (_, o) in cells}):
            for i in range(pp):
                v.block_start[i, ty] = model.new_bool_var(f"block_start_{i}_{ty}")
    v.t_max = model.new_int_var(0, max_core + 2 * max_link, "t_max")
    v.sync_max = model.new_int_var(0, max_sync, "sync_max")
    return v


def positional_pairs(t: StageTables, link_classes: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """The device types whose links can stay inside a node at a different price, and the class pairs (a, b)
    (both of such a type) whose two link prices differ.  Empty without positional links."""
    if not t.positional_links:
        return [], []
    rep = {c: link_classes.index(c) for c in sorted(set(link_classes))}
    def differ(a: int, b: int) -> bool:
        return t.near_us[a, b] != t.p2p_us[a, b] or any(x is not None and x[1, a, b] != x[0, a, b]
                                                        for x in (t.traffic_us, t.fill_us))
    pairs = [(a, b) for a in rep for b in rep if differ(rep[a], rep[b])]
    types = sorted({int(t.option_type[rep[a]]) for a, _ in pairs})
    return types, pairs


def contiguous(t: StageTables) -> bool:
    """Whether the tables carry the rule that each device type's stages form one block."""
    return bool(t.contiguous_types)


def stage_values(t: StageTables, stages: list[tuple[int, int, int]]) -> tuple[list[int], list[int], list[int]]:
    """Per stage (core, sync, time) of a plan [(option, start, n)], read from the tables."""
    pp = t.pp
    cores, syncs = [], []
    for i, (o, s, n) in enumerate(stages):
        p = position(i, pp)
        cores.append(int(t.core_us[o, p, s, n]))
        syncs.append(int(t.sync_us[o, p, s, n]))
    return cores, syncs, t.plan_stage_us(stages)


def hint_plan(model: cp_model.CpModel, v: StageVars, t: StageTables, stages: list[tuple[int, int, int]],
              link_classes: list[int]) -> None:
    """Hint every variable with a known plan [(option, start, n)] (a complete hint)."""
    pp = t.pp
    cores, syncs, times = stage_values(t, stages)
    chosen = {i: o for i, (o, _, _) in enumerate(stages)}
    for (i, o), x in v.x.items():
        on = chosen[i] == o
        model.add_hint(x, on)
        model.add_hint(v.n[i, o], stages[i][2] if on else 0)
        model.add_hint(v.core[i, o], cores[i] if on else 0)
        model.add_hint(v.sync[i, o], syncs[i] if on else 0)
        if (i, o) in v.fwd:
            model.add_hint(v.fwd[i, o], int(t.fwd_us[o, position(i, pp), stages[i][1], stages[i][2]]) if on else 0)
    for i, (o, s, n) in enumerate(stages):
        model.add_hint(v.start[i], s)
        model.add_hint(v.layers[i], n)
        model.add_hint(v.t[i], times[i])
    links = t.plan_links([chosen[i] for i in range(pp)])
    for i, (o, s, n) in enumerate(stages):
        if v.into:
            fwd = int(t.fwd_us[o, position(i, pp), s, n])
            l_in, l_out = (links[i - 1] if i else (0, 0)), (links[i] if i + 1 < pp else (0, 0))
            model.add_hint(v.into[i], max(fwd + l_in[0], l_in[1]))
            model.add_hint(v.out[i], max(cores[i] - fwd + l_out[0], l_out[1]))
    used = [0] * len(t.types)  # the GPUs of each type the stages before stage i use
    for i in range(pp - 1):
        a, b = link_classes[chosen[i]], link_classes[chosen[i + 1]]
        model.add_hint(v.link[i], links[i][0])
        if v.traffic:
            model.add_hint(v.traffic[i], links[i][1])
        for (k, ca, cb), y in v.y.items():
            if k == i:
                model.add_hint(y, ca == a and cb == b)
        here, there = int(t.option_gpus[chosen[i]]), int(t.option_gpus[chosen[i + 1]])
        same_type = int(t.option_type[chosen[i]]) == int(t.option_type[chosen[i + 1]])
        for (k, ty), var in v.node_first.items():
            if k != i:
                continue
            gpn = int(t.gpus_per_node[ty])
            size = (here if int(t.option_type[chosen[i]]) == ty else 0) + (
                there if int(t.option_type[chosen[i + 1]]) == ty else 0)
            first, last = used[ty] // gpn, max(used[ty] + size - 1, 0) // gpn
            model.add_hint(var, first)
            model.add_hint(v.node_last[i, ty], last)
            model.add_hint(v.same_node[i, ty], first == last)
            model.add_hint(v.stay[i, ty], same_type and int(t.option_type[chosen[i]]) == ty and first == last)
        stays = same_type and not t.crosses_nodes(chosen[i], chosen[i + 1], used[int(t.option_type[chosen[i]])])
        for (k, ca, cb), w in v.w.items():
            if k == i:
                model.add_hint(w, ca == a and cb == b and stays)
        used[int(t.option_type[chosen[i]])] += here
    types = [int(t.option_type[chosen[i]]) for i in range(pp)]
    for (i, ty), b in v.block_start.items():
        model.add_hint(b, types[i] == ty and (i == 0 or types[i - 1] != ty))
    model.add_hint(v.t_max, max(times))
    model.add_hint(v.sync_max, max(syncs))


def extract_plan(solver: cp_model.CpSolver, v: StageVars, pp: int) -> list[tuple[int, int, int]]:
    """The plan [(option, start, n)] of the solver's current solution."""
    stages = []
    for i in range(pp):
        o = next(o for o in v.options_of(i) if solver.boolean_value(v.x[i, o]))
        stages.append((o, int(solver.value(v.start[i])), int(solver.value(v.n[i, o]))))
    return stages


def variable_counts(v: StageVars) -> dict[str, int]:
    """Variables per family: `stages` (per stage and option: x, n, core, sync, fwd; per stage: start,
    layers, t, into, out), `links` (link L and M, the class-pair Booleans y, and the node positions),
    `blocks` (contiguity) and `bottleneck` (t_max, sync_max)."""
    stages = (len(v.x) + len(v.n) + len(v.core) + len(v.sync) + len(v.fwd) + len(v.start) + len(v.layers)
              + len(v.t) + len(v.into) + len(v.out))
    links = (len(v.link) + len(v.traffic) + len(v.y) + len(v.node_first) + len(v.node_last) + len(v.same_node)
             + len(v.stay) + len(v.w))
    return {"stages": stages, "links": links, "blocks": len(v.block_start),
            "bottleneck": int(v.t_max is not None) + int(v.sync_max is not None)}
