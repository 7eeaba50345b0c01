"""Good plans early: incumbents for --backend cpsat before its exact search (issue 32).

The Benders loop (certify.py) proves; it finds good plans only as its relaxation happens to point at
them, so a search cut short by its time limit (or by a busy machine) used to hand over poor plans.
Before the loop, this prices a few configurations fast and offers their plans to the search, which
then bounds everything else with the best of them:

    the user's plan     (SearchSettings.seed_plans: the plan of `solve --megatron-script/--megatron-args`)
                        its own layout, priced on its configuration's tables when they hold it
    a fast heuristic    over the shapes of the user's plan, of the published runs of this model
                        (planner/calibration/runs.py: the measured runs of the same architecture, their
                        TP, CP, EP, ETP and micro-batch; of those shapes, the DP whose screen bound is
                        least) and those whose screen bounds are least until SEED_SHAPES of them found
                        a plan, in two passes: first each shape in the order of the screen bounds (the
                        least first, until one cannot beat the best plan found), every VPP under the most
                        recompute (the ladder's last setting: what fits anywhere; flagscale: none or full
                        per stage); then the shapes that found a plan, the best first, every other setting
                        at their best VPP.  Per configuration, every PP of the shape with stage-type
                        sequences near the types' throughput shares (flagscale: each type's stages take
                        the DPs that run the most layers per second within its GPUs, mixed where one DP
                        would leave GPUs idle), laid out by the rounding heuristic
                        (solver_models/rounding.py) on the configuration's tables; and, where the screen
                        bounds are loose (more shapes below the best plan than the exact search can open:
                        FURTHER_MIN_OPEN), a third pass over the shapes after those, in the same order, until
                        the time is spent or STALL_SHAPES in a row find no better plan

A configuration whose tight bound (the search's, planner/search/bounds.py) shows it cannot beat the best plan
found is skipped.  Then the best configuration found gets a short exact stage solve (the CP-SAT stage model)
from its plan.
No HS-DP code runs.  The plans are the cost model's, over the same integer tables as every other
plan of the search; they prove nothing (the Benders loop does), so they change no bound.  Runs over the
whole space (not under --prune, whose pruned space a seed may leave).  A search over a pooled view of the cluster
(planner/search/pools.py) seeds over that view: the heuristic runs on whatever cluster it is given.
"""

from __future__ import annotations

import functools
import itertools
import re
import shlex
import time

from planner.calibration.runs import load_runs
from planner.inputs.megatron_flags import parse_megatron_flags
from planner.schemas.plan import Plan
from planner.schemas.search import GlobalChoice
from solver_models.cpsat.model import CpSatSolution
from solver_models.rounding import rounded_plan, within_budget
from solver_models.tables import DeadlinePassed, StageTables

# the seeds take at most this share of the time the search has left after pricing
SEED_SHARE = 0.25
# ... and this share when pricing ran out of time (no whole-space bound: the search can only find plans), or
# with no plan yet
UNPROVABLE_SEED_SHARE = 0.75
# the heuristic tries the shapes with the least screen bounds until this many found a plan (besides the user's
# and the published ones)
SEED_SHAPES = 8
# the third pass (more shapes while the seeding's time lasts) runs only where more shapes than this have a screen bound
# below the best plan of the first two: more than the exact search opens in a minute (DeepSeek-V3 on 1024 H100: 2,787
# of 4,912 shapes, 34 opened in 60 s on a 2-core machine; the presets that certify within a minute leave 0-368) ...
FURTHER_MIN_OPEN = 1000
# ... and ends after this many shapes in a row found no better plan
STALL_SHAPES = 24
# the least time the best seed's exact stage solve gets
POLISH_MIN_S = 1.0
# stage-type count vectors tried per PP (the throughput share's, then its neighbours)
COUNT_VECTORS = 6
# model fields two runs must share to be the same architecture (published families)
ARCHITECTURE = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "multi_latent_attention")


class Seeds:
    """The seeding of one Benders search (module docstring): `run(until)` offers its plans to the
    search (BendersSearch._offer) and returns the configurations it priced."""

    def __init__(self, search):  # a planner.search.certify.BendersSearch (which imports this module)
        self.search = search
        self.book = search.book
        self.until = self.last = 0.0
        self.priced = 0

    @property
    def applies(self) -> bool:
        return not self.search.pruning.restricts

    def run(self, until: float, last: float | None = None) -> int:
        """Seed until `until` (time.perf_counter()), or while there is no plan yet until `last` (the
        heuristic finds a first plan faster than the exact search), then solve the best configuration
        found exactly (within what is left of the seeding's time, at least POLISH_MIN_S); the configurations
        priced."""
        if not self.applies:
            return 0
        self.until, self.last = until, max(until, last or until)
        shapes = self.search.screen_order  # [(bound us, key)], least first
        try:
            wanted = {self._user_plan(p) for p in self.search.settings.seed_plans}
            wanted |= set(self._published({key: b for b, key in shapes}))
            found = []  # (best objective s, its configuration, shape key) per shape the first pass found a plan in
            rest = []  # the shapes the first pass left for the third
            for b, key in shapes:
                if key not in wanted and len(found) >= SEED_SHAPES:
                    rest.append((b, key))
                    continue
                if self._beaten(b):
                    break  # no configuration of this shape or any later one beats the best plan
                best = self._most_recompute(key)
                if best is not None:
                    found.append((*best, key))
            for _, g, key in sorted(found, key=lambda f: f[0]):
                self._other_settings(key, g)
            self._further(rest, min((f[0] for f in found), default=None))
        except (DeadlinePassed, _OutOfTime):
            pass
        try:
            self._polish()
        except DeadlinePassed:
            pass
        return self.priced

    # ---- where to look ----
    def _user_plan(self, plan: Plan) -> tuple | None:
        """The user's plan priced on its configuration's tables (offered when they hold its layout);
        its shape's key (None when the space has no such shape)."""
        if self.book.flagscale or plan.runtime != "megatron" or \
                len({(s.dp, s.recompute.label) for s in plan.stages}) != 1:
            return None
        s0 = plan.stages[0]
        g = GlobalChoice("megatron", plan.tp, plan.cp, plan.ep, plan.etp or plan.tp, plan.mbs, len(plan.stages),
                         plan.vpp or 1, s0.dp, s0.recompute)
        key = self.book.key(g)
        shape = self.book.shapes.get(key)
        if shape is None or (g.pp, g.vpp) not in shape.pipelines or \
                s0.recompute.label not in {r.label for r in shape.recomputes if r is not None}:
            return key if shape is not None else None
        g = shape.choice(g.pp, g.vpp, next(r for r in shape.recomputes if r.label == s0.recompute.label))
        tables = self._tables(g)
        index = {tables.options[o].device_type: o for o in range(tables.num_options)}
        stages, start = [], 0
        for i, s in enumerate(plan.stages):
            o = index.get(s.device_type)
            if o is None or not tables.fits(o, i, start, s.num_layers):
                return key
            stages.append((o, start, s.num_layers))
            start += s.num_layers
        if start == tables.num_layers and tables.type_sequence_ok([o for o, _, _ in stages]) \
                and within_budget(tables, stages):
            self._offer(g, tables, stages)
        return key

    def _published(self, bound: dict[tuple, float]) -> list[tuple]:
        """Per published run of this model's architecture, the shape with its degrees (TP, CP, EP, ETP,
        micro-batch) whose screen bound is least."""
        model = self.search.cost.model
        mine = {f: getattr(model, f) for f in ARCHITECTURE}
        out = []
        for row in load_runs():
            args = row["megatron_args"]
            if not re.search(rf"--num-layers[ =]{model.num_layers}\b", args) or \
                    not re.search(rf"--hidden-size[ =]{model.hidden_size}\b", args):
                continue
            self._check_time()
            try:
                run = parse_megatron_flags(shlex.split(args))
            except ValueError:
                continue
            if {f: getattr(run.model, f) for f in ARCHITECTURE} != mine:
                continue
            p = run.parallel
            family = (p.tp, p.cp, p.ep, p.etp or p.tp, run.training.micro_batch_size)
            keys = [k for k in bound if k[:4] == family[:4] and (self.book.flagscale or k[4] == family[4])]
            if keys:
                out.append(min(keys, key=bound.__getitem__))
        return out

    def _further(self, rest: list[tuple[float, tuple]], most_s: float | None) -> None:
        """The third pass, where the exact search cannot open every shape below the best plan (FURTHER_MIN_OPEN)
        and while the seeding's time lasts: the shapes after the first pass's, in the order of their screen bounds,
        each at its most recompute; one whose plan there beats every shape's so far (`most_s`, s: like with like,
        as the second pass's other settings may have improved the best plan) gets its other settings too.  Where
        the screen bounds are that loose (DeepSeek-V3 on 1024 H100: the best plan of the first two passes 3.3x the
        least bound, its best family the 31st of 4,912 shapes) the few shapes the first pass sees need not hold the
        best families.  The first shape bounded at the best plan ends it, and so do STALL_SHAPES shapes in a row
        without a better one (the exact search can use the time)."""
        if not self.search.cands or \
                sum(1 for b, _ in rest if not self._beaten(b)) <= FURTHER_MIN_OPEN:
            return
        stalled = 0
        for b, key in rest:
            if self._beaten(b) or stalled >= STALL_SHAPES:
                return
            best = self._most_recompute(key)
            if best is not None and (most_s is None or best[0] < most_s):
                most_s = best[0]
                self._other_settings(key, best[1])
                stalled = 0
            else:
                stalled += 1

    def _beaten(self, bound_us: float) -> bool:
        """Whether a shape's screen bound (us) is no better than the best plan found (no configuration of it, or of
        any later shape, can beat it)."""
        return bool(self.search.cands) and bound_us >= self.search.cands[0].objective_s * 1e6

    def _most_recompute(self, key: tuple) -> tuple[float, GlobalChoice] | None:
        """A shape at its most recompute (what fits anywhere), every VPP: its best objective (s) and configuration."""
        shape = self.book.shapes[key]
        most = shape_settings(shape)[-1]
        return self._sweep(shape, [(most, v) for v in sorted({v for _, v in shape.pipelines})])

    def _other_settings(self, key: tuple, g: GlobalChoice) -> None:
        """A shape's other recompute settings at the VPP of its best configuration G."""
        shape = self.book.shapes[key]
        self._sweep(shape, [(r, g.vpp) for r in shape_settings(shape)[:-1]])

    # ---- the heuristic ----
    def _sweep(self, shape, pairs) -> tuple[float, GlobalChoice] | None:
        """Every (recompute, VPP) pair at every PP of the shape; the best objective (s) found and its
        configuration."""
        best: tuple[float, GlobalChoice] | None = None
        for rc, v in pairs:
            for pp in sorted(p for p, w in shape.pipelines if w == v):
                self._check_time()
                g = shape.choice(pp, v, rc)
                if self._hopeless(g):
                    continue
                found = self._layouts(g)
                if found is not None and (best is None or found < best[0]):
                    best = (found, g)
        return best

    def _hopeless(self, g: GlobalChoice) -> bool:
        """Whether G's tight bound (the search's, kept for its loop) shows it cannot beat the best plan found."""
        cutoff = self.search._cutoff_us()
        return cutoff is not None and self.search._tight_us(g, cutoff) >= cutoff

    def _layouts(self, g: GlobalChoice) -> float | None:
        """G laid out by the rounding heuristic over stage-type sequences: the best objective (s) found."""
        tables = self._tables(g)
        self.priced += 1
        best = None
        for allowed in sequences(tables):
            plan = rounded_plan(tables, allowed)
            if plan is not None:
                obj = self._offer(g, tables, plan)
                best = obj if best is None else min(best, obj)
        self.search._report("seeding", g.label())
        return best

    def _polish(self) -> None:
        """The best configuration's exact stage solve, from its plan (a hint), within what is left of the
        seeding's time (at least POLISH_MIN_S): it improves the plan early, its proof can wait for the loop."""
        s = self.search
        if not s.cands or s.cands[0].status == "OPTIMAL":
            return
        c = s.cands[0]
        tables = self._tables(c.g)
        sol = s._stage_solve(tables, None, list(c.stages), max(POLISH_MIN_S, self.until - time.perf_counter()))
        if sol is not None and sol.stages:
            s._offer(c.g, tables, sol)

    # ---- plumbing ----
    def _tables(self, g: GlobalChoice) -> StageTables:
        return self.search._tables(g, exact=True)

    def _offer(self, g: GlobalChoice, tables: StageTables, stages: list) -> float:
        objective = tables.plan_objective_us(stages)
        self.search._offer(g, tables, CpSatSolution(objective, 0, stages, "FEASIBLE", exact=False))
        return objective / g.vpp * 1e-6

    def _check_time(self) -> None:
        now = time.perf_counter()
        if now > self.last or (now > self.until and self.search.cands):
            raise _OutOfTime


def shape_settings(shape) -> list:
    """A shape's recompute settings, the ladder's order, the last fitting anywhere: megatron's most recompute;
    flagscale's None (each stage none or full on its own) after its shared selective modes."""
    return [r for r in shape.recomputes if r is not None] + [None] * (None in shape.recomputes)


class _OutOfTime(Exception):
    """The seeding's share of the time is spent."""


def sequences(t: StageTables) -> list[list[list[int]]]:
    """Stage-option sequences to lay out at the tables' PP: each device type's stages in one
    block (the slowest types first, then the fastest first), as many stages per type as its share of
    the cluster's throughput (units x layers per second of one stage) gives, and near it.  A type's
    stages take the stage classes (flagscale: one per DP; megatron: the one) that give its stages the
    most layers per second within its GPUs (`_stage_classes`), the largest first."""
    classes: dict[int, dict[int, list[int]]] = {}  # type -> GPUs per stage -> its options, the tables' order
    for o in range(t.num_options):
        classes.setdefault(int(t.option_type[o]), {}).setdefault(int(t.option_gpus[o]), []).append(o)
    speed = {ty: tuple((g, max(1, int(t.min_layer_us[opts].min()))) for g, opts in sorted(cls.items(), reverse=True))
             for ty, cls in classes.items()}  # (GPUs per stage, least per-layer time), the largest stage first
    units = {ty: int(t.budget[ty] // speed[ty][-1][0]) for ty in classes}
    rate = {ty: max((int(t.budget[ty]) // g) / tau for g, tau in speed[ty]) for ty in classes}
    types = sorted((ty for ty in classes if units[ty] > 0), key=lambda ty: rate[ty] / max(1, units[ty]))
    out = []
    for counts in _count_vectors(types, units, rate, t.pp):
        picked = {ty: _stage_classes(speed[ty], counts[ty], int(t.budget[ty])) for ty in types}
        if any(p is None for p in picked.values()):
            continue
        for order in (types, types[::-1]) if len(types) > 1 else (types,):
            seq = [classes[ty][g] for ty in order for g in picked[ty]]
            if seq not in out:
                out.append(seq)
    return out


@functools.lru_cache(maxsize=4096)
def _stage_classes(speed: tuple[tuple[int, int], ...], k: int, budget: int) -> tuple[int, ...] | None:
    """The GPUs per stage of k stages of one device type (from `speed`: (GPUs per stage, least per-layer
    time) per class) within `budget` GPUs whose layers per second add up the most (ties: the fewer GPUs),
    the largest first; None when k stages do not fit.  An awkward count (344 GPUs, stages of 32, 64 or
    128) mixes classes to use what one class would leave idle."""
    best, best_key = None, None
    for counts in _compositions(k, len(speed)):
        gpus = sum(n * g for n, (g, _) in zip(counts, speed))
        if gpus > budget:
            continue
        key = (sum(n / tau for n, (_, tau) in zip(counts, speed)), -gpus)
        if best_key is None or key > best_key:
            best, best_key = counts, key
    if best is None:
        return None
    return tuple(g for n, (g, _) in zip(best, speed) for _ in range(n))


def _compositions(k: int, parts: int):
    """Every way to write k as an ordered sum of `parts` non-negative integers."""
    if parts == 1:
        yield (k,)
        return
    for first in range(k, -1, -1):
        for rest in _compositions(k - first, parts - 1):
            yield (first,) + rest


def _count_vectors(types: list[int], units: dict[int, int], rate: dict[int, float], pp: int
                   ) -> list[dict[int, int]]:
    """Stages per type summing to PP within the type budgets: the throughput share's (largest
    remainder), then vectors one stage away from it, at most COUNT_VECTORS."""
    if sum(units[ty] for ty in types) < pp:
        return []
    total = sum(rate[ty] for ty in types)
    share = {ty: pp * rate[ty] / total for ty in types}
    counts = {ty: min(units[ty], int(share[ty])) for ty in types}
    while sum(counts.values()) < pp:
        ty = max((ty for ty in types if counts[ty] < units[ty]), key=lambda ty: share[ty] - counts[ty])
        counts[ty] += 1
    out = [counts]
    for a, b in itertools.permutations(types, 2):
        if counts[a] > 0 and counts[b] < units[b]:
            out.append({**counts, a: counts[a] - 1, b: counts[b] + 1})
    return out[:COUNT_VECTORS]
