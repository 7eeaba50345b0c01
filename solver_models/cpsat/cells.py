"""The (start, layer count) cells each stage may use under each option, read from StageTables.

A cell (o, i, start, n) is allowed when the table has a finite core time for stage i's position
there, the stage fits in memory (tables.fits, vectorised with the same float expression), and the
cell leaves at least one layer for every other stage.  For each (stage, option) pair the cells are
kept both as a 1-D map n -> (core, sync, fwd) when the values do not depend on the start (always so for
the first and last stage, and for a model whose layers are all of one kind), and as the full
(start, n, core, sync, fwd) list otherwise; fwd is the forward part of core (tables.fwd_us; core itself where
the tables keep none).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from solver_models.scaling import INF_US
from solver_models.tables import StageTables, check_deadline, position


@dataclass(frozen=True)
class StageOptionCells:
    """Allowed cells of one option at one stage."""

    stage: int
    option: int
    start_lo: int  # least start layer stage i can have (every earlier stage holds >= 1 layer)
    start_hi: int  # largest start layer (every later stage holds >= 1 layer)
    cells: tuple[tuple[int, int, int, int, int], ...]  # (start, n, core_us, sync_us, fwd_us), n >= 1
    by_n: dict[int, tuple[int, int, int]] | None  # n -> (core_us, sync_us, fwd_us) when start-independent

    @property
    def empty(self) -> bool:
        return not self.cells

    def counts(self) -> list[int]:
        """Layer counts that some allowed cell uses, ascending."""
        return sorted({cell[1] for cell in self.cells})

    def least_by_n(self, which: int) -> dict[int, int]:
        """n -> least core (which=2) or sync (which=3) over the allowed starts: a lower bound valid
        for every start."""
        out: dict[int, int] = {}
        for cell in self.cells:
            n, val = cell[1], cell[which]
            if n not in out or val < out[n]:
                out[n] = val
        return out


def start_range(i: int, pp: int, num_layers: int) -> tuple[int, int]:
    """Inclusive range of stage i's start layer when every stage holds at least one layer."""
    if i == 0:
        return 0, 0
    return i, num_layers - (pp - i)


def stage_option_cells(t: StageTables, i: int, o: int) -> StageOptionCells:
    """Allowed cells of option o at stage i (see the module docstring)."""
    pp, N = t.pp, t.num_layers
    p = position(i, pp)
    s_lo, s_hi = start_range(i, pp, N)
    later = pp - 1 - i  # stages after i, each needing >= 1 layer
    starts = np.arange(s_lo, s_hi + 1)[:, None]
    ns = np.arange(N + 1)[None, :]
    structural = (ns >= 1) & (starts + ns <= N - later)
    if i == pp - 1:
        structural &= starts + ns == N
    core = t.core_us[o, p, s_lo:s_hi + 1, :]
    sync = t.sync_us[o, p, s_lo:s_hi + 1, :]
    fwd = (t.core_us if t.fwd_us is None else t.fwd_us)[o, p, s_lo:s_hi + 1, :]
    # StageTables' own fit ranges (memory, and the memory-pruning rule when it is on)
    lo, hi = t.fit_range()
    fits = (ns >= lo[o, i, s_lo:s_hi + 1][:, None]) & (ns <= hi[o, i, s_lo:s_hi + 1][:, None])
    ok = structural & (core < INF_US) & fits
    rows, cols = np.nonzero(ok)
    cells = tuple((int(s_lo + r), int(c), int(core[r, c]), int(sync[r, c]), int(fwd[r, c]))
                  for r, c in zip(rows, cols))
    by_n = _start_independent(ok, structural, core, sync, fwd)
    return StageOptionCells(stage=i, option=o, start_lo=s_lo, start_hi=s_hi, cells=cells, by_n=by_n)


def _start_independent(ok: np.ndarray, structural: np.ndarray, core: np.ndarray, sync: np.ndarray,
                       fwd: np.ndarray) -> dict[int, tuple[int, int, int]] | None:
    """n -> (core, sync, fwd) if, for every n, all structurally possible starts agree on whether the
    cell is allowed and on its values; None otherwise."""
    out: dict[int, tuple[int, int, int]] = {}
    for n in range(1, ok.shape[1]):
        rows = np.nonzero(structural[:, n])[0]
        if rows.size == 0:
            continue
        allowed = ok[rows, n]
        if not allowed.any():
            continue
        if not allowed.all():
            return None
        c, s, f = core[rows, n], sync[rows, n], fwd[rows, n]
        if (c != c[0]).any() or (s != s[0]).any() or (f != f[0]).any():
            return None
        out[n] = (int(c[0]), int(s[0]), int(f[0]))
    return out


def all_cells(t: StageTables, *, drop_dominated: bool = True) -> dict[tuple[int, int], StageOptionCells]:
    """Allowed cells for every (stage, option); stage 0 and the last stage keep only the options
    the tables allow there (first_stage_ok, last_stage_ok).
    With drop_dominated, cells another interchangeable option does at least as well are removed
    (see drop_dominated_cells); the optimum is unchanged."""
    out = {}
    for i in range(t.pp):
        for o in range(t.num_options):
            if (i == 0 and not t.first_stage_ok(o)) or (i == t.pp - 1 and not t.last_stage_ok(o)):
                continue
            check_deadline(t.deadline)  # DeadlinePassed: seconds per model on hundreds of layers
            cell = stage_option_cells(t, i, o)
            if not cell.empty:
                out[(i, o)] = cell
    if drop_dominated:
        check_deadline(t.deadline)
        out = drop_dominated_cells(t, out)
    return out


def interchangeable_key(t: StageTables, o: int) -> tuple:
    """Options with equal keys differ only in their stage cost tables (in practice: recompute):
    same device type, GPUs, DP, pipeline links (tables.link_rows) and load-balance weight."""
    return (int(t.option_type[o]), int(t.option_gpus[o]), t.options[o].dp, int(t.min_layer_us[o]),
            t.link_rows(o))


def cell_costs(t: StageTables, cell: tuple[int, int, int, int, int]) -> tuple[int, ...]:
    """What a cell's stage pays, for dominance: (core, sync), and with traffic (tables.stage_us) its forward and
    backward apart: (fwd, core - fwd, sync)."""
    _, _, core, sync, fwd = cell
    return (core, sync) if t.traffic_us is None else (fwd, core - fwd, sync)


def drop_dominated_cells(t: StageTables, cells: dict[tuple[int, int], StageOptionCells]
                         ) -> dict[tuple[int, int], StageOptionCells]:
    """Remove cell (s, n) of option o at stage i when an interchangeable option o' has the same
    cell allowed with no larger `cell_costs` (ties kept by the lower index).  Exact: in
    any plan using the removed cell, switching that stage to o' keeps GPUs, links, layers and
    load-balance windows and raises no stage time or sync."""
    groups: dict[tuple, list[int]] = {}
    for o in range(t.num_options):
        groups.setdefault(interchangeable_key(t, o), []).append(o)
    out = dict(cells)
    for members in groups.values():
        for i in range(t.pp):
            present = [o for o in members if (i, o) in cells]
            if len(present) < 2:
                continue
            value = {o: {cell[:2]: cell_costs(t, cell) for cell in cells[i, o].cells} for o in present}
            for o in present:
                keep = [cell for cell in cells[i, o].cells
                        if not any(_dominates(value[o2].get(cell[:2]), o2, cell_costs(t, cell), o)
                                   for o2 in present if o2 != o)]
                if not keep:
                    del out[i, o]
                elif len(keep) < len(cells[i, o].cells):
                    out[i, o] = replace(cells[i, o], cells=tuple(keep),
                                        by_n=_restrict(cells[i, o], keep))
    return out


def _dominates(rival: tuple[int, ...] | None, o2: int, mine: tuple[int, ...], o: int) -> bool:
    """Whether option o2's `cell_costs` at a cell beat option o's there (ties: lower index)."""
    if rival is None:
        return False
    if rival == mine:
        return o2 < o
    return all(a <= b for a, b in zip(rival, mine))


def _restrict(c: StageOptionCells, keep: list[tuple[int, int, int, int, int]]
              ) -> dict[int, tuple[int, int, int]] | None:
    """c.by_n limited to the kept counts, or None (a table is needed) when some count keeps only
    part of its starts."""
    if c.by_n is None:
        return None
    before: dict[int, int] = {}
    after: dict[int, int] = {}
    for cell in c.cells:
        before[cell[1]] = before.get(cell[1], 0) + 1
    for cell in keep:
        after[cell[1]] = after.get(cell[1], 0) + 1
    if any(after[n] != before[n] for n in after):
        return None
    return {n: val for n, val in c.by_n.items() if n in after}


def canonical_plan(t: StageTables, cells: dict[tuple[int, int], StageOptionCells],
                   stages: list[tuple[int, int, int]]) -> list[tuple[int, int, int]] | None:
    """The plan with each stage whose cell was dropped as dominated moved to the interchangeable
    option that kept it with no larger `cell_costs` (no stage time or sync rises); None if some cell is not
    allowed at all."""
    out = []
    for i, (o, s, n) in enumerate(stages):
        key = interchangeable_key(t, o)
        p = position(i, t.pp)
        mine = cell_costs(t, (s, n, int(t.core_us[o, p, s, n]), int(t.sync_us[o, p, s, n]),
                              int((t.core_us if t.fwd_us is None else t.fwd_us)[o, p, s, n])))
        best = None
        for o2 in range(t.num_options):
            if (i, o2) not in cells or interchangeable_key(t, o2) != key:
                continue
            for cell in cells[i, o2].cells:
                costs = cell_costs(t, cell)
                if cell[:2] == (s, n) and (best is None or (costs, o2) < best) and (
                        o2 == o or all(a <= b for a, b in zip(costs, mine))):
                    best = (costs, o2)
        if best is None:
            return None
        out.append((best[1], s, n))
    return out


def lower_hull(points: dict[int, int]) -> list[tuple[int, int, int]]:
    """Integer lines d*value >= a*n + b (d > 0) that hold at every point (n, value): the facets of
    the lower convex hull of the points, as (d, a, b).  Used for the cuts
    d*value_io >= a*n_io + b*x_io, which also hold (0 >= 0) for an unchosen option."""
    pts = sorted(points.items())
    hull: list[tuple[int, int]] = []
    for p in pts:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            # drop hull[-1] when it lies on or above the segment hull[-2] -> p
            if (y2 - y1) * (p[0] - x1) >= (p[1] - y1) * (x2 - x1):
                hull.pop()
            else:
                break
        hull.append(p)
    if len(hull) == 1:
        return [(1, 0, hull[0][1])]
    lines = []
    for (x1, y1), (x2, y2) in zip(hull, hull[1:]):
        d, a = x2 - x1, y2 - y1
        lines.append((d, a, d * y1 - a * x1))
    return lines
