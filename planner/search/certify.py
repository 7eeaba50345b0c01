"""--backend cpsat: logic-based Benders decomposition over the degrees, CP-SAT throughout.

    seeds       before the loop, planner/search/seeds.py prices a few configurations fast (the user's
                plan, published families, a rounding heuristic over the shapes with the least screen
                bounds) so that the loop starts with a good plan to bound the rest with
    master      solver_models/cpsat/master.py: the degrees are decisions, Megatron's rules are
                constraints (rule_families below, from planner/megatron/rules.py), and a relaxation
                of the stage problem prices every configuration at once (planner/search/prices.py
                builds its per-layer tables from the cost model)
    tight       the configuration the master picks (least relaxation value) first gets its tight bound
                (planner/search/bounds.py lower_bound_s: integral layers, memory per pipeline position, each
                device type's GPUs), and so does every PP of its shape with its other degrees: those it
                shows no layout fits or no plan beats the best are settled at once, no stage solve (deep
                pipelines, whose block value the tight bound far exceeds and whose stage solves are slow);
                a configuration whose tight bound is above its block value waits in the queue on it
    subproblem  else the configuration gets an exact stage solve by the CP-SAT stage model
                (solver_models/cpsat/model.py) over its integer tables, bounded by the best plan so far
    cuts        the configuration is then settled: forbidden in the master (no-good; by kind:
                solved, bounded by the best plan, infeasible), or, when its solve stopped
                unproven, kept out with its proven bound for the final bound.  A shape the master
                picks before its prices are computed is priced (refine) and the master solved again.
    stop        the master, told to find a configuration below the best plan, proves there is none
                (OPTIMAL over the space), or the time limit ends the loop (FEASIBLE, with the
                master's bound over every configuration not settled, valid for the whole space).

No HS-DP code runs under this backend; HS-DP (solver_models/hsdp.py, --backend hsdp) is the
independent reference CI compares it with.

First plan (planner/search/first_plan.py): while the shapes are priced and no plan exists, the first shapes
priced are laid out at once, so that a search cut short holds a plan within milliseconds.  Those plans stay
apart from the search's (they move no cut-off, bound or counter) and join them only when the search is cut
short or ends with none (`_adopt_first_plans`, checked against the search's bounds as any plan is), so a search
that runs to its end returns exactly what it returned without them.

Self-check (`_check`): every plan the search finds (seeds, roundings, exact solves) is held against the
bounds the search claims for its configuration (its shape's screen bound; its pipeline block's value
while it is unsettled there).  A plan below one proves that bound false: the result then claims neither
OPTIMAL nor a lower bound, and says so (a note, search.cpsat.self_check).

Progress (`_report`): configurations closed of the total (settled, or in shapes whose bound reaches the
best plan: the share of the bound-ordered space closed) and the greatest bound proven so far.

The prunings (planner/search/pruning.py).  `Pruning.restrict`: the search covers only the pruned
space (cp_min_seq a rule family of the master, load balance and, on flagscale, memory in the stage
tables, megatron's least recompute that fits as cuts).  Otherwise they only order the work: with no
plan yet, a configuration is first solved under the load-balance window and that plan hints its
exact solve.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable

from planner.megatron import rules
from planner.cost.model import CostModel
from planner.runtime import runtime_of
from planner.schemas.search import GlobalChoice
from planner.search.explain import explain_infeasible, time_limit_error
from planner.search.first_plan import FirstPlans
from planner.search.prices import PriceBook
from planner.search.screening import Configurations, plan_from_solution
from planner.search.seeds import SEED_SHARE, UNPROVABLE_SEED_SHARE, Seeds
from planner.search.settings import Candidate, ProgressClock, ProgressEvent, ProgressFn, SearchResult, SearchSettings, \
    status_word
from planner.search.space import SearchSpace, pipeline_in_space, stage_options
from planner.search.tables import TableBuilder
from solver_models.base import SolverSettings
from solver_models.cpsat.master import MAX_RULE_TABLE, RuleFamily, shape_bound_us
from solver_models.cpsat.model import CpSatSolution, solve_cpsat
from solver_models.cpsat.pipeline import BlockSpec, PipelineBlock
from solver_models.fitting import has_fitting_layout
from solver_models.rounding import rounded_plan
from solver_models.scaling import bound_s, from_us
from solver_models.tables import DeadlinePassed, StageTables, quantisation_us

# the prices of every shape are computed up front while this share of the time limit lasts
PRICING_SHARE = 0.4
# one stage solve gets at most this share of the time left (and at least STAGE_MIN_S)
STAGE_SHARE = 0.25
STAGE_MIN_S = 2.0
PROGRESS_EVERY_S = 0.2
# every time this many more shapes have a pipeline block (or, with no plan yet, once half the time
# limit is gone), the least configuration the blocks found is solved at once (a dive), for a better
# plan to bound the rest with
DIVE_EVERY_SHAPES = 8
SELF_CHECK_US = 1.0  # a bound (us, rounded down) may exceed a plan's time by this much before the self-check objects
MICROBATCH_SCOPE = ("mbs", "dp", "samples")  # the shape degrees the number of micro-batches reads

MEGATRON_FAMILIES = ("tp", "cp", "ep", "etp", "mbs", "dp", "pp", "vpp", "recompute")
FLAGSCALE_FAMILIES = ("tp", "cp", "ep", "etp", "samples", "pp", "recompute", "first_dp")


def rule_families(cost: CostModel, space: SearchSpace) -> list[RuleFamily]:
    """Megatron's and FlagScale's rules on the degrees (planner/megatron/rules.py), plus the space's own
    requirement that the cluster holds PP stages.  FlagScale's per-stage rules (stage micro-batch,
    folding, recompute, tied embeddings, contiguous types) are the stage subproblem's."""
    model, training, cluster = cost.model, cost.training, cost.cluster
    gbs, n_layers = training.global_batch_size, model.num_layers
    budget = cluster.gpus_by_type()
    gpn = {h: cost.domain_gpus(h) for h in budget}
    runtime = space.runtime
    common = [
        RuleFamily("heads_tp", ("tp",), lambda tp: rules.tp_allowed(model, tp)),
        RuleFamily("seq_cp", ("cp",), lambda cp: rules.cp_allowed(model, cp)),
        RuleFamily("seq_tp_sp", ("tp", "cp"), lambda tp, cp: rules.sequence_split_ok(model, tp, cp)),
        RuleFamily("experts_ep", ("ep",), lambda ep: rules.ep_allowed(model, ep)),
        RuleFamily("moe_etp_bias", ("tp", "etp"), lambda tp, etp: rules.etp_allowed(model, tp, etp)),
    ]
    flags_ok = rules.degree_flags_check(model, training)
    if runtime_of(runtime).per_stage_meshes:
        return common + [
            RuleFamily("flagscale_query_groups_tp", ("tp",), lambda tp: rules.runtime_tp_ok("flagscale", model, tp)),
            RuleFamily("flagscale_cp", ("cp",), lambda cp: rules.runtime_degrees_ok("flagscale", cp, 1)),
            RuleFamily("gbs_microbatch", ("samples",), lambda b: rules.batch_ok(gbs, b, 1)),
            RuleFamily("pipeline_in_space", ("pp",), lambda pp: pipeline_in_space(n_layers, pp, 1)),
        ] + ([] if flags_ok is None else [RuleFamily(
            "degree_flags", ("tp", "cp", "ep", "etp", "pp"), lambda tp, cp, ep, etp, pp: flags_ok(tp, cp, ep, etp, None, pp, 1))])

    overlap_p2p = training.megatron.overlap_p2p_comm
    flag_family = [] if flags_ok is None else [
        RuleFamily("degree_flags", ("tp", "cp", "ep", "etp", "dp", "pp", "vpp"), flags_ok)]

    def stages_fit(tp: int, cp: int, dp: int, pp: int) -> bool:
        s = tp * cp * dp
        return sum(n // s for h, n in budget.items() if tp <= gpn[h]) >= pp

    return common + [
        RuleFamily("expert_folding", ("tp", "cp", "dp", "ep", "etp"), rules.expert_folding_ok),
        RuleFamily("gbs_microbatch", ("mbs", "dp"), lambda mbs, dp: rules.batch_ok(gbs, mbs, dp)),
        RuleFamily("vpp_microbatches", ("mbs", "dp", "pp", "vpp"),
                   lambda mbs, dp, pp, vpp: rules.interleave_ok(gbs, mbs, dp, pp, vpp, overlap_p2p)),
        RuleFamily("pipeline_in_space", ("pp", "vpp"), lambda pp, vpp: pipeline_in_space(n_layers, pp, vpp)),
        RuleFamily("runtime_degrees", ("cp", "vpp"), lambda cp, vpp: rules.runtime_degrees_ok(runtime, cp, vpp)),
        RuleFamily("stages_fit", ("tp", "cp", "dp", "pp"), stages_fit),
    ] + flag_family


def master_domains(cost: CostModel, space: SearchSpace, book: PriceBook) -> dict[str, tuple[int, ...]]:
    """Every degree family's domain: the space's menus (DP and PP up to what the cluster holds;
    recompute as indices into the ladder, flagscale's modes)."""
    model, budget = cost.model, cost.cluster.gpus_by_type()
    experts = model.num_experts or 1
    eps = tuple(space.ep or [e for e in range(1, experts + 1) if experts % e == 0])
    out = {"tp": tuple(space.tp), "cp": tuple(space.cp), "ep": eps if model.is_moe else (1,),
           "etp": tuple(space.etp or space.tp) if model.is_moe else tuple(space.tp)}
    max_dp = max(1, max(n // (min(space.tp) * min(space.cp)) for n in budget.values()))
    top_pp = min(model.num_layers, space.max_pp or model.num_layers, sum(budget.values()))
    out["pp"] = tuple(range(1, top_pp + 1))
    out["recompute"] = tuple(range(len(book.settings)))
    if book.flagscale:
        out["samples"] = tuple(sorted({dp * m for dp in range(1, max_dp + 1) for m in space.mbs}))
        tied = rules.flagscale_tied_embeddings(model, cost.training)
        out["first_dp"] = tuple(range(1, max_dp + 1)) if tied else (0,)
    else:
        out.update(mbs=tuple(space.mbs), dp=tuple(range(1, max_dp + 1)), vpp=tuple(space.vpp))
    return out


@dataclass
class Levels:
    """What the three levels are built from: the families of each, the rules and the domains."""

    shape: tuple[str, ...]  # the degree master's families (a price key, in order)
    block: tuple[str, ...]  # the pipeline block's families
    rules: list[RuleFamily]
    domains: dict[str, tuple[int, ...]]
    microbatches: Callable[..., int | None]
    vpp: str | None
    first_dp: str | None


def levels(cost: CostModel, space: SearchSpace, book: PriceBook, settings: SearchSettings) -> Levels:
    """The levels' families, rules (with cp_min_seq when the prunings restrict the space) and domains."""
    gbs = cost.training.global_batch_size
    rule_list = list(rule_families(cost, space))
    pr = settings.pruning
    if pr.restricts and pr.cp_min_seq_tokens is not None:
        seq, least = cost.model.seq_length, pr.cp_min_seq_tokens
        rule_list.append(RuleFamily("cp_min_seq", ("cp",), lambda cp: cp == 1 or seq // cp >= least))
    domains = master_domains(cost, space, book)
    if book.flagscale:
        return Levels(("tp", "cp", "ep", "etp", "samples"), ("recompute", "pp", "first_dp"), rule_list, domains,
                      lambda b: gbs // b if gbs % b == 0 else None, None, "first_dp")
    return Levels(("tp", "cp", "ep", "etp", "mbs", "dp"), ("recompute", "pp", "vpp"), rule_list, domains,
                  lambda mbs, dp: gbs // (mbs * dp) if gbs % (mbs * dp) == 0 else None, "vpp", None)


@dataclass
class Settled:
    """A configuration the loop took out of its pipeline block: why (the cut's kind), and the
    bounds it carries when that is not its exact optimum (us; None: settled exactly)."""

    g: GlobalChoice
    kind: str  # solved | bounded | infeasible | rule | least_recompute | unresolved
    bound_us: float | None = None  # valid for the searched space
    whole_us: float | None = None  # valid for the whole space (the prunings set it aside)
    theta_us: float | None = None  # its pipeline block's relaxation value when it was picked


class BendersSearch:
    """One --backend cpsat search (module docstring).  run() returns the SearchResult."""

    def __init__(self, cost: CostModel, space: SearchSpace, settings: SearchSettings, t0: float,
                 progress: ProgressFn | None):
        self.cost, self.space, self.settings, self.t0, self.progress = cost, space, settings, t0, progress
        self.deadline = settings.deadline if settings.deadline is not None else t0 + settings.time_limit_s
        self.pruning = settings.pruning
        self.builder = TableBuilder(cost, contiguous_types=space.contiguous)
        self.book = PriceBook(cost, space, self.builder, deadline=self.deadline)
        self.configs = Configurations(cost, space, self.builder)  # the tight bounds (_tight_us)
        self.tight: dict[GlobalChoice, float] = {}  # configuration -> its tight bound (us, on the tables)
        self.lone: dict[GlobalChoice, tuple] = {}  # configurations out of their block, queued on their tight bound
        self.levels = levels(cost, space, self.book, settings)
        self.cands: list[Candidate] = []
        self._pipeline = None  # the block pipeline of the configuration being settled
        self.settled: list[Settled] = []
        self.blocks: dict[tuple, PipelineBlock] = {}
        self.queue: list = []  # (bound us, seq, shape, configuration or None): what is left, best first
        self.pipelines: dict = {}  # (shape, configuration) -> its block's pipeline (first, last, middle)
        self._next_dive = DIVE_EVERY_SHAPES
        self.proven = False
        self.timed_out = False
        self.settled_in: Counter = Counter()  # shape key -> its configurations settled
        self.unscreened_configs = 0  # configurations of the shapes the screen never priced
        self._shown_bound_us: float | None = None  # the greatest bound progress has shown (monotone)
        self._working: tuple[float, tuple, dict | None] | None = None  # (bound, shape key, degrees) being worked on
        # the self-check (_check): every plan's iteration time (us) per configuration, the bounds the search
        # claims per shape (its screen bound; its block's last value, for its unsettled configurations under
        # the settings it allows), and what contradicts them
        self.plan_us: dict[tuple, dict[GlobalChoice, float]] = {}  # shape key -> configuration -> least time
        self.screen_bound: dict[tuple, float] = {}
        self.block_value: dict[tuple, tuple[float, frozenset]] = {}
        self.settled_set: set[GlobalChoice] = set()
        self.contradictions: list[str] = []
        self.notes: list[str] = []
        self.clock = ProgressClock(PROGRESS_EVERY_S)
        self.first = FirstPlans(self)  # the plans found while the shapes are priced, apart from the search's
        self.screened = False  # whether the screen has bounded the shapes (before: no bound, nothing closed)
        self.stats: dict[str, Any] = {
            "status": "UNKNOWN", "objective_s": None, "bound_s": None, "wall_s": 0.0, "branches": 0,
            "variables": {}, "constraints": {}, "master_solves": 0, "subproblems": 0, "rows": 0, "rows_left_out": 0,
            "space": "pruned" if self.pruning.restricts else "whole", "cuts": {}, "stage_solves": 0,
            "master_wall_s": 0.0, "stage_wall_s": 0.0,
            "configs_total": self.book.configs_total(), "shapes_total": len(self.book.shapes),
            "shapes_screened": 0, "shapes_blocked": 0}
        inner = set(self.levels.block)
        self.lazy_rules = [r for r in self.levels.rules if inner & set(r.scope)
                           and math.prod(len(self.levels.domains[f]) for f in r.scope if f in inner) > MAX_RULE_TABLE]

    # ---- the loop ----
    def run(self) -> SearchResult:
        """Best-first over one queue: a shape enters with its screen bound; when it reaches the top
        its recompute settings are screened with their own prices and its pipeline block is built
        and solved, and it comes back with the block's least value and configuration; when that
        reaches the top the configuration gets its exact stage solve (a cut on the block) and the
        block is solved again.  The loop ends when the top's bound reaches the best plan (proven),
        the queue empties (proven) or the time limit passes."""
        budget = self.deadline - self.t0
        self.unscreened = 0
        priced_by = self.t0 + PRICING_SHARE * budget
        self.first.since = time.perf_counter()
        if not self.book.price_master(priced_by, lambda key: self._first_plan(key, priced_by)):
            self.timed_out = True
            self.unscreened = len(self.book.shapes) - len(self.book.master)
            self.unscreened_configs = sum(sh.size for k, sh in self.book.shapes.items() if k not in self.book.master)
            self.notes.append(f"time limit: {self.unscreened} of {len(self.book.shapes)} shapes were not priced for "
                              "the screen in time and not searched; no whole-space bound")
        self.screen_order = self._screen_shapes()
        self.screen_bound = {key: theta for theta, key in self.screen_order}
        self.queue = [(theta, k, key, None) for k, (theta, key) in enumerate(self.screen_order)]
        heapq.heapify(self.queue)
        self.screened = True
        self._seq = len(self.queue)
        self._seed()
        while self.queue:
            theta, _, key, degrees = self.queue[0]
            cutoff = self._cutoff_us()
            if cutoff is not None and theta >= cutoff:
                break
            if self._late():
                self.timed_out = True
                break
            late = not self.cands and self._left() < 0.5 * (self.deadline - self.t0)
            if degrees is None and (self.stats["shapes_blocked"] >= self._next_dive or late):
                theta, key, degrees = self._dive()
            else:
                heapq.heappop(self.queue)
            self._working = (theta, key, degrees)  # out of the queue while it is worked on: still open (_closed)
            try:
                if degrees is None:
                    self._open_shape(key, theta)
                else:
                    self._settle_config(key, theta, degrees)
            except DeadlinePassed:  # the time limit passed while tables were built or read
                self._push(theta, key, degrees)
                self.timed_out = True
                break
            finally:
                self._working = None
            self._report("searching")
        self.proven = not self.timed_out and not self.unscreened
        return self._result()

    def _first_plan(self, key: tuple, until: float) -> None:
        """A shape just priced: with no plan yet, a first plan from it (planner/search/first_plan.py), shown
        at once (the better ones its other recompute settings give at the next event)."""
        if not self.first.wanted:
            return
        self.first.shape_priced(key, until, lambda: self._report("pricing", self.first.best().g.label(), force=True))

    def _adopt_first_plans(self) -> None:
        """A search cut short, or one that found no plan: the plans found while pricing join its own (after
        them on ties), each held against the bounds the search claims (_check).  A search that proved the
        space holds no plan is contradicted by one."""
        if not self.first.plans or (self.cands and self.proven):
            return
        if self.proven:
            self.contradictions.append(f"a plan of {self.first.plans[0][0].g.label()} was found while the shapes "
                                       "were priced, but the search proved the space holds none")
        for cand, t_us in self.first.plans:
            self._note_plan(cand.g, t_us)
            self._keep(cand)

    def _seed(self) -> None:
        """Good plans before the exact search (planner/search/seeds.py), within SEED_SHARE of the time left;
        UNPROVABLE_SEED_SHARE when the screen could not price every shape (the search can then prove nothing,
        only find plans, which the seeding does faster), or while it has no plan."""
        t, left = time.perf_counter(), max(0.0, self._left())
        share = UNPROVABLE_SEED_SHARE if self.unscreened else SEED_SHARE
        priced = Seeds(self).run(t + share * left, t + UNPROVABLE_SEED_SHARE * left)
        self.stats.update(seed_configs=priced, seed_s=time.perf_counter() - t,
                          seed_best_s=self.cands[0].objective_s if self.cands else None)

    def _dive(self) -> tuple[float, tuple, dict | None]:
        """Every DIVE_EVERY_SHAPES blocks: take the least configuration the blocks have found (rather
        than the queue's top, a shape whose bound is lower) for a better plan to bound the rest with."""
        self._next_dive = self.stats["shapes_blocked"] + DIVE_EVERY_SHAPES
        found = [e for e in self.queue if e[3] is not None]
        if not found:
            theta, _, key, degrees = heapq.heappop(self.queue)
            return theta, key, degrees
        best = min(found)
        self.queue.remove(best)
        heapq.heapify(self.queue)
        return best[0], best[2], best[3]

    def _push(self, theta_us: float, key: tuple, degrees: dict | None) -> None:
        self._seq += 1
        heapq.heappush(self.queue, (theta_us, self._seq, key, degrees))

    def _open_shape(self, key: tuple, theta_us: float) -> None:
        """A shape at the top: its recompute settings below the best plan (their own prices), its
        pipeline block, and its first configuration back into the queue."""
        settings = self._settings_below(key)
        if not settings:
            self.stats["shapes_screened_out"] = self.stats.get("shapes_screened_out", 0) + 1
            return
        self._block(key, settings).allow("recompute", settings)
        self.block_value[key] = (theta_us, frozenset(settings))
        self._next_config(key, theta_us)

    def _next_config(self, key: tuple, floor_us: float) -> None:
        """Solve the shape's block below the best plan; its configuration goes into the queue with
        the block's value (nothing when no configuration of the shape can beat the best plan)."""
        block = self.blocks[key]
        res = block.solve(time_limit_s=self._left(), num_workers=1, cutoff_us=self._cutoff_us(), floor_us=floor_us)
        self._count_master(res.wall_s, res.branches)
        if res.status == "INFEASIBLE":
            return
        if res.status != "OPTIMAL":  # the time limit: the shape stays, with what is known
            self.timed_out = True
            self._push(max(floor_us, res.bound_us or 0), key, None)
            return
        self.pipelines[key, tuple(sorted(res.degrees.items()))] = (res.first, res.last, res.middle)
        self._push(max(floor_us, res.objective_us), key, res.degrees)
        self.block_value[key] = (max(floor_us, res.objective_us), self.block_value[key][1])
        for g, t_us in self.plan_us.get(key, {}).items():
            self._check(g, t_us)

    def _settle_config(self, key: tuple, theta_us: float, degrees: dict) -> None:
        """A configuration at the top: its tight bound first (`_tight_sweep`: settled when it reaches the best
        plan; back into the queue on its own, out of its block, when it is above the block's value), else its
        exact stage solve (or a cut); forbidden in its block, and the block's next configuration into the queue."""
        g = self.book.choice(dict(zip(self.levels.shape, key)), degrees)
        pipeline = self.pipelines.pop((key, tuple(sorted(degrees.items()))), None)
        lone = g in self.lone  # queued on its tight bound, already out of its block
        if not lone:
            self._tight_sweep(key, g)
            if g not in self.settled_set and self.tight[g] > theta_us + SELF_CHECK_US:
                self.blocks[key].forbid([degrees])
                self.lone[g] = key
                self.pipelines[key, tuple(sorted(degrees.items()))] = pipeline
                self._push(self.tight[g], key, degrees)
                self._next_config(key, theta_us)
                return
        if g not in self.settled_set:
            self._pipeline = pipeline
            if not (self._lazy_rule_cut(g) or self._least_recompute_cut(g, theta_us)):
                self._subproblem(g, theta_us)
        if lone:
            del self.lone[g]
            return
        self.blocks[key].forbid([degrees])
        self._next_config(key, theta_us)

    def _tight_sweep(self, key: tuple, g: GlobalChoice) -> None:
        """The tight bound (planner/search/bounds.py lower_bound_s: integral layers, memory per position, GPU
        budgets; far above the block's value on deep pipelines, whose stage solves are slow) of G and of every
        PP of its shape with its other degrees, not yet settled: those no layout fits are settled (infeasible),
        those whose bound reaches the best plan too (bounded), all out of the block in one cut."""
        cutoff = self._cutoff_us()
        out = []
        t0 = time.perf_counter()
        others = sorted({p for p, v in self.book.shapes[key].pipelines if v == g.vpp} - {g.pp})
        for pp in [g.pp] + others:  # G's first: the caller reads it
            c = replace(g, pp=pp)
            if c in self.settled_set or c in self.lone:
                continue
            bound = self._tight_us(c, cutoff)
            if c in self.plan_us.get(key, {}):  # a plan found before the bound: held against it
                self._check(c, self.plan_us[key][c])
            if math.isinf(bound) or (cutoff is not None and bound >= cutoff):
                self._settle(c, "infeasible" if math.isinf(bound) else "bounded")
                self.stats["tight_cuts"] = self.stats.get("tight_cuts", 0) + 1
                out.append(self.book.block_degrees(c))
            if self._late():
                break
        self.blocks[key].forbid(out)
        self.stats["tight_s"] = self.stats.get("tight_s", 0.0) + time.perf_counter() - t0

    def _tight_us(self, g: GlobalChoice, cutoff_us: int | None) -> float:
        """G's tight bound on its tables' iteration time (us): the float cost's less the most the tables round
        down (solver_models/tables.py quantisation_us); once it reaches `cutoff_us`, maybe only that."""
        if g not in self.tight:
            m = self.configs.num_microbatches(g)
            slack_us = quantisation_us(g.pp, m, g.vpp) / g.vpp
            beat_s = math.inf if cutoff_us is None else (cutoff_us + slack_us) * 1e-6
            self.tight[g] = self.configs.tight_bound_s(g, beat_s) * 1e6 - slack_us
        return self.tight[g]

    def _screen_shapes(self) -> list[tuple[int, tuple]]:
        """Every shape with its screen bound (us), least first; shapes none of whose layers fit
        are left out (counted as infeasible)."""
        out = []
        for key in self.book.master:
            bound = self._screen_bound_us(key)
            if bound is None:
                self.stats["shapes_infeasible"] = self.stats.get("shapes_infeasible", 0) + 1
                continue
            out.append((bound, key))
        out.sort()
        self.stats["shapes_screened"] = len(out)
        return out

    def _screen_bound_us(self, key: tuple) -> int | None:
        """A priced shape's screen bound (us); None when none of its layers fit."""
        lv, book = self.levels, self.book
        row = book.master[key]
        vpps = lv.domains[lv.vpp] if lv.vpp else (1,)
        m = lv.microbatches(*(v for f, v in zip(lv.shape, key) if f in MICROBATCH_SCOPE))
        return shape_bound_us(row, book.classes, book.groups, int(m), vpps) if m and row else None

    def _settings_below(self, key: tuple) -> list[int]:
        """The recompute settings of a shape whose screen bound, with their own prices, is below
        the best plan (all that fit when there is no plan yet)."""
        lv, book = self.levels, self.book
        vpps = lv.domains[lv.vpp] if lv.vpp else (1,)
        m = int(lv.microbatches(*(v for f, v in zip(lv.shape, key) if f in MICROBATCH_SCOPE)))
        cutoff = self._cutoff_us()
        keep = []
        for r, row in enumerate(book.block(key)):
            bound = shape_bound_us(row, book.classes, book.groups, m, vpps) if row else None
            if bound is not None and (cutoff is None or bound < cutoff):
                keep.append(r)
        return keep

    def _block(self, key: tuple, settings: list[int]) -> PipelineBlock:
        block = self.blocks.get(key)
        if block is None:
            lv, book = self.levels, self.book
            shape = dict(zip(lv.shape, key))
            spec = BlockSpec(shape=shape, families=lv.block, domains=lv.domains, rules=lv.rules, classes=book.classes,
                             groups=book.groups, microbatches=int(lv.microbatches(*(shape[f] for f in lv.shape
                                                                                    if f in MICROBATCH_SCOPE))),
                             prices=book.with_sync(key, settings), inflight=self._inflight(key),
                             sync_group=book.sync_group,
                             prefix=book.prefix, suffix=book.suffix, vpp=lv.vpp, first_dp=lv.first_dp)
            block = self.blocks[key] = PipelineBlock(spec)
            self.stats["shapes_blocked"] += 1
            st = self.stats
            st["rows"] += sum(len(row) for row in spec.prices)
            st["variables"]["degrees"] = len(spec.families)
            st["variables"]["pipeline_blocks"] = st["variables"].get("pipeline_blocks", 0) + \
                len(block.model.proto.variables)
            for name, count in block.constraints.items():
                st["constraints"][f"block {name}"] = st["constraints"].get(f"block {name}", 0) + count
        return block

    def _inflight(self, key: tuple) -> dict[tuple[int, int], tuple[float, float]]:
        """(PP, VPP) -> micro-batches in flight at the first and at the last stage (the cost model's)."""
        base = self.book.shapes[key].base
        out = {}
        for pp in self.levels.domains["pp"]:
            for v in (self.levels.domains[self.levels.vpp] if self.levels.vpp else (1,)):
                gs = replace(self.builder.shape(base), pp=pp, vpp=v)
                out[pp, v] = (self.cost.inflight_microbatches(gs, 0), self.cost.inflight_microbatches(gs, pp - 1))
        return out

    def _count_master(self, wall_s: float, branches: int) -> None:
        self.stats["master_solves"] += 1
        self.stats["master_wall_s"] += wall_s
        self.stats["branches"] += branches

    def _left(self) -> float:
        return self.deadline - time.perf_counter()

    def _late(self) -> bool:
        return self._left() < 0.05

    def _settle(self, g: GlobalChoice, kind: str, bound_us: float | None = None, whole_us: float | None = None,
                theta_us: float | None = None) -> None:
        self.settled.append(Settled(g, kind, bound_us, whole_us, theta_us))
        self.settled_in[self.book.key(g)] += 1
        self.settled_set.add(g)
        cuts = self.stats["cuts"]
        cuts[kind] = cuts.get(kind, 0) + 1

    def _cutoff_us(self) -> int | None:
        """Configurations whose iteration time (us) reaches this cannot beat the k-th best plan."""
        k = self.settings.top_k
        if len(self.cands) < k:
            return None
        c = self.cands[k - 1]
        v_us = round(c.objective_s * c.g.vpp * 1e6)
        return -(-v_us // c.g.vpp)

    # ---- cuts that need no stage solve ----
    def _lazy_rule_cut(self, g: GlobalChoice) -> bool:
        """A rule family too large for a table, checked on the block's answer."""
        d = {**dict(zip(self.levels.shape, self.book.key(g))), **self.book.block_degrees(g)}
        for rule in self.lazy_rules:
            if not rule.allowed(*(d[f] for f in rule.scope)):
                self._settle(g, "rule")
                return True
        return False

    def _least_recompute_cut(self, g: GlobalChoice, theta_us: int) -> bool:
        """Memory pruning restricting the space (megatron): G's recompute setting is in the pruned
        space only when no lesser one has a layout that fits."""
        if not (self.pruning.restricts and self.pruning.memory) or g.per_stage_recompute:
            return False
        r = self.book.settings.index(g.recompute)
        for lesser in self.book.settings[:r]:
            h = GlobalChoice(g.runtime, g.tp, g.cp, g.ep, g.etp, g.mbs, g.pp, g.vpp, g.dp0, lesser)
            try:
                fits = has_fitting_layout(self._tables(h, exact=True))
            except DeadlinePassed:
                return False
            if fits:
                self._settle(g, "least_recompute", None, theta_us)
                return True
        return False

    # ---- the subproblem: one configuration's exact stage solve ----
    def _tables(self, g: GlobalChoice, exact: bool) -> StageTables:
        c = self.cost
        options = stage_options(g, c.model, c.training, c.cluster, self.space, self.book.gpn)
        t = self.builder.build(g, options, deadline=self.deadline)
        if exact:
            return t.pruned(delta=None, memory=False)
        return t.pruned(delta=self.pruning.delta, memory=self.pruning.memory and g.per_stage_recompute)

    def _subproblem(self, g: GlobalChoice, theta_us: int) -> None:
        """Solve G's stage problem below the best plan and settle G (module docstring)."""
        restricted = self.pruning.restricts
        whole = theta_us if restricted else None  # a pruned solve bounds only the pruned space
        try:
            tables = self._tables(g, exact=not restricted)
            hint = self._rounded_plan(g, tables)
            if hint is None and not restricted and not self.cands and self.pruning.delta is not None:
                hint = self._window_plan(g, tables)
        except DeadlinePassed:
            self.timed_out = True
            self._settle(g, "unresolved", theta_us, theta_us)
            return
        ub = None if self._cutoff_us() is None else self._stage_upper_bound(g)
        self._report("stage", g.label())
        sol = self._stage_solve(tables, ub, hint)
        if sol is None:
            self._settle(g, "infeasible" if ub is None else "bounded", None, whole, theta_us)
            return
        if sol.stages:
            self._offer(g, tables, sol)
        if sol.stages and sol.status == "OPTIMAL":
            self._settle(g, "solved", None, whole, theta_us)
        else:  # the time ran out before the proof
            bound = max(theta_us, sol.bound_us // g.vpp, self.tight.get(g, 0.0))
            self._settle(g, "unresolved", bound, theta_us if restricted else bound)

    def _stage_upper_bound(self, g: GlobalChoice) -> int:
        """Plans of G better than the k-th best have v x T (us) below this."""
        c = self.cands[self.settings.top_k - 1]
        v_us = round(c.objective_s * c.g.vpp * 1e6)
        return -(-v_us * g.vpp // c.g.vpp)

    def _stage_solve(self, tables: StageTables, ub: int | None, hint: list | None, limit_s: float | None = None):
        """One exact stage solve, within `limit_s` (default: STAGE_SHARE of the time left, at least STAGE_MIN_S)."""
        left = self._left()
        limit = min(left, max(STAGE_MIN_S, STAGE_SHARE * left) if limit_s is None else limit_s)
        sub: dict = {}
        sol = solve_cpsat(tables, upper_bound_us=ub, hint_stages=hint, stats=sub,
                          settings=SolverSettings(time_limit_s=limit, num_workers=self.settings.num_workers,
                                                  deadline=self.deadline))
        st = self.stats
        st["subproblems"] += 1
        st["stage_solves"] += 1
        st["stage_wall_s"] += float(sub.get("wall_s", 0.0) or 0.0)
        st["branches"] += int(sub.get("branches", 0) or 0)
        for part in ("variables", "constraints"):
            for name, count in (sub.get(part) or {}).items():
                st[part][name] = st[part].get(name, 0) + count
        return sol

    def _rounded_plan(self, g: GlobalChoice, tables: StageTables) -> list | None:
        """The block's pipeline rounded to a plan (solver_models/rounding.py): kept when it is one,
        and the hint of the exact solve."""
        if self._pipeline is None:
            return None
        first, last, middle = self._pipeline
        of_class: dict[int, list[int]] = {}
        for o, opt in enumerate(tables.options):
            name = opt.device_type if not self.book.flagscale else f"{opt.device_type} dp{opt.dp}"
            of_class.setdefault(self.book.class_of[name], []).append(o)
        order = [first] + sorted(middle or {}, key=lambda c: (c != first, c == last, c))
        classes = [first] + [c for c in order[1:] for _ in range((middle or {}).get(c, 0))]
        classes += [] if last is None else [last]
        plan = rounded_plan(tables, [of_class.get(c, []) for c in classes])
        self.stats["rounded_plans"] = self.stats.get("rounded_plans", 0) + (plan is not None)
        if plan is None:
            return None
        objective = tables.plan_objective_us(plan)
        self._offer(g, tables, CpSatSolution(objective, 0, plan, "FEASIBLE", exact=False))
        return plan

    def _window_plan(self, g: GlobalChoice, tables: StageTables) -> list | None:
        """With no plan yet: the configuration under the load-balance window first (a smaller
        problem); its plan is kept (a plan of the whole space) and hints the exact solve (the
        pruning orders the work, it cuts nothing)."""
        windowed = tables.pruned(delta=self.pruning.delta, memory=False)
        sol = self._stage_solve(windowed, None, None)
        self.stats["window_solves"] = self.stats.get("window_solves", 0) + 1
        if sol is None or not sol.stages:
            return None
        self._offer(g, tables, replace(sol, status="FEASIBLE"))
        return sol.stages

    def _offer(self, g: GlobalChoice, tables: StageTables, sol) -> None:
        """Keep a plan of G among the best (one per configuration, the better), and check it against the
        bounds the search claims for G (_check)."""
        obj = from_us(sol.objective_us) / g.vpp
        self._note_plan(g, sol.objective_us / g.vpp)
        if any(c.g == g and c.objective_s <= obj for c in self.cands):
            return
        plan = plan_from_solution(g, tables, sol.stages, self.cost.training.global_batch_size)
        self._keep(Candidate(g=g, objective_s=obj, plan=plan, backend="cpsat", status=sol.status,
                             bound_s=bound_s(sol.bound_us, g.vpp), options=list(tables.options), stages=sol.stages))

    def _note_plan(self, g: GlobalChoice, t_us: float) -> None:
        """A plan of G taking t_us on its tables: the least per configuration, held against its bounds (_check)."""
        known = self.plan_us.setdefault(self.book.key(g), {})
        if t_us < known.get(g, math.inf):
            known[g] = t_us
            self._check(g, t_us)

    def _keep(self, cand: Candidate) -> None:
        """One plan per configuration among the best (the better; the one kept first on ties)."""
        if any(c.g == cand.g and c.objective_s <= cand.objective_s for c in self.cands):
            return
        self.cands = [c for c in self.cands if c.g != cand.g]
        self.cands.append(cand)
        self.cands.sort(key=lambda c: c.objective_s)
        del self.cands[self.settings.top_k * 4:]

    def _check(self, g: GlobalChoice, t_us: float) -> None:
        """The self-check: a plan of G (iteration time t_us on the tables) below a bound the search claims
        for G -- its shape's screen bound, or its block's value while G is unsettled there -- proves that
        bound false; so would it the certificate resting on it (_result withdraws both)."""
        key = self.book.key(g)
        claims = [("the shape screen", self.screen_bound.get(key)), ("its tight bound", self.tight.get(g))]
        value, allowed = self.block_value.get(key, (None, frozenset()))
        if g not in self.settled_set and g not in self.lone and self.book.block_degrees(g)["recompute"] in allowed:
            claims.append(("its pipeline block", value))
        for what, bound_us in claims:
            if bound_us is not None and t_us < bound_us - SELF_CHECK_US:
                self.contradictions.append(
                    f"a plan of {g.label()} takes {t_us * 1e-6:.6f} s, below the {bound_us * 1e-6:.6f} s "
                    f"{what} claims for it")

    def _report(self, phase: str, config: str = "", force: bool = False) -> None:
        """A progress event: configurations closed (`_closed`) of the total, and the greatest bound shown so
        far (every bound the search proves holds for good, so the event's never decreases)."""
        if not self.progress or not self.clock.due(force):
            return
        now = time.perf_counter()
        total = self.stats["configs_total"]
        # the best plan so far: the search's, or one found while pricing (the search's on a tie)
        top = min(self.cands[:1] + [c for c, _ in self.first.plans], key=lambda c: c.objective_s, default=None)
        best = top.objective_s if top else None
        best_plan = top.plan if top else None
        known = self.screened and not (self.unscreened or self.contradictions)
        bound = self._open_bound_us() if known else None
        if best is not None and known:
            bound = best * 1e6 if bound is None else min(bound, best * 1e6)
        if bound is not None:
            bound = self._shown_bound_us = max(bound, self._shown_bound_us or bound)
        done = total if phase == "done" and self.proven else self._closed() if self.screened else 0
        self.progress(ProgressEvent(done=done, total=total,
                                    solved=self.stats["stage_solves"], elapsed_s=now - self.t0, best_s=best,
                                    bound_s=None if bound is None else bound * 1e-6, phase=phase, config=config,
                                    best_plan=best_plan))

    def _closed(self) -> int:
        """Configurations the search is done with: settled one by one, or in shapes it left (infeasible,
        screened out, their block empty below the best plan) or whose bound reaches the best plan -- the
        share of the bound-ordered space closed.  Open: the shapes in the queue below the best plan (less
        what they settled), the configurations whose stage solve stopped unproven below it, the shapes
        the screen never priced."""
        cutoff = self._cutoff_us()
        entries = [(theta, key, d) for theta, _, key, d in self.queue] + ([self._working] if self._working else [])
        below = [(key, d) for theta, key, d in entries if cutoff is None or theta < cutoff]
        is_lone = [d is not None and self.book.choice(dict(zip(self.levels.shape, key)), d) in self.lone
                   for key, d in below]
        shapes = {key for (key, _), alone in zip(below, is_lone) if not alone}  # its block has configurations left
        open_ = sum(self.book.shapes[key].size - self.settled_in[key] for key in shapes)
        open_ += sum(1 for (key, _), alone in zip(below, is_lone) if alone and key not in shapes)  # itself only
        open_ += sum(1 for st in self.settled if st.bound_us is not None and (cutoff is None or st.bound_us < cutoff))
        return max(0, self.stats["configs_total"] - open_ - self.unscreened_configs)

    # ---- what was proven ----
    def _open_bound_us(self) -> float | None:
        """The least bound over what is not settled: the queue's top (every entry's bound holds for
        what it stands for), configurations whose stage solve stopped unproven."""
        parts = [s.bound_us for s in self.settled if s.bound_us is not None]
        if self.queue:
            parts.append(self.queue[0][0])
        return min(parts, default=None)

    def _bounds_us(self) -> tuple[float | None, float | None]:
        """(bound valid for the searched space, bound valid for the whole space), us; None: not known."""
        cap = self.cands[0].objective_s * 1e6
        if self.unscreened:
            return None, None  # the screen never bounded the shapes not priced
        open_us = self._open_bound_us()
        searched = cap if open_us is None else min(cap, open_us)
        if not self.pruning.restricts:
            return searched, searched
        if self.pruning.cp_min_seq_tokens is not None and self._cp_pruned_configs():
            return searched, None  # the degree master never saw the shapes cp_min_seq set aside
        return searched, min([searched] + [s.whole_us for s in self.settled if s.whole_us is not None])

    def _cp_pruned_configs(self) -> int:
        if not (self.pruning.restricts and self.pruning.cp_min_seq_tokens is not None):
            return 0
        return sum(s.size for s in self.book.shapes.values() if self.pruning.cp_pruned(self.cost.model, s.base))

    def _result(self) -> SearchResult:
        self._adopt_first_plans()
        self._report("done", force=True)
        if not self.cands:
            if self.timed_out:
                raise time_limit_error(self.cost, self.space, f"the {self.settings.time_limit_s:g} s time limit "
                                       f"({self.stats['stage_solves']} stage solves, {self.stats['master_solves']} "
                                       "pipeline-block solves)")
            raise explain_infeasible(self.cost, self.space, len(self.book.shapes))
        best = self.cands[: self.settings.top_k]
        costs = [self.cost.evaluate(c.plan) for c in best]
        searched_us, whole_us = self._bounds_us() if not self.contradictions else (None, None)
        self.stats["self_check"] = {"configs_checked": sum(len(p) for p in self.plan_us.values()),
                                    "contradictions": self.contradictions[:10]}
        if self.contradictions:
            self.notes.append(f"self-check: {self.contradictions[0]}" + (
                f" (and {len(self.contradictions) - 1} more)" if len(self.contradictions) > 1 else "") +
                "; a bound the search relies on is false, so it claims no optimality and no lower bound (a bug of "
                "the planner: please report it)")
        cap = best[0].objective_s
        proven = self.proven and (searched_us is not None and searched_us >= cap * 1e6 - 1e-6)
        solved = self.stats["stage_solves"] - self.stats.get("window_solves", 0)
        infeasible = sum(1 for s in self.settled if s.kind == "infeasible")
        memory = sum(1 for s in self.settled if s.kind == "least_recompute")
        cp = self._cp_pruned_configs()
        total = self.stats["configs_total"]
        open_ = 0 if proven else max(0, total - self._closed())  # left open by the time limit, not bounded out
        self._finish_stats(best[0], searched_us, proven)
        if self.timed_out and not proven:
            self.notes.append(f"time limit {self.settings.time_limit_s:g} s reached after {solved} stage solve(s) "
                              f"and {self.stats['master_solves']} pipeline-block solve(s)")
        return SearchResult(
            best=best, costs=costs, configs_total=total, configs_solved=solved,
            configs_bounded=max(0, total - open_ - solved - infeasible - memory - cp), configs_infeasible=infeasible,
            configs_unsearched=open_,
            configs_pruned_memory=memory, lower_bound_s=None if whole_us is None else min(cap, whole_us * 1e-6),
            certified_optimal=proven and not self.pruning.restricts, search_time_s=time.perf_counter() - self.t0,
            backend="cpsat", notes=self.notes, pruning=self.pruning, pruned_space_optimal=proven,
            pruned_lower_bound_s=None if searched_us is None else min(cap, searched_us * 1e-6), configs_pruned_cp=cp,
            timed_out=self.timed_out and not proven,
            quantisation_s=max(0.0, costs[0].iteration_time_s - best[0].objective_s), cpsat=self.stats,
            runners_up=self.cands[self.settings.top_k:])

    def _finish_stats(self, best: Candidate, searched_us: float | None, proven: bool) -> None:
        st = self.stats
        individually = len({s.g for s in self.settled})
        st.update(status=status_word(proven), objective_s=best.objective_s,
                  bound_s=None if searched_us is None else min(best.objective_s, searched_us * 1e-6),
                  winner_stage_status=best.status, pricing_s=self.book.pricing_s,
                  wall_s=st["master_wall_s"] + st["stage_wall_s"],
                  configs_priced_one_by_one=individually,
                  configs_never_priced_one_by_one=st["configs_total"] - individually)


def search_cpsat(cost: CostModel, space: SearchSpace, settings: SearchSettings, t0: float,
                 progress: ProgressFn | None = None) -> SearchResult:
    """The --backend cpsat search (module docstring)."""
    return BendersSearch(cost, space, settings, t0, progress).run()
